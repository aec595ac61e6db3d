#!/usr/bin/env bash
# The array API standard's suite (data-apis/array-api-tests) against mpitensor.array_api:
#   tests/array_api/run.sh NP MAX_EXAMPLES [pytest args]
# at NP ranks under mpiexec (every rank draws the same examples: --derandomize, no
# example database), each test drawing MAX_EXAMPLES examples, against the standard's
# version ARRAY_API_TESTS_VERSION (2024.12, the namespace's own, unless set; 2025.12
# is the newest). The failures are listed, each with its reason, in xfails.txt
# beside this script, and those of one version in xfails-VERSION.txt;
# ARRAY_API_TESTS_XFAIL_MARK=skip (the default here) skips them rather than running
# them to fail. ARRAY_API_TESTS_MODULE=numpy runs NumPy's namespace the same way
# (without the xfails), for the comparison. The suite is found at $ARRAY_API_TESTS
# (default ../shared/array-api-tests beside the repository).
set -u
np=${1:?usage: run.sh NP MAX_EXAMPLES [pytest args]}
examples=${2:?usage: run.sh NP MAX_EXAMPLES [pytest args]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
suite=${ARRAY_API_TESTS:-$repo/../shared/array-api-tests}
if [ ! -d "$suite/array_api_tests" ]; then
  echo "array-api-tests: no suite at $suite (set ARRAY_API_TESTS)"; exit 1
fi
module=${ARRAY_API_TESTS_MODULE:-mpitensor.array_api}
version=${ARRAY_API_TESTS_VERSION:-2024.12}
xfails=()
if [ "$module" = mpitensor.array_api ]; then
  # The suite takes one list: every version's, then this version's.
  list=$(mktemp "${TMPDIR:-/tmp}/mpitensor-array-api-xfails.XXXXXX") || exit 1
  trap 'rm -f "$list"' EXIT
  cat "$here/xfails.txt" > "$list"
  [ -f "$here/xfails-$version.txt" ] && cat "$here/xfails-$version.txt" >> "$list"
  xfails=(--xfails-file "$list")
fi
export ARRAY_API_TESTS_MODULE=$module ARRAY_API_TESTS_VERSION=$version
export ARRAY_API_TESTS_XFAIL_MARK=${ARRAY_API_TESTS_XFAIL_MARK:-skip}
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
cd "$suite" && MT_RUN_LABEL="array-api-tests ($module $version, $examples examples)" \
  "$repo/tests/run_mpi_pytest.sh" "$np" array_api_tests/ -p hypothesis_profile \
  --max-examples "$examples" --derandomize --disable-deadline -W ignore \
  "${xfails[@]}" "$@"
