"""Fits the time model's costs on this machine and writes the table mpitensor loads.

    make calibrate                      # 2 ranks: shared memory (or the network, if
                                        # the two ranks are on different nodes), then
                                        # the network class over TCP
    mpiexec -n 2 python benchmarks/calibrate.py --link net --mca-note tcp
                                        # fit the network class explicitly

Ranks 0 and 1 time a ping-pong of 8 B to --max-bytes (half a round trip, median
of --reps, after one untimed sweep): alpha is the time of the smallest messages,
beta the slope between the two largest sizes. `call` is what one mpitensor
redistribution step costs beyond its messages: the C executor running a Shard(0)
-> Replicate plan of 8 bytes per rank over every rank, less a raw MPI_Allgather of
the same bytes. `copy` and `reduce` are the seconds per byte of the local passes,
timed on every rank at once (ranks of a node share its memory bandwidth, so run
as many ranks as the node will): the C executor cutting --local-bytes per rank
out of a replicated array along its columns (a Replicate -> Shard(1) plan, a
strided copy and nothing else), and an in-place float64 addition of two arrays of
--local-bytes (the loop a reduction runs), the slowest rank's median per byte.
The link class is shared memory when ranks 0 and 1 share a node
(MPI_Comm_split_type), else the network, or --link. The table (JSON: the costs,
the machine, when) goes to $MPITENSOR_TIME_MODEL or
~/.cache/mpitensor/time_model.json (--out to choose); an existing table keeps its
entry for the other link class, and a network fit keeps the `call`, `copy` and
`reduce` a shared-memory fit measured (the executor's own costs, seen best where
messages are cheapest and the node's ranks run together). Every mesh created
afterwards ranks its plans by it (docs/performance.md, "The time model").
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import machine, machine_line  # noqa: E402

KiB, MiB = 1024, 1024 * 1024


def parse_bytes(text: str) -> int:
    t = text.strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": KiB, "m": MiB, "g": 1024 * MiB}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "kmg" else t) * mult)


def ping_pong(comm, nbytes: int, reps: int) -> float:
    """Median seconds of one one-way message of nbytes between ranks 0 and 1."""
    buf = np.zeros(max(nbytes, 1), np.uint8)
    times = []
    for _ in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.Send([buf, nbytes, MPI.BYTE], dest=1)
            comm.Recv([buf, nbytes, MPI.BYTE], source=1)
        elif comm.rank == 1:
            comm.Recv([buf, nbytes, MPI.BYTE], source=0)
            comm.Send([buf, nbytes, MPI.BYTE], dest=0)
        times.append((time.perf_counter() - t0) / 2)
    t = statistics.median(times[1:])
    return comm.bcast(t, root=0)


def call_cost(comm, reps: int) -> float:
    """Seconds one mpitensor step costs beyond a raw collective of the same bytes."""
    import mpitensor as mt
    from mpitensor import Replicate, Shard

    mesh = mt.init_device_mesh("cpu", (comm.size,), comm=comm)
    send, recv = np.zeros(1), np.zeros(comm.size)
    dt = mt.DTensor.from_local(send, mesh, [Shard(0)])
    mt_times, raw_times = [], []
    for _ in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        # The executor alone: a move its memo holds runs no Python code (the first,
        # which decides, is not counted).
        dt.redistribute(mesh, [Replicate()])
        mt_times.append(time.perf_counter() - t0)
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allgather(send, recv)
        raw_times.append(time.perf_counter() - t0)
    extra = statistics.median(mt_times[1:]) - statistics.median(raw_times[1:])
    return comm.bcast(max(extra, 0.0), root=0)


def slowest_median(comm, run, reps: int) -> float:
    """The slowest rank's median seconds of run(), every rank starting together."""
    times = []
    for _ in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return comm.allreduce(statistics.median(times[1:]), op=MPI.MAX)


