#!/usr/bin/env bash
# The multi-host checks (`make test-multinode`), on hosts simulated on this machine.
#
# Four hosts, each in its own network, PID, UTS (hostname), mount (its own /dev/shm)
# and IPC namespace with a small PID 1 that reaps orphans (pid1.py), joined by veth
# pairs to a bridge in a "head" network namespace. mpiexec runs in the head: it
# stays in the root PID namespace (no process can enter a sibling PID namespace),
# reads a hostfile that names only the hosts, and starts Open MPI's daemon on each
# host through an rsh agent that enters the host with nsenter, with a fresh
# environment as ssh would give. Ranks on one host share memory (vader); between
# hosts they talk TCP over the bridge's subnet. The hosts share the file system, as
# a cluster's nodes share theirs.
#
#   tests/multinode/run.sh                 # all of the below, as `make test-multinode`
#   tests/multinode/run.sh pytest [ARGS]   # pytest at np 4, 2 hosts x 2 ranks (all: the transport tests)
#   tests/multinode/run.sh nodes           # test_node_layout.py on the other layouts
#   tests/multinode/run.sh examples        # examples/*.py on 2 hosts x 2 ranks
#   tests/multinode/run.sh resume          # train_gpt.py saved on 2x2, resumed on 1x4, 4x1
#   tests/multinode/run.sh exec LAYOUT CMD...  # CMD with $MPIEXEC, that layout's mpiexec
#   tests/multinode/run.sh bench [ARGS]    # make bench-multinode: calibrate both link
#                                          # classes, then plan_ranking.py ARGS on 2x2
#
# Layouts (hosts x ranks): 2x2, 1x4, 4x1, 3+1 (unequal hosts), 2x2rr (ranks dealt
# round-robin over the hosts, --map-by node).
#
# Needs root, util-linux (unshare, nsenter, setpriv) and iproute2 (ip), which it
# installs from Debian when missing; without root or namespaces it says so and
# exits 77. Addresses go only on the interfaces it creates in its own namespaces;
# every namespace, interface and process it made goes when it ends, fails or is
# interrupted, and the hosts die with it even when it is killed (PDEATHSIG).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
subnet=10.77.0
nhosts=4
# It runs as root only, and one BLAS thread per rank (2 ranks share each core).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

# Exit 77 (automake's "skipped"): `make test-multinode` then runs the transport tests
# over TCP on this one host instead.
skip() {
  echo "test-multinode: SKIPPED: $*"
  exit 77
}

preflight() {
  [ "$(id -u)" = 0 ] || skip "making network and PID namespaces needs root"
  local missing=
  for t in ip:iproute2 nsenter:util-linux unshare:util-linux setpriv:util-linux; do
    command -v "${t%%:*}" >/dev/null || missing="$missing ${t#*:}"
  done
  if [ -n "$missing" ]; then
    command -v apt-get >/dev/null || skip "missing$missing, and no apt-get to install them"
    echo "Installing from Debian:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing \
      || skip "could not install$missing"
  fi
  unshare --net --pid --uts --mount --ipc --fork true 2>/dev/null \
    || skip "this machine does not let root make namespaces (a container without CAP_SYS_ADMIN?)"
}

# -- the cluster -------------------------------------------------------------------

run=
inner=()  # the processes that hold the namespaces: the hosts' PID 1s, the head's
outer=()  # their unshare parents, children of this script
job=      # the process group of the command running now
cleanup() {
  trap - EXIT INT TERM
  [ -n "$job" ] && pkill -KILL -s "$job"
  # A host's PID 1 takes every process of its host with it; the head's holder its
  # network namespace, bridge and veth ends. Asked first (pid1.py exits on SIGTERM),
  # killed if they linger; their unshare parents reap them and end.
  local p n
  for p in "${inner[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for n in $(seq 40); do any_alive "${inner[@]}" || break; sleep 0.05; done
  for p in "${inner[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${outer[@]}"; do wait "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "$run" ] && rm -rf "$run"
}

any_alive() {
  local p
  for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}

# The child of process $1, once it has one (unshare --fork's child); waits up to
# 30 s, which a loaded machine may need.
child_of() {
  local i c
  for i in $(seq 600); do
    c=$(pgrep -P "$1")
    [ -n "$c" ] && { echo "${c%%$'\n'*}"; return 0; }
    sleep 0.05
  done
  return 1
}

in_head() { nsenter --net="/proc/$head/ns/net" -- "$@"; }

