#!/usr/bin/env python
"""Instructions per ``DTensor.redistribute`` call outside MPI, against the raw mpi4py
call, counted by callgrind: the fixed cost of a small redistribute, repeatable on a
loaded machine where timings are not.

Run it without mpiexec (it launches ``mpiexec -n NP valgrind --tool=callgrind``
itself; a few minutes at np 2)::

    .venv/bin/python benchmarks/redistribute_instructions.py [--np 2] [--bytes 1KiB]
        [--calls 100] [--transitions S0->R,P->R]

Each rank builds the cases of ``benchmarks/redistribute.py`` (same shapes and
buffers), warms each variant up, then runs ``--calls`` calls between two
``os.times()``; ``--dump-before=times`` makes every such loop a part of its own. A
part's count, minus what the MPI entry points it called (``PMPI_*``) counted
inclusively, divided by the calls, is the figure: MPI's own work, and the polling
while a rank waits for the other (which grows with load), are left out. Both
variants pay the same Python loop around the call. Prints one line per transition
with the mean over ranks.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ["S0->R", "S1->R", "P->R", "P->S0", "P->S1", "S0->S1", "R->S0"]


def child(names, nbytes: int, calls: int, header: str) -> None:
    """Under callgrind, on every rank: one bracketed loop per (transition, variant);
    rank 0 writes the machine line to `header`."""
    from mpi4py import MPI

    import mpitensor as mt
    import redistribute as bench  # benchmarks/ is sys.path[0]
    from _common import machine, machine_line

    comm = MPI.COMM_WORLD
    info = machine(comm)
    if comm.rank == 0:
        with open(header, "w") as f:
            f.write(machine_line(info))
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    for name in names:
        src, dst = name.split("->")
        case = bench.Case(name, src, dst, nbytes, comm, mesh)
        for fn in (case.run_mt, case.raw):
            for _ in range(20):
                fn()
            comm.Barrier()
            os.times()
            for _ in range(calls):
                fn()
            os.times()
            comm.Barrier()


def outside_mpi(part: str, calls: int) -> float:
    """Instructions per call of a loop's part, without the MPI entry points'."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", part],
                          capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text)
                .group(1).replace(",", ""))
    mpi = sum(int(m.group(1).replace(",", "")) for m in re.finditer(
        r"^\s*([\d,]+) \([\d. %]+\)\s+\?\?\?:P?MPI_\w+ ", text, re.MULTILINE))
    return (total - mpi) / calls


def parse_bytes(text: str) -> int:
    t = text.strip().lower().replace("ib", "").replace("b", "")
    scale = {"k": 1 << 10, "m": 1 << 20}.get(t[-1:], 1)
    return int(t.rstrip("km")) * scale


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--bytes", default="1KiB", help="local input per rank")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--transitions", default=",".join(NAMES))
    p.add_argument("--mpiexec", default="mpiexec --oversubscribe")
    p.add_argument("--child", metavar="HEADER", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    names = a.transitions.split(",")
    if a.child:
        child(names, parse_bytes(a.bytes), a.calls, a.child)
        return 0
    with tempfile.TemporaryDirectory() as out:
        cmd = a.mpiexec.split() + [
            "-n", str(a.np), "valgrind", "--tool=callgrind", "--dump-before=times",
            f"--callgrind-out-file={out}/cg.%p", sys.executable, os.path.abspath(__file__),
            "--child", f"{out}/machine.txt", "--bytes", a.bytes, "--calls", str(a.calls),
            "--transitions", a.transitions]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ranks = sorted(f for f in os.listdir(out) if re.fullmatch(r"cg\.\d+", f))
        with open(f"{out}/machine.txt") as f:
            print(f.read())
        print(f"instructions per call outside MPI, np {a.np}, {a.bytes} per rank, "
              f"mean over {len(ranks)} ranks")
        print(f"{'transition':<10} {'mt':>8} {'raw':>8} {'mt - raw':>9}")
        for i, name in enumerate(names):
            # Part 1 is everything before the first loop; loops are the even parts.
            mt_i, raw_i = (sum(outside_mpi(f"{out}/{r}.{2 * (2 * i + k + 1)}", a.calls)
                               for r in ranks) / len(ranks) for k in (0, 1))
            print(f"{name:<10} {mt_i:>8.0f} {raw_i:>8.0f} {mt_i - raw_i:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