def local_costs(comm, nbytes: int, reps: int) -> tuple[float, float]:
    """Seconds per byte that a rank copies (the executor's cut) and reduces, with
    every rank of the job doing the same at once."""
    import mpitensor as mt
    from mpitensor import Replicate, Shard, _layout, _plan

    mesh = mt.init_device_mesh("cpu", (comm.size,), comm=comm)
    cols = 64 * comm.size  # rows of 64 elements per rank: a strided cut
    rows = max(nbytes * comm.size // (8 * cols), 1)
    plan = _layout.plan(mesh, (rows, cols), (Replicate(),), (Shard(1),),
                                  np.dtype("f8"))
    full = np.ones((rows, cols))
    copied = plan.steps()[0][7]
    go = _plan.runner(mesh, plan, full)
    cut = slowest_median(comm, lambda: go(full), reps)
    a, b = np.ones(max(nbytes // 8, 1)), np.ones(max(nbytes // 8, 1))
    added = slowest_median(comm, lambda: np.add(a, b, out=a), reps)
    return cut / copied, added / a.nbytes


def floor_network(table: dict) -> str:
    """Raises the network's alpha and beta to shared memory's where a fit came out
    below them (the model needs the network no faster; TCP between ranks of one
    node can time as fast as shared memory); returns a note of what it raised."""
    shm, net = table.get("shm"), table.get("net")
    if not isinstance(shm, dict) or not isinstance(net, dict):
        return ""
    raised = [k for k in ("alpha", "beta") if net.get(k, 0.0) < shm.get(k, 0.0)]
    for k in raised:
        net[k] = shm[k]
    return f" (network {' and '.join(raised)} raised to shared memory's)" if raised else ""


def same_node(comm) -> bool:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    leader = node.allreduce(comm.rank, op=MPI.MIN)
    node.Free()
    leaders = comm.allgather(leader)
    return leaders[0] == leaders[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-bytes", default="16MiB", help="largest ping-pong message")
    ap.add_argument("--reps", type=int, default=20, help="repetitions per size")
    ap.add_argument("--local-bytes", default="16MiB", help="bytes per rank of the "
                    "copy and reduction timed for `copy` and `reduce`, beyond the "
                    "caches (at most --max-bytes, so a smoke run stays small)")
    ap.add_argument("--link", choices=("shm", "net"), help="the link class to fit "
                    "(default: from whether ranks 0 and 1 share a node)")
    ap.add_argument("--out", help="where to write the table (default: the path "
                    "mpitensor reads, $MPITENSOR_TIME_MODEL or ~/.cache/mpitensor/)")
    ap.add_argument("--mca-note", default="", help="a note on the transport "
                    "(e.g. 'btl self,tcp'), recorded in the table")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        print("calibrate: needs at least 2 ranks (mpiexec -n 2)", file=sys.stderr)
        return 2
    from mpitensor import _timemodel

    info = machine(comm)
    link = args.link or ("shm" if same_node(comm) else "net")
    sizes, n = [], 8
    top = parse_bytes(args.max_bytes)
    while n <= top:
        sizes.append(n)
        n *= 4
    if len(sizes) < 3:
        sizes = [8, max(top // 2, 16), max(top, 32)]
    for s in sizes:  # warm up: connections, page faults, MPI's buffers
        ping_pong(comm, s, 1)
    times = [ping_pong(comm, s, args.reps) for s in sizes]
    alpha = min(times[:2])
    beta = max((times[-1] - times[-2]) / (sizes[-1] - sizes[-2]), 0.0)
    call = call_cost(comm, args.reps)
    local_bytes = min(parse_bytes(args.local_bytes), top)
    copy, reduce = local_costs(comm, local_bytes, args.reps)
    if comm.rank != 0:
        return 0
    path = args.out or _timemodel.table_path()
    table = {}
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
        if table.get("format") != _timemodel.FORMAT:
            table = {}
    except (OSError, ValueError):
        table = {}
    # The executor's own costs (per step, per byte copied or reduced) are seen
    # best where messages are cheapest and a node's ranks run together: a network
    # fit keeps those a shared-memory fit measured.
    measured = {"call": call, "copy": copy, "reduce": reduce}
    kept = dict(measured)
    if link == "net" and "shm" in table:
        kept.update({k: table[k] for k in measured
                     if isinstance(table.get(k), (int, float))})
    table.update({"format": _timemodel.FORMAT, "version": _timemodel.VERSION,
                  link: {"alpha": alpha, "beta": beta,
                         "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "transport": args.mca_note, **measured,
                         "local": {"bytes_per_rank": local_bytes, "ranks": comm.size},
                         "ping_pong": [[s, t] for s, t in zip(sizes, times)]},
                  **kept, "machine": info})
    floored = floor_network(table)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1)
    os.replace(tmp, path)
    costs = _timemodel.read_table(path)  # what a mesh will load, validated
    print(machine_line(info))
    print(f"link {link}: alpha {alpha * 1e6:.3g} us per message, beta "
          f"{beta * 1e9:.3g} ns per byte ({1 / beta / 1e9 if beta else float('inf'):.3g} "
          f"GB/s); call {call * 1e6:.3g} us per step; copy {copy * 1e9:.3g} and "
          f"reduce {reduce * 1e9:.3g} ns per byte ({comm.size} ranks at once)"
          + (" (the table keeps shared memory's call, copy and reduce)"
             if kept != measured else ""))
    print(f"wrote {path}: (alpha_shm, beta_shm, alpha_net, beta_net, call, copy, "
          f"reduce) = {costs}{floored}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