start_head() {
  setpriv --pdeathsig KILL unshare --net --fork setpriv --pdeathsig KILL \
    python3 "$here/tests/multinode/pid1.py" "$run/ready0" &
  outer+=($!)
  head=$(child_of $!) || { echo "the head namespace did not start"; return 1; }
  inner+=("$head")
  in_head ip link set lo up &&
    in_head ip link add mtbr0 type bridge &&
    in_head ip addr add "$subnet.1/24" dev mtbr0 &&
    in_head ip link set mtbr0 up
}

# What a host's PID 1 runs first: its name, its own /dev/shm, its loopback.
host_init='hostname "$1" && mount -t tmpfs -o mode=1777 shm /dev/shm && ip link set lo up &&
  exec python3 "$2" "$3"'

start_host() {
  local i=$1 name=mt-node$1 ready=$run/ready$1 pid1 n
  setpriv --pdeathsig KILL unshare --net --pid --uts --mount --ipc --fork --mount-proc \
    setpriv --pdeathsig KILL sh -c "$host_init" sh "$name" "$here/tests/multinode/pid1.py" \
    "$ready" &
  outer+=($!)
  pid1=$(child_of $!) || { echo "$name did not start"; return 1; }
  inner+=("$pid1")
  for n in $(seq 600); do [ -e "$ready" ] && break; sleep 0.05; done
  [ -e "$ready" ] || { echo "$name did not come up"; return 1; }
  in_head ip link add "mtv$i" type veth peer name eth0 netns "$pid1" &&
    in_head ip link set "mtv$i" master mtbr0 up &&
    nsenter -t "$pid1" --net ip addr add "$subnet.$((10 + i))/24" dev eth0 &&
    nsenter -t "$pid1" --net ip link set eth0 up || return 1
  echo "$subnet.$((10 + i)) $pid1 $name" >> "$run/hosts"
}

# Open MPI's rsh agent: `rsh [OPTIONS] HOST COMMAND...` runs COMMAND in HOST's
# namespaces, in a login-like environment (what is not forwarded with -x is unset).
write_rsh() {
  cat > "$run/rsh" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1; shift
pid=\$(awk -v h="\$host" '\$1 == h || \$3 == h { print \$2 }' "$run/hosts")
[ -n "\$pid" ] || { echo "rsh: no simulated host \$host" >&2; exit 255; }
exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
  HOME="$HOME" LANG=C.UTF-8 nsenter -t "\$pid" --net --pid --uts --mount --ipc -- /bin/sh -c "\$*"
EOF
  chmod +x "$run/rsh"
}

# $run/mpiexec-LAYOUT: mpiexec on the hosts of LAYOUT, forwarding the variables the
# tests and mpitensor read.
write_launcher() {
  local layout=$1 extra= i slots=()
  case $layout in
    2x2) slots=(2 2) ;;
    1x4) slots=(4) ;;
    4x1) slots=(1 1 1 1) ;;
    3+1) slots=(3 1) ;;
    2x2rr)
      # Ranks dealt round-robin: a rankfile, since --map-by node maps each app
      # context of an MPMD command line (run_mpi_pytest.sh's) on its own.
      slots=(2 2) extra="--rankfile $run/rankfile-rr"
      printf 'rank %s=%s slot=%s\n' 0 "$subnet.11" 0 1 "$subnet.12" 0 2 "$subnet.11" 1 \
        3 "$subnet.12" 1 > "$run/rankfile-rr" ;;
    *) echo "unknown layout $layout"; return 1 ;;
  esac
  : > "$run/hostfile-$layout"
  for i in "${!slots[@]}"; do
    echo "$subnet.$((11 + i)) slots=${slots[$i]}" >> "$run/hostfile-$layout"
  done
  cat > "$run/mpiexec-$layout" <<EOF
#!/usr/bin/env bash
# mpiexec on the simulated hosts, $layout
xs=()
for v in \$(compgen -e); do
  case \$v in
    PATH|LANG|LC_*|TMPDIR|PYTHON*|VIRTUAL_ENV|OMPI_ALLOW_RUN_AS_ROOT*|OMPI_MCA_rmaps_base_oversubscribe|*_NUM_THREADS|MPITENSOR_*|MT_*) xs+=(-x "\$v") ;;
  esac
done
# -x holds for the app context it is given in: repeat it after each ':' (MPMD).
args=()
for a in "\$@"; do
  if [ "\$a" = : ]; then args+=(: "\${xs[@]}"); else args+=("\$a"); fi
done
exec nsenter --net=/proc/$head/ns/net -- mpiexec --hostfile "$run/hostfile-$layout" $extra \\
  --mca plm_rsh_agent "$run/rsh" --mca plm_rsh_no_tree_spawn 1 \\
  --mca btl tcp,vader,self --mca btl_tcp_if_include $subnet.0/24 \\
  --mca oob_tcp_if_include $subnet.0/24 --mca mpi_yield_when_idle 1 \\
  --mca orte_tmpdir_base "$run/tmp" "\${xs[@]}" "\${args[@]}"
