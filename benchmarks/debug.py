#!/usr/bin/env python
"""What the debugging tools cost: the collective mismatch checks when on, and the
debug hooks on the hot paths when logging is off, each against the same call
without them, in the same run, interleaved.

Run under MPI (see benchmarks/README.md)::

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 2 .venv/bin/python \
        benchmarks/debug.py [--reps 31]

Cases, on a 1-D mesh over all ranks, float64, global n x n:

* ``checks``: ``a.redistribute(mesh, [Replicate()])`` from [Shard(0)] (one
  all-gather), n in (8, 512), with ``set_collective_checks(True)`` (``on``) and
  ``False`` (``off``); ``ratio = on / off`` per repetition.
* ``hooks``: ``a + b`` (both [Shard(0)], no communication, n = 8, decision
  cached) with every tool off (``off``: the executor tests one flag) and with
  ``+dtensor`` logging to a handler that drops lines (``logged``: the executor's
  trace events, formatted), in us per call.

Each repetition times ``inner`` back-to-back calls per variant, in an order that
rotates between repetitions, after a Barrier; its time is the max over ranks.
Reported: median and [min..max] over repetitions. Writes
benchmarks/results/<cpu>/debug-np{N}.json.
"""

from __future__ import annotations

import argparse
import logging
import sys

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard
from mpitensor import _logging
from mpitensor.debug import set_collective_checks

from _common import machine, machine_line, result_path, write_result  # benchmarks/ is sys.path[0]
from dispatch import stats_us, time_interleaved


def with_checks(f, on: bool):
    def call():
        set_collective_checks(on)
        try:
            f()
        finally:
            set_collective_checks(False)
    return call


def checks_case(comm, mesh, n, reps, inner, warmup) -> dict:
    a = mt.distribute_tensor(np.random.default_rng(0).standard_normal((n, n)), mesh,
                             [Shard(0)])
    gather = lambda: a.redistribute(mesh, [Replicate()])  # noqa: E731
    times = time_interleaved(comm, {"off": with_checks(gather, False),
                                    "on": with_checks(gather, True)}, reps, inner, warmup)
    ratio = [on / off for on, off in zip(times["on"], times["off"])]
    return {"case": "checks", "n": n, "off_us": stats_us(times["off"]),
            "on_us": stats_us(times["on"]), "ratio": stats(ratio)}


class _Drop(logging.Handler):
    def emit(self, record):
        self.format(record)


def hooks_case(comm, mesh, reps, inner, warmup) -> dict:
    rng = np.random.default_rng(1)
    a = mt.distribute_tensor(rng.standard_normal((8, 8)), mesh, [Shard(0)])
    b = mt.distribute_tensor(rng.standard_normal((8, 8)), mesh, [Shard(0)])

    def loop():
        for _ in range(inner):
            a + b

    def logged():
        logger = logging.getLogger("mpitensor")
        _logging.set_level(logging.DEBUG)
        saved = logger.handlers[:]
        logger.handlers[:] = [_Drop()]
        try:
            loop()
        finally:
            logger.handlers[:] = saved
            _logging.set_level(None)

    loop()
    times = time_interleaved(comm, {"off": loop}, reps, 1, warmup)
    times.update(time_interleaved(comm, {"logged": logged}, reps, 1, warmup))
    per_call = {k: [t / inner for t in v] for k, v in times.items()}
    return {"case": "hooks", "n": 8, "off_us": stats_us(per_call["off"]),
            "logged_us": stats_us(per_call["logged"])}


def stats(xs) -> dict:
    a = np.asarray(xs, dtype=np.float64)
    return {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max())}


def fmt(s: dict, unit: str) -> str:
    return f"{s['median']:.2f} [{s['min']:.2f}..{s['max']:.2f}] {unit}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--inner", type=int, default=200, help="calls per repetition, small cases")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    info = machine(comm)
    if comm.rank == 0:
        print(machine_line(info), flush=True)
    rows = [checks_case(comm, mesh, 8, args.reps, args.inner, args.warmup),
            checks_case(comm, mesh, 512, args.reps, max(args.inner // 20, 1), args.warmup),
            hooks_case(comm, mesh, args.reps * 3, args.inner // 10, args.warmup)]
    if comm.rank == 0:
        out = args.out or result_path(f"debug-np{comm.size}.json")
        write_result(out, {"machine": info, "rows": rows})
        print(f"np {comm.size}")
        for r in rows:
            if r["case"] == "checks":
                print(f"  checks n={r['n']:4d}: off {fmt(r['off_us'], 'us')}; on "
                      f"{fmt(r['on_us'], 'us')}; on/off {fmt(r['ratio'], 'x')}")
            else:
                print(f"  hooks  add 8x8: tools off {fmt(r['off_us'], 'us')}; +dtensor "
                      f"(lines dropped) {fmt(r['logged_us'], 'us')}")
        print(f"  wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
