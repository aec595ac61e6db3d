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
  cached) through its Python entry (the C path switched off, as while a tool
  listens), with the library as it is (``hooked``: the ``if _modes.state.tracing:``
  test in ``_ops._dispatch._traced``) and with ``_traced`` replaced by the same
  function without the test (``bare``); ``overhead = hooked - bare`` in ns per
  call. Also ``+dtensor`` to a handler that drops lines, to show what logging
  costs when on. (The C path reads one C flag instead.)

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
from mpitensor._ops import _dispatch
from mpitensor.debug import set_collective_checks

from _common import machine, machine_line, result_path, write_result  # benchmarks/ is sys.path[0]
from dispatch import stats_us, time_interleaved


def bare_traced(op_key, operands, dec):
    """_ops._dispatch._traced without the debug hook: the baseline of ``hooks``."""
    return dec


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
    add = lambda: a + b  # noqa: E731
    hooked = _dispatch._traced

    def loop():
        was = mt._C.dispatch_enable(False)  # the Python entry, where the hook is
        try:
            for _ in range(inner):
                add()
        finally:
            mt._C.dispatch_enable(was)

    def bare():
        _dispatch._traced = bare_traced
        try:
            loop()
        finally:
            _dispatch._traced = hooked

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

    add()
    # hooked and bare alternate in short blocks so that both meet the same load;
    # logging on is timed apart (it is two orders of magnitude slower).
    times = time_interleaved(comm, {"hooked": loop, "bare": bare}, reps, 1, warmup)
    times.update(time_interleaved(comm, {"logged": logged}, reps, 1, warmup))
    per_call = {k: [t / inner for t in v] for k, v in times.items()}
    overhead = [h - b for h, b in zip(per_call["hooked"], per_call["bare"])]
    return {"case": "hooks", "n": 8, "hooked_us": stats_us(per_call["hooked"]),
            "bare_us": stats_us(per_call["bare"]), "logged_us": stats_us(per_call["logged"]),
            "overhead_ns": stats(np.array(overhead) * 1e9)}


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
                print(f"  hooks  add 8x8: bare {fmt(r['bare_us'], 'us')}; hooked "
                      f"{fmt(r['hooked_us'], 'us')}; hooked - bare "
                      f"{fmt(r['overhead_ns'], 'ns')}; +dtensor (lines dropped) "
                      f"{fmt(r['logged_us'], 'us')}")
        print(f"  wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