EOF
  chmod +x "$run/mpiexec-$layout"
}

start_cluster() {
  # A run killed with SIGKILL could not remove its directory; its script is gone.
  local d
  for d in /tmp/mt-multinode.*; do
    [ -f "$d/pid" ] && ! kill -0 "$(cat "$d/pid")" 2>/dev/null && rm -rf "$d"
  done
  run=$(mktemp -d /tmp/mt-multinode.XXXXXX) && mkdir -p "$run/tmp" && : > "$run/hosts" &&
    echo $$ > "$run/pid" || return 1
  start_head || return 1
  local i
  for i in $(seq "$nhosts"); do start_host "$i" || return 1; done
  write_rsh
  for layout in 2x2 1x4 4x1 3+1 2x2rr; do write_launcher "$layout" || return 1; done
}

# Runs "$@" in a session of its own and waits for it, so that a signal reaches the
# trap at once (bash runs traps only between commands) and the trap can end the
# whole session (`timeout` moves its command to a process group of its own, but not
# out of the session). When the command ends while processes of its session still
# run (it was killed from outside), they are ended too and the job fails, saying so.
run_job() {
  setsid "$@" &
  job=$!
  wait "$job"
  local rc=$?
  if pgrep -s "$job" > /dev/null; then
    echo "=== $1 ended (status $rc) while processes it started still ran: killed from" \
      "outside? They are ended now."
    pkill -KILL -s "$job"
    [ $rc = 0 ] && rc=1
  fi
  job=
  return $rc
}

# -- the checks --------------------------------------------------------------------

# Notes a failure for the end of `make test` ($MT_FAILURES), as record_failures.sh
# does for pytest's.
note_failure() {
  [ -n "${MT_FAILURES:-}" ] && echo "--- test-multinode: $*" >> "$MT_FAILURES"
  return 0
}

part_pytest() {
  MT_MPIEXEC=$run/mpiexec-2x2 MT_RUN_LABEL="2 hosts x 2 ranks" \
    MT_RUN_TIMEOUT=${MT_RUN_TIMEOUT:-2400} run_job "$here/tests/run_mpi_pytest.sh" 4 "$@"
}

# The node layouts other than 2x2 (which the transport tests ran on): what the mesh
# learns, and the errors of layouts a (nodes, local) mesh cannot use.
part_nodes() {
  local layout status=0
  for layout in 1x4 4x1 3+1 2x2rr; do
    MT_MPIEXEC=$run/mpiexec-$layout MT_RUN_LABEL="layout $layout" \
      run_job "$here/tests/run_mpi_pytest.sh" 4 "$here/tests/python/test_node_layout.py" \
      || status=1
  done
  return $status
}

