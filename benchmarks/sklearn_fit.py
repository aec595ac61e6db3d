#!/usr/bin/env python
"""scikit-learn's fit on sharded rows against scikit-learn on the whole array in one
process, side by side in one run.

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe --bind-to none -n 2 .venv/bin/python \
        benchmarks/sklearn_fit.py [--rows 200000] [--cols 50] [--reps 5]

``--bind-to none``: Open MPI binds each of two ranks to a core, and the one-process
baseline's BLAS threads would then share one.

For each estimator (PCA full and covariance_eigh, StandardScaler, MinMaxScaler,
Ridge(svd), LinearDiscriminantAnalysis, LogisticRegression), one repetition times,
in a shuffled order:

- ``mpitensor``: ``fit`` under ``array_api_dispatch=True`` on DTensors whose rows
  are sharded over every rank (``mpitensor.distribute_tensor``), one BLAS thread a
  rank;
- ``numpy``: the same ``fit`` on the whole NumPy array on rank 0 alone with as many
  BLAS threads as there are ranks (threadpoolctl), which is what the same user gets
  on this machine without mpitensor; the other ranks sleep in a non-blocking
  barrier meanwhile, so they take no core from it.

Before timing, the fitted attributes of both are compared (1e-6): a wrong fit is
reported, not timed. The figure per estimator is the median (and range) of the
per-repetition ratio numpy / mpitensor: above 1, mpitensor is faster. Writes
benchmarks/results/<cpu>/sklearn_fit-np{N}.json.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings

os.environ.setdefault("SCIPY_ARRAY_API", "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mpitensor as mt  # noqa: E402
import mpitensor.array_api as xp  # noqa: E402

from _common import machine, machine_line, result_path, summary, write_result  # noqa: E402


# Long enough for OpenBLAS's spinning threads to go to sleep.
SETTLE_S = 0.2


def estimators():
    """name -> (make, needs labels, the attributes compared)."""
    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.preprocessing import MinMaxScaler, StandardScaler
    return {
        "PCA(full)": (lambda: PCA(n_components=10, svd_solver="full"), None,
                      ("explained_variance_",)),
        "PCA(covariance_eigh)": (lambda: PCA(n_components=10, svd_solver="covariance_eigh"),
                                 None, ("explained_variance_",)),
        "StandardScaler": (StandardScaler, None, ("mean_", "scale_")),
        "MinMaxScaler": (MinMaxScaler, None, ("data_min_", "data_max_")),
        "Ridge(svd)": (lambda: Ridge(solver="svd"), "y", ("coef_",)),
        "LinearDiscriminantAnalysis": (LinearDiscriminantAnalysis, "labels", ("coef_",)),
        "LogisticRegression": (lambda: LogisticRegression(max_iter=200), "labels",
                               ("coef_",)),
    }


def idle_until_done(comm) -> None:
    """Waits for rank 0's barrier without spinning on a core (MPI's blocking
    barrier polls): the one-process baseline gets every core. Collective."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def full(v):
    return v.full_tensor() if isinstance(v, mt.DTensor) else np.asarray(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--cols", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated estimator names")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import sklearn
    from threadpoolctl import threadpool_limits

    comm = MPI.COMM_WORLD
    info = machine(comm)
    if comm.rank == 0:
        print(machine_line(info), flush=True)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.rows, args.cols))
    w = rng.standard_normal(args.cols)
    targets = {"y": X @ w + 0.1 * rng.standard_normal(args.rows),
               "labels": (X @ w > 0).astype(np.int64) + (X[:, 0] > 1)}
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    # Each rank's rows its own array, as rows read from a file are (distribute_tensor
    # copies; asarray would keep views of X, which the caller could still write).
    Xd = mt.distribute_tensor(X, mesh, [mt.Shard(0)])
    td = {k: mt.distribute_tensor(v, mesh, [mt.Shard(0)]) for k, v in targets.items()}
    warnings.simplefilter("ignore")
    wanted = [s for s in args.only.split(",") if s]
    rows = []
    for name, (make, target, attrs) in estimators().items():
        if wanted and name not in wanted:
            continue
        yn = targets[target] if target else None
        yd = td[target] if target else None

        def run_mt():
            with sklearn.config_context(array_api_dispatch=True):
                return make().fit(Xd, yd) if target else make().fit(Xd)

        def run_np():
            if comm.rank == 0:
                with threadpool_limits(limits=comm.size, user_api="blas"):
                    est = make().fit(X, yn) if target else make().fit(X)
                comm.Ibarrier().Wait()
                return est
            idle_until_done(comm)
            return None

        got, ref = run_mt(), run_np()
        wrong = []
        ref_attrs = comm.bcast({a: np.asarray(getattr(ref, a)) for a in attrs}
                               if comm.rank == 0 else None)
        for a in attrs:
            if not np.allclose(np.abs(full(getattr(got, a))), np.abs(ref_attrs[a]),
                               rtol=1e-6, atol=1e-9):
                wrong.append(a)
        times = {"mpitensor": [], "numpy": []}
        for r in range(args.reps):
            order = ["mpitensor", "numpy"]
            random.Random(r).shuffle(order)
            for k in order:
                # OpenBLAS's threads spin on for a while after a call: the other
                # side's run starts once they have gone to sleep, so that neither
                # is timed against the other's idle threads.
                time.sleep(SETTLE_S)
                comm.Barrier()
                t0 = time.perf_counter()
                (run_mt if k == "mpitensor" else run_np)()
                dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                times[k].append(dt)
        ratios = [b / a for a, b in zip(times["mpitensor"], times["numpy"])]
        row = {"estimator": name, "rows": args.rows, "cols": args.cols,
               "mpitensor_s": summary(times["mpitensor"]), "numpy_s": summary(times["numpy"]),
               "speedup": summary(ratios), "wrong": wrong}
        rows.append(row)
        if comm.rank == 0:
            s = row["speedup"]
            print(f"{name:28s} mpitensor {row['mpitensor_s']['median']*1e3:8.1f} ms  "
                  f"numpy {row['numpy_s']['median']*1e3:8.1f} ms  speedup "
                  f"{s['median']:.2f}x [{s['min']:.2f}..{s['max']:.2f}]"
                  + (f"  WRONG: {wrong}" if wrong else ""), flush=True)
    if comm.rank == 0:
        write_result(args.out or result_path(f"sklearn_fit-np{comm.size}.json"),
                     {"machine": info, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
