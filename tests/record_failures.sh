#!/usr/bin/env bash
# record_failures LABEL CMD...: runs CMD with its output shown as usual and, when it
# fails and $MT_FAILURES names a file, appends to that file the tests pytest or ctest
# named as failing (or the one that hung), so that the end of `make test`, which is
# all a CI log may keep, says which test failed.
# Executed, it runs its arguments; sourced, it defines the function (for shell
# functions as CMD).
record_failures() {
  local label=$1 log rc
  shift
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ] && [ -n "${MT_FAILURES:-}" ]; then
    {
      echo "--- $label (exit $rc):"
      sed 's/\x1b\[[0-9;]*m//g' "$log" \
        | grep -E '^(FAILED|ERROR) |::[^ ]+ (FAILED|ERROR)|^=== .*(killed|FAILED)|Timeout|[0-9]+ - .*\((Failed|Timeout)\)' \
        | sort -u | head -20
      if grep -q 'was killed' "$log"; then
        echo "last test started: $(grep -E '::' "$log" | tail -1)"
      fi
    } >> "$MT_FAILURES"
  fi
  rm -f "$log"
  return "$rc"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  record_failures "$@"
fi