part_examples() {
  local f args status=0
  for f in "$here"/examples/*.py; do
    case $f in *train_gpt.py) args=(--steps 4) ;; *) args=() ;; esac
    echo "=== $(basename "$f") ${args[*]} (2 hosts x 2 ranks)"
    run_job timeout -k 10 300 "$run/mpiexec-2x2" -n 4 "$py" -m mpi4py "$f" "${args[@]}" \
      > /dev/null || {
      echo "=== $(basename "$f"): FAILED"
      note_failure "examples/$(basename "$f") FAILED on 2 hosts x 2 ranks"
      status=1
    }
  done
  [ $status = 0 ] && echo "examples: all ran across 2 hosts"
  return $status
}

# train_gpt.py saves after step 3 on 2 hosts x 2 ranks, (dp, tp) = (2, 2), and goes on
# to step 6; the same checkpoint resumed on 1 host x 4 ranks with tp = 4 and on 4
# hosts x 1 rank with (2, 2) gives the same losses for steps 4 to 6.
part_resume() {
  local ckpt=$run/gpt-ckpt drive=$here/tests/multinode/train_losses.py
  local common=(--dtype float64 --steps 6 --dim 48 --heads 4 --seq 32 --batch 8)
  echo "=== train_gpt.py: save on 2x2, resume on 1x4 and 4x1"
  run_job timeout -k 10 300 "$run/mpiexec-2x2" -n 4 "$py" -m mpi4py "$drive" "$run/saved.json" \
    "${common[@]}" --mesh 2x2 --save-at 3 --ckpt "$ckpt" > /dev/null &&
    run_job timeout -k 10 300 "$run/mpiexec-1x4" -n 4 "$py" -m mpi4py "$drive" "$run/on1x4.json" \
      "${common[@]}" --mesh 4 --resume "$ckpt" > /dev/null &&
    run_job timeout -k 10 300 "$run/mpiexec-4x1" -n 4 "$py" -m mpi4py "$drive" "$run/on4x1.json" \
      "${common[@]}" --mesh 2x2 --resume "$ckpt" > /dev/null &&
    "$py" "$drive" --compare "$run/saved.json" "$run/on1x4.json" "$run/on4x1.json" \
    || {
      echo "=== train_gpt.py resume across host layouts: FAILED"
      note_failure "train_gpt.py saved on 2x2 and resumed on 1x4 and 4x1 FAILED"
      return 1
    }
}

# -- the benchmark across hosts (make bench-multinode) --------------------------------

# Every host's interface sends at most $MT_NET_RATE (default 10gbit), as a node's
# network card would: tc's token bucket on the veth end inside the host. netem,
# which would also add $MT_NET_DELAY, is used where the kernel has it; where it has
# not, the delay is what TCP over the veth pairs takes, and the run says so.
limit_links() {
  local rate=${MT_NET_RATE:-10gbit} delay=${MT_NET_DELAY:-20us} pid how
  for pid in $(cut -d' ' -f2 "$run/hosts"); do
    if nsenter -t "$pid" --net tc qdisc replace dev eth0 root netem rate "$rate" \
        delay "$delay" 2>/dev/null; then
      how="netem: $rate, $delay one way"
    else
      nsenter -t "$pid" --net tc qdisc replace dev eth0 root tbf rate "$rate" \
        burst 1mb latency 50ms || { echo "bench: tc cannot limit the hosts' links"; return 1; }
      how="tbf: $rate (no netem in this kernel: no delay added)"
    fi
  done
  link_note="2 simulated hosts, TCP over veth, each host's link $how"
  echo "=== the links between hosts: $how"
}

# Fits the time model's two link classes here, shared memory with 2 ranks on one
# host and the network with one rank on each of two, into $run/time_model.json;
# then times every candidate plan of every 1-D and (2, 2) move on 2 hosts x 2 ranks
# under that model (plan_ranking.py --link hosts "$@"), its JSON into
# benchmarks/results/CPU/plan_ranking_hosts-np4.json.
part_bench() {
  local table=$run/time_model.json
  limit_links || return 1
  echo "=== calibrate: shared memory, 2 ranks on one host"
  MPITENSOR_TIME_MODEL=$table run_job "$run/mpiexec-1x4" -n 2 "$py" \
    "$here/benchmarks/calibrate.py" --out "$table" --mca-note "one simulated host" || return 1
  echo "=== calibrate: the network, one rank on each of two hosts"
  MPITENSOR_TIME_MODEL=$table run_job "$run/mpiexec-4x1" -n 2 "$py" \
    "$here/benchmarks/calibrate.py" --link net --out "$table" --mca-note "$link_note" \
    || return 1
  echo "=== plan_ranking.py across 2 hosts x 2 ranks"
  MPITENSOR_TIME_MODEL=$table run_job "$run/mpiexec-2x2" -n 4 "$py" \
    "$here/benchmarks/plan_ranking.py" --link hosts --label hosts --note "$link_note" "$@"
}

main() {
  local what=${1:-all}
  [ $# -gt 0 ] && shift
  preflight
  trap cleanup EXIT
  trap 'echo "test-multinode: interrupted"; exit 130' INT TERM
  local start=$SECONDS status=0
  start_cluster || { echo "test-multinode: FAILED to build the simulated hosts"; exit 1; }
  echo "test-multinode: $nhosts simulated hosts up ($(cut -d' ' -f3 "$run/hosts" | xargs))"
  case $what in
    all)
      mapfile -t files < <(grep -v '^#' "$here/tests/transport_files.txt" | sed "s|^|$here/|")
      part_pytest "${files[@]}" || status=1
      part_nodes || status=1
      part_examples || status=1
      part_resume || status=1 ;;
    pytest) part_pytest "$@" || status=1 ;;
    nodes) part_nodes || status=1 ;;
    examples) part_examples || status=1 ;;
    resume) part_resume || status=1 ;;
    bench) part_bench "$@" || status=1 ;;
    exec)
      local layout=${1:?exec LAYOUT CMD...}
      shift
      MPIEXEC=$run/mpiexec-$layout run_job "$@" || status=1 ;;
    *) echo "usage: $0 [all|pytest [ARGS]|nodes|examples|resume|bench [ARGS]|exec LAYOUT CMD...]"
       exit 2 ;;
  esac
  echo "test-multinode: $((SECONDS - start))s, $([ $status = 0 ] && echo passed || echo FAILED)"
  return $status
}

main "$@"
