#!/usr/bin/env python
"""The instructions a NumPy call on a small DTensor executes over the same call on
its local block, counted by valgrind: the calls of benchmarks/call_cost.py, for this
checkout and (with --base) another one.

    python benchmarks/call_instructions.py [--calls 2000] [--base ../base]

Not under mpiexec: it runs one process per checkout, under
``valgrind --tool=callgrind``, with that checkout's Python (its ``.venv``), on a
mesh of one rank. A count does not depend on what else the machine runs, so two
commits compare exactly on a shared machine where call_cost.py's microseconds
drift between runs; it measures the dispatch's own work, which is what a change
to it moves. It leaves out what only time shows: the wait of the call agreement's
all-reduce at more ranks (call_cost.py times that at np 2), cache misses and the
CPU's speed.

Each call runs ``--calls`` times inside one ``functools.reduce``, after a warm-up,
and callgrind counts only inside it (``--toggle-collect``), one dump per reduce;
the DTensor call and NumPy's on the local arrays are counted alike, and the loop's
own instructions cancel in their difference.

Writes benchmarks/results/<cpu>/call_instructions-np1.json.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _step(f):
    return lambda acc, _: f()


def worker(out: str, checkout: str, calls: int) -> None:
    """Runs every call of call_cost.calls ``calls`` times in its own reduce (ours,
    then NumPy's), in the order the driver reads the dumps; writes the order and
    the machine record to ``out``."""
    import numpy as np
    from mpi4py import MPI

    import mpitensor as mt
    sys.path.insert(0, str(HERE))
    from call_cost import calls as call_table, checkout_machine
    mesh = mt.init_device_mesh("cpu", (1,))
    order = []
    for name, (ours, theirs) in call_table(mt, np, mesh).items():
        for variant, f in (("ours", ours), ("numpy", theirs)):
            for _ in range(100):
                f()
            functools.reduce(_step(f), range(calls), None)
            order.append((name, variant))
    info = checkout_machine(MPI.COMM_WORLD, checkout)
    Path(out).write_text(json.dumps({"machine": info, "order": order}))


def count(python: Path, root: Path, calls: int) -> dict:
    """{"machine": ..., "per_call": {name: {"ours", "numpy", "over"}}} of one checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "order.json")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0",
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   PYTHONPYCACHEPREFIX=str(root / "build" / "pycache"))
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                        "--toggle-collect=functools_reduce", "--dump-after=functools_reduce",
                        f"--callgrind-out-file={tmp}/cg", str(python), __file__,
                        "--worker", out, "--checkout", str(root), "--calls", str(calls)],
                       check=True, env=env, cwd=root, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        result = json.loads(Path(out).read_text())
        dumps = sorted(glob.glob(f"{tmp}/cg.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        totals = []
        for path in dumps:
            for line in Path(path).read_text().splitlines():
                if line.startswith("totals:"):
                    totals.append(int(line.split()[1]))
                    break
    if len(totals) != len(result["order"]):
        raise RuntimeError(f"{len(totals)} dumps for {len(result['order'])} loops")
    per_call: dict = {}
    for (name, variant), total in zip(result["order"], totals):
        per_call.setdefault(name, {})[variant] = round(total / calls)
    for row in per_call.values():
        row["over"] = row["ours"] - row["numpy"]
    return {"machine": result["machine"], "per_call": per_call}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--base", type=Path, default=None,
                    help="another checkout with its own .venv, counted alike")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--checkout", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.checkout, args.calls)
        return 0
    from _checkouts import driver_checkouts  # benchmarks/ is sys.path[0]
    checkouts = driver_checkouts(args.base)
    from _common import machine_line, result_path, write_result
    counted = {k: count(root / ".venv" / "bin" / "python", root, args.calls)
               for k, root in checkouts.items()}
    info = counted["this"]["machine"]
    info["base_commit"] = counted["base"]["machine"]["commit"] if "base" in counted else None
    print(machine_line(info) + (f"; base commit {info['base_commit']}" if "base" in counted
                                else ""))
    rows = []
    for name, mine in counted["this"]["per_call"].items():
        row = {"call": name, "numpy": mine["numpy"], "this": mine["over"]}
        if "base" in counted:
            row["base"] = counted["base"]["per_call"][name]["over"]
        rows.append(row)
    print(f"{'call':22s}{'NumPy':>10s}" + "".join(f"{k + ' (over NumPy)':>22s}"
                                                  for k in checkouts))
    for row in rows:
        print(f"{row['call']:22s}{row['numpy']:10d}"
              + "".join(f"{row[k]:22d}" for k in checkouts))
    out = args.out or result_path("call_instructions-np1.json")
    write_result(out, {"machine": info, "calls": args.calls, "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
