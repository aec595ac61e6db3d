#!/usr/bin/env python
"""What a NumPy call on a small DTensor costs over the same call on its local block:
operators, registered NumPy functions, DTensor methods and basic keys, their call
agreement included, for this checkout and (with --base) another one, side by side.

    python benchmarks/call_cost.py [--np 2] [--rounds 3] [--base ../base]

Not under mpiexec: it starts the workers itself, ``mpiexec -n NP`` with each
checkout's Python (its ``.venv``), alternating the two checkouts ``--rounds`` times
in one sitting, so that the machine's drift falls on both alike. Each worker times,
for each call, ``inner`` back-to-back calls of the DTensor expression and of the
same expression on the local ndarrays, interleaved, over ``reps`` repetitions (each
starting at a Barrier, its time the max over ranks); the figure is the median of the
per-repetition difference, in microseconds. A round's figure per call is that
median; the table gives the median and range over rounds.

The calls, on a 1-D mesh over all ranks, float64 (8, 8) operands:

* ``a + b``              both [Shard(0)]: the executor's operator door
* ``np.sum(x, axis=1)``  [Shard(0)]: a reduction through __array_function__
* ``x.sum(axis=1)``      the same as a DTensor method
* ``np.mean(x)``         a full reduction (a Partial left, nothing moved)
* ``x[:, :4]``           a basic key along an unsharded dim (a view)
* ``c[:, 3] = 1.0``      a number written through a basic key
* ``np.where(m, a, b)``  a registered function of three operands
* ``np.clip(a, 0, 1)``   a registered function with scalar bounds
* ``np.concatenate``     ``(a, b)`` along axis 1 (unsharded)
* ``x.reshape(-1, 2)``   a view of the local block, NumPy's view semantics agreed
* ``np.flip(x, 1)``      a view along an unsharded axis, the same
* ``np.cumsum(x, 1)``    a scan along an unsharded axis
* ``np.sort(x, 1)``      a sort along an unsharded axis
* ``np.diff(x, axis=1)`` differences along an unsharded axis
* ``np.stack``           ``(a, b)`` on a new leading axis
* ``x.astype(float32)``  a cast, placements kept
* ``np.any(x)``          a full reduction of a mask (a bool Partial left)
* ``np.add(a, b, out=c)`` a ufunc writing into a DTensor
* ``c += b``             an in-place operator

Writes benchmarks/results/<cpu>/call_cost-np{N}.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The goal: each call within this many microseconds of NumPy's on the local block,
# its agreement included, at np 2 (np 4 on 2 cores only watches for regressions).
TARGET_US = 2.5


def calls(mt, np, mesh):
    """{name: (DTensor call, the same on the local arrays)}."""
    from mpitensor import Shard
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    a = mt.distribute_tensor(A, mesh, [Shard(0)])
    b = mt.distribute_tensor(B, mesh, [Shard(0)])
    c = mt.distribute_tensor(B, mesh, [Shard(0)])
    m = a > 0
    la, lb, lc, lm = a.to_local(), b.to_local(), c.to_local(), m.to_local()
    return {
        "a + b": (lambda: a + b, lambda: la + lb),
        "np.sum(x, axis=1)": (lambda: np.sum(a, axis=1), lambda: np.sum(la, axis=1)),
        "x.sum(axis=1)": (lambda: a.sum(axis=1), lambda: la.sum(axis=1)),
        "np.mean(x)": (lambda: np.mean(a), lambda: np.mean(la)),
        "x[:, :4]": (lambda: a[:, :4], lambda: la[:, :4]),
        "c[:, 3] = 1.0": (lambda: c.__setitem__((slice(None), 3), 1.0),
                          lambda: lc.__setitem__((slice(None), 3), 1.0)),
        "np.where(m, a, b)": (lambda: np.where(m, a, b), lambda: np.where(lm, la, lb)),
        "np.clip(a, 0, 1)": (lambda: np.clip(a, 0, 1), lambda: np.clip(la, 0, 1)),
        "np.concatenate": (lambda: np.concatenate((a, b), axis=1),
                           lambda: np.concatenate((la, lb), axis=1)),
        "x.reshape(-1, 2)": (lambda: a.reshape(-1, 2), lambda: la.reshape(-1, 2)),
        "np.flip(x, 1)": (lambda: np.flip(a, 1), lambda: np.flip(la, 1)),
        "np.cumsum(x, 1)": (lambda: np.cumsum(a, 1), lambda: np.cumsum(la, 1)),
        "np.sort(x, 1)": (lambda: np.sort(a, 1), lambda: np.sort(la, 1)),
        "np.diff(x, axis=1)": (lambda: np.diff(a, axis=1), lambda: np.diff(la, axis=1)),
        "np.stack": (lambda: np.stack((a, b)), lambda: np.stack((la, lb))),
        "x.astype(float32)": (lambda: a.astype(np.float32), lambda: la.astype(np.float32)),
        "np.any(x)": (lambda: np.any(m), lambda: np.any(lm)),
        "np.add(a, b, out=c)": (lambda: np.add(a, b, out=c), lambda: np.add(la, lb, out=lc)),
        "c += b": (lambda: c.__iadd__(b), lambda: lc.__iadd__(lb)),
    }


def overheads(comm, table: dict, reps: int, inner: int) -> dict:
    """{name: median over ``reps`` repetitions of the DTensor call's time minus the
    local call's, in us}, for ``table`` as calls() gives it. Each repetition times
    ``inner`` back-to-back calls of each, interleaved, after a Barrier, each time
    the max over ranks. Collective."""
    from mpi4py import MPI
    out = {}
    for name, (ours, theirs) in table.items():
        ours(), theirs()
        diffs = []
        for r in range(reps + 2):
            spent = []
            for f in ((ours, theirs) if r % 2 else (theirs, ours)):
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(inner):
                    f()
                spent.append((time.perf_counter() - t0) / inner)
            if r % 2 == 0:
                spent.reverse()
            d = comm.allreduce(spent[0], op=MPI.MAX) - comm.allreduce(spent[1], op=MPI.MAX)
            if r >= 2:
                diffs.append(d * 1e6)
        out[name] = statistics.median(diffs)
    return out


def checkout_machine(comm, checkout: str) -> dict:
    """machine() with the commit of the checkout whose mpitensor runs, not of the
    script's (the driver runs this script with each checkout's Python)."""
    sys.path.insert(0, str(HERE))
    from _common import git_revision, machine
    info = machine(comm)
    info["commit"] = git_revision(checkout)
    return info


def worker(out: str, checkout: str, reps: int, inner: int) -> None:
    """Times every call under MPI and writes {name: median overhead in us}."""
    import numpy as np
    from mpi4py import MPI

    import mpitensor as mt
    comm = MPI.COMM_WORLD
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    table = overheads(comm, calls(mt, np, mesh), reps, inner)
    info = checkout_machine(comm, checkout)
    if comm.rank == 0:
        Path(out).write_text(json.dumps({"machine": info, "table": table}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--inner", type=int, default=300)
    ap.add_argument("--base", type=Path, default=None,
                    help="another checkout with its own .venv, timed alternately")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--checkout", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.checkout, args.reps, args.inner)
        return 0
    sys.path.insert(0, str(HERE))
    from _checkouts import alternate, driver_checkouts, over_rounds, print_rows
    checkouts = driver_checkouts(args.base)
    from _common import machine_line, result_path, write_result
    rounds = alternate(checkouts, args.rounds, args.np, __file__,
                       ["--reps", args.reps, "--inner", args.inner])
    info = rounds["this"][0]["machine"]
    info["base_commit"] = rounds["base"][0]["machine"]["commit"] if "base" in rounds else None
    print(machine_line(info) + (f"; base commit {info['base_commit']}" if "base" in rounds
                                else ""))
    rows = over_rounds(rounds, "table")
    print_rows(rows, checkouts, "us over NumPy")
    worst = max(rows, key=lambda r: r["this"]["median"])
    met = worst["this"]["median"] <= TARGET_US
    print(f"target: every call within {TARGET_US} us of NumPy's (medians) -> "
          f"{'MET' if met else 'MISSED'}; the costliest: {worst['call']}, "
          f"{worst['this']['median']:.2f} us")
    out = args.out or result_path(f"call_cost-np{args.np}.json")
    write_result(out, {"machine": info, "rounds": args.rounds, "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
