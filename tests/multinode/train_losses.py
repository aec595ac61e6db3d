"""examples/train_gpt.py's losses at full precision, for comparing runs on different
host layouts (tests/multinode/run.sh resume).

    mpiexec -n 4 python -m mpi4py train_losses.py OUT.json [train_gpt.py options]
    python train_losses.py --compare SAVED.json RESUMED.json...

The first form runs train_gpt.main with the options and rank 0 writes
{"start": first step, "losses": [...]} to OUT.json. The second checks that each
resumed run's losses equal the saving run's for the same steps (float64: to 1e-9
relative, what summing in another order across another mesh may change) and fails
naming the first step that differs.
"""

from __future__ import annotations

import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))


def run(out: str, argv: list[str]) -> None:
    from mpi4py import MPI

    import train_gpt

    losses = train_gpt.main(argv)
    # A resumed run trains from the step its checkpoint holds up to --steps.
    start = int(argv[argv.index("--steps") + 1]) - len(losses)
    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"start": start, "losses": [float(x) for x in losses],
                       "argv": argv, "size": MPI.COMM_WORLD.Get_size()}, f)


def compare(saved_path: str, resumed_paths: list[str]) -> int:
    with open(saved_path) as f:
        saved = json.load(f)
    status = 0
    for path in resumed_paths:
        with open(path) as f:
            resumed = json.load(f)
        start, losses = resumed["start"], resumed["losses"]
        expect = saved["losses"][start:]
        name = os.path.basename(path)
        if not losses or len(losses) != len(expect):
            print(f"{name}: {len(losses)} losses from step {start + 1}, the saving run has "
                  f"{len(expect)}")
            status = 1
            continue
        for i, (a, b) in enumerate(zip(expect, losses)):
            if not math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0):
                print(f"{name}: step {start + i + 1}: loss {b!r}, the saving run had {a!r}")
                status = 1
                break
        else:
            print(f"{name}: steps {start + 1}..{start + len(losses)} resumed with the saving "
                  f"run's losses ({', '.join(f'{x:.6f}' for x in losses)})")
    return status


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3:]))
    run(sys.argv[1], sys.argv[2:])
