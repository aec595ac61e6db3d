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
the same bytes. The link class is shared memory when ranks 0 and 1 share a node
(MPI_Comm_split_type), else the network, or --link. The table
(JSON: the costs, the machine, when) goes to $MPITENSOR_TIME_MODEL or
~/.cache/mpitensor/time_model.json (--out to choose); an existing table keeps its
entry for the other link class, and a network fit keeps the `call` a shared-memory
fit measured (the executor's own cost, seen best where messages are cheapest). Every mesh created afterwards ranks its plans by
it (docs/performance.md, "The time model").
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
    from mpitensor import Replicate, Shard, _C, _redistribute

    mesh = mt.init_device_mesh("cpu", (comm.size,), comm=comm)
    plan = _redistribute.plan_for(mesh, (comm.size,), (Shard(0),), (Replicate(),),
                                  np.dtype("f8"))
    send, recv = np.zeros(1), np.zeros(comm.size)
    mt_times, raw_times = [], []
    for _ in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        _C.redistribute(mesh._handle, plan, send)  # the executor alone, no Python
        mt_times.append(time.perf_counter() - t0)
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allgather(send, recv)
        raw_times.append(time.perf_counter() - t0)
    extra = statistics.median(mt_times[1:]) - statistics.median(raw_times[1:])
    return comm.bcast(max(extra, 0.0), root=0)


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
    # `call` is the executor's own cost per step, seen best where messages are
    # cheapest: a network fit keeps the one a shared-memory fit measured.
    measured_call = call
    if link == "net" and "shm" in table and isinstance(table.get("call"), (int, float)):
        call = table["call"]
    table.update({"format": _timemodel.FORMAT, "version": _timemodel.VERSION,
                  link: {"alpha": alpha, "beta": beta,
                         "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "transport": args.mca_note, "call": measured_call,
                         "ping_pong": [[s, t] for s, t in zip(sizes, times)]},
                  "call": call, "machine": info})
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1)
    os.replace(tmp, path)
    costs = _timemodel.read_table(path)  # what a mesh will load, validated
    print(machine_line(info))
    print(f"link {link}: alpha {alpha * 1e6:.3g} us per message, beta "
          f"{beta * 1e9:.3g} ns per byte ({1 / beta / 1e9 if beta else float('inf'):.3g} "
          f"GB/s); call {measured_call * 1e6:.3g} us per step"
          + (f" (the table keeps shared memory's {call * 1e6:.3g} us)"
             if call != measured_call else ""))
    print(f"wrote {path}: (alpha_shm, beta_shm, alpha_net, beta_net, call) = {costs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
