"""Two checkouts timed side by side in one sitting.

A driver, started by hand and not under mpiexec, starts one MPI job per checkout
with that checkout's own ``.venv`` (so each job imports its own mpitensor),
alternating the checkouts round after round, so that the machine's drift falls on
both alike. Each job runs the driver's script as a worker, which writes one JSON
object of figures; the driver keeps, per figure, the median and range over
rounds. Imports only the standard library: the driver must not start MPI.

Example::

    checkouts = driver_checkouts(args.base)
    rounds = alternate(checkouts, 3, 2, __file__, ["--reps", "31"])
    rows = over_rounds(rounds, "table")
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def driver_checkouts(base: Path | None) -> dict:
    """{"this": this checkout, "base": ``base``} (no "base" when None). Keeps this
    process from starting MPI, which the jobs it starts do: call it before
    anything imports ``mpi4py.MPI``.

    Example: ``for key, root in driver_checkouts(Path("../base")).items(): ...``.
    """
    import mpi4py
    mpi4py.rc.initialize = False
    checkouts = {"this": HERE.parent}
    if base is not None:
        if not (base / ".venv" / "bin" / "python").exists():
            raise SystemExit(f"{base}: no .venv/bin/python (run `make install` there)")
        checkouts["base"] = base.resolve()
    return checkouts


def run_worker(root: Path, nprocs: int, script: str, args: list) -> dict:
    """The JSON object that ``script --worker OUT --checkout ROOT *args`` writes, run
    as one job of ``nprocs`` ranks with the Python of checkout ``root``, one BLAS
    thread each.

    Example: ``run_worker(Path("."), 2, __file__, ["--reps", "31"])["table"]``.
    """
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    try:
        subprocess.run(["mpiexec", "-n", str(nprocs), str(root / ".venv" / "bin" / "python"),
                        "-m", "mpi4py", str(Path(script).resolve()), "--worker", out,
                        "--checkout", str(root), *map(str, args)], check=True, env=env, cwd=HERE.parent)
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def alternate(checkouts: dict, rounds: int, nprocs: int, script: str, args: list) -> dict:
    """{checkout key: [each round's worker result]}, the checkouts taking turns.

    Example: ``alternate({"this": Path(".")}, 3, 2, __file__, [])["this"][0]``.
    """
    out = {k: [] for k in checkouts}
    for _ in range(rounds):
        for key, root in checkouts.items():
            out[key].append(run_worker(root, nprocs, script, args))
    return out


def over_rounds(rounds: dict, field: str) -> list:
    """[{"call": name, key: {"median", "min", "max"} per checkout}] of every name in
    the first round's ``field`` (a {name: figure} dict), over the rounds.

    Example: ``over_rounds({"this": [{"t": {"a": 1.0}}]}, "t")[0]["this"]["median"]``.
    """
    rows = []
    for name in rounds["this"][0][field]:
        row = {"call": name}
        for key, results in rounds.items():
            v = [r[field][name] for r in results if name in r[field]]
            row[key] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
        rows.append(row)
    return rows


def print_rows(rows: list, keys, unit: str) -> None:
    """The rows of over_rounds as a table, a column per checkout."""
    print(f"{'':22s}" + "".join(f"{k + ' (' + unit + ')':>30s}" for k in keys))
    for row in rows:
        print(f"{row['call']:22s}" + "".join(
            f"{row[k]['median']:8.2f} [{row[k]['min']:.2f}..{row[k]['max']:.2f}]".rjust(30)
            for k in keys))
