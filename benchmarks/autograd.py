"""What autograd's recording adds to one operation: the same small operations on
DTensors that require grad (each call records a node) and on the same DTensors
without grad, interleaved in one run, beside NumPy on the local arrays.

    OPENBLAS_NUM_THREADS=1 mpiexec -n 2 python benchmarks/autograd.py [--calls 2000] [--reps 15]

The target: recording adds at most 5 us per operation; without any
input requiring grad the operation costs what it did (benchmarks/dispatch.py).
Also reported: one backward through a chain of the operations, per operation.
Writes benchmarks/results/<cpu>/autograd-np{N}.json.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard
from _common import (machine, machine_line, per_call_us, result_path,  # benchmarks/ is sys.path[0]
                     summary, write_result)

OPS = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "tanh": lambda a, b: np.tanh(a),
    "matmul": lambda a, b: a @ b.T,
    "sum0": lambda a, b: a.sum(axis=0),
    # recorded by the Python entry, not the C dispatch: the slower way to record
    "getitem": lambda a, b: a[:, 2:5],
    "reshape": lambda a, b: a.reshape(-1),
}


def rows(times: dict) -> list:
    """Per operation, summary() of its times per call (us) and of the per-repetition
    differences: no_grad - numpy (the dispatch) and grad - no_grad (the recording)."""
    out = []
    for name in OPS:
        t = {k: times[f"{name}/{k}"] for k in ("numpy", "no_grad", "grad")}
        out.append({"op": name, **{f"{k}_us": summary(v) for k, v in t.items()},
                    "above_numpy_us": summary([p - x for p, x in zip(t["no_grad"], t["numpy"])]),
                    "recording_us": summary([g - p for g, p in zip(t["grad"], t["no_grad"])])})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per repetition")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--size", type=int, default=8, help="the global arrays are size x size")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<cpu>/...)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    rng = np.random.default_rng(0)
    n = args.size * comm.size
    x, y = rng.standard_normal((n, args.size)), rng.standard_normal((n, args.size))
    plain = [mt.distribute_tensor(v, mesh, [Shard(0)]) for v in (x, y)]
    graded = [mt.distribute_tensor(v, mesh, [Shard(0)], requires_grad=True) for v in (x, y)]
    local = [d.to_local() for d in plain]

    variants = {}
    for name, op in OPS.items():
        variants[(name, "numpy")] = (lambda op=op: op(*local))
        variants[(name, "no_grad")] = (lambda op=op: op(*plain))
        variants[(name, "grad")] = (lambda op=op: op(*graded))

    def chain_backward():
        a, b = graded
        h = np.tanh(a * b + a)
        (h @ b.T).sum().backward()  # five recorded operations, then their backward

    info = machine(comm)
    times = {f"{k[0]}/{k[1]}": [] for k in variants}
    times["backward_of_5_ops"] = []
    for fn in variants.values():  # warm-up: fill the decision caches
        per_call_us(fn, args.calls // 4)
    per_call_us(chain_backward, 20)
    for _ in range(args.reps):
        for key, fn in variants.items():
            comm.Barrier()
            times[f"{key[0]}/{key[1]}"].append(per_call_us(fn, args.calls))
        comm.Barrier()
        times["backward_of_5_ops"].append(per_call_us(chain_backward, max(args.calls // 20, 10)))
        for g in graded:
            g.grad = None
    med = {k: statistics.median(v) for k, v in times.items()}
    if comm.rank == 0:
        print(machine_line(info))
        print(f"{'op':8s} {'numpy':>8s} {'no_grad':>8s} {'grad':>8s} {'recording adds':>15s}  (us per call, "
              f"medians of {args.reps})")
        for name in OPS:
            rec = [g - p for g, p in zip(times[f"{name}/grad"], times[f"{name}/no_grad"])]
            print(f"{name:8s} {med[f'{name}/numpy']:8.2f} {med[f'{name}/no_grad']:8.2f} "
                  f"{med[f'{name}/grad']:8.2f} {statistics.median(rec):8.2f} "
                  f"[{min(rec):.2f}..{max(rec):.2f}]")
        t = times["backward_of_5_ops"]
        print(f"forward + backward of tanh(a*b + a) @ b.T then sum: "
              f"{statistics.median(t):.1f} us [{min(t):.1f}..{max(t):.1f}]")
        path = args.out or result_path(f"autograd-np{comm.size}.json")
        write_result(path, {"machine": info, "args": vars(args), "rows": rows(times),
                            "backward_of_5_ops_us": summary(times["backward_of_5_ops"])})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
