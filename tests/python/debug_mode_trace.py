"""One small program traced by DebugMode in mpitensor and in torch, and the reading
that lets the two traces be compared line for line.

The program: ``(x @ w).sum()`` with both Shard(0), an explicit redistribute to
Replicate, and a two-layer MLP parallelized ColwiseParallel -> RowwiseParallel,
forward and backward, with module calls recorded.

Run under ``mpiexec -n 2`` with torch installed, this file writes torch's traces
(one per rank) to data/debug_mode_torch_np2.json, which test_debug_mode.py holds
mpitensor's against when torch is absent::

    mpiexec -n 2 .venv/bin/python -m mpi4py tests/python/debug_mode_trace.py
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "debug_mode_torch_np2.json")


def data():
    """The program's global arrays (float32)."""
    x = (np.arange(32, dtype=np.float32).reshape(8, 4) - 10) / 10
    w = (np.arange(16, dtype=np.float32).reshape(4, 4) - 5) / 10
    batch = np.random.default_rng(7).standard_normal((4, 8)).astype(np.float32)
    return x, w, batch


def mpitensor_trace(**options) -> str:
    """The program's DebugMode trace on this rank, in mpitensor. Collective."""
    import mpitensor as mt
    from mpitensor import Replicate, Shard, distribute_tensor, nn
    from mpitensor.debug import DebugMode
    from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from mpi4py import MPI

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            mt.manual_seed(5)
            self.net1 = nn.Linear(8, 16, dtype=np.float32)
            self.relu = nn.ReLU()
            self.net2 = nn.Linear(16, 8, dtype=np.float32)

        def forward(self, x):
            return self.net2(self.relu(self.net1(x)))

    mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
    gx, gw, batch = data()
    x = distribute_tensor(gx, mesh, [Shard(0)])
    w = distribute_tensor(gw, mesh, [Shard(0)])
    model = parallelize_module(MLP(), mesh, {"net1": ColwiseParallel(),
                                             "net2": RowwiseParallel()})
    with DebugMode(record_nn_module=True, **options) as mode:
        (x @ w).sum()
        x.redistribute(mesh, [Replicate()])
        model(batch).sum().backward()
    return mode.debug_string()


def torch_trace(**options) -> str:
    """The same program's trace on this rank, in torch over gloo. Collective."""
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module)
    from torch.utils._debug_mode import DebugMode

    from mpitensor.testing import init_torch_gloo

    dist = init_torch_gloo()

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(5)
            self.net1 = nn.Linear(8, 16)
            self.relu = nn.ReLU()
            self.net2 = nn.Linear(16, 8)

        def forward(self, x):
            return self.net2(self.relu(self.net1(x)))

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    gx, gw, batch = (torch.from_numpy(a) for a in data())
    x = distribute_tensor(gx, mesh, [Shard(0)])
    w = distribute_tensor(gw, mesh, [Shard(0)])
    model = parallelize_module(MLP(), mesh, {"net1": ColwiseParallel(),
                                             "net2": RowwiseParallel()})
    with DebugMode(record_nn_module=True, **options) as mode:
        (x @ w).sum()
        x.redistribute(mesh, [Replicate()])
        model(batch).sum().backward()
    return mode.debug_string()


# -- reading a trace ----------------------------------------------------------------------

# aten's names -> NumPy's (the names mpitensor's executor reports); None: a view or
# a copy, which never communicates and which mpitensor's formulas do not all make.
TORCH_NAMES = {
    "aten::mm": "numpy.matmul", "aten::addmm": "linear", "aten::sum": "numpy.sum",
    "aten::sum.dim_IntList": "numpy.sum", "aten::add.Tensor": "numpy.add",
    "aten::mul.Tensor": "numpy.multiply", "aten::relu": "relu",
    "aten::t": None, "aten::view": None, "aten::detach": None, "aten::transpose.int": None,
    "aten::expand": None, "aten::clone": None, "aten::_to_copy": None,
}
# mpitensor's views, and the contraction its linear's backward writes for torch's
# t + mm.
MPITENSOR_NAMES = {
    "numpy.einsum": "numpy.matmul", "numpy.reshape": None, "numpy.broadcast_to": None,
    "numpy.transpose": None, "numpy.matrix_transpose": None, "numpy.copy": None,
}
CONTRACTIONS = {"numpy.matmul", "linear"}
COLLECTIVES = {"all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor",
               "all_to_all_single"}
_DT = re.compile(r"dt(?:\$\d+)?: (\w+)\[([^\]]*)\]\| ((?:S\(\d+\)(?:\[\d+\])?|R|P\(\w+\))+)")
_T = re.compile(r"t(?:\$\d+)?: \w+\[([^\]]*)\]")
_OP = re.compile(r"^([\w:.]+)\((.*)\)(?:  ->  (.*))?$")


def _transposed(shape, placements):
    """A 2-D operand read the other way round: its shape reversed, S(0) <-> S(1)."""
    swap = {"S(0)": "S(1)", "S(1)": "S(0)"}
    return shape[::-1], re.sub(r"S\([01]\)", lambda m: swap[m.group(0)], placements)


def _operand(shape, placements, contraction):
    """An operand as compared: a contraction's up to transposition (torch's
    backward multiplies transposed views, mpitensor's contracts the arrays as they
    are: the same product, read the other way round)."""
    shape = tuple(int(s) for s in shape.split(",") if s.strip())
    if contraction and len(shape) == 2:
        return min((shape, placements), _transposed(shape, placements))
    return shape, placements


def read(trace: str, source: str) -> list:
    """The trace's lines that both libraries write alike, as (depth, kind, ...)
    tuples, names in NumPy's terms. ``source`` is "torch" or "mpitensor".

    Left out: lines on plain tensors (torch's local aten ops, the local calls),
    views and copies, torch's ``_wrap_tensor_autograd``/``wait_tensor``, torch's
    redistributes that change nothing, and the Replicate bias of torch's addmm,
    which torch redistributes to Partial(sum) by a division and mpitensor's
    linear adds inside its gemm on the first rank.
    """
    names = TORCH_NAMES if source == "torch" else MPITENSOR_NAMES
    out, skip_below, linear_shift = [], None, 0
    for line in trace.splitlines():
        if not line.strip() or line.strip().startswith("#"):
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2 - 1
        text = line.strip()
        if skip_below is not None:
            if depth > skip_below:
                continue
            skip_below = None
        if text.startswith("[nn.Mod] "):
            out.append((depth, "module", text[9:]))
        elif text.startswith("-> output: "):
            out.append((depth, "output", text[11:]))
        elif text.startswith("redistribute_input [implicit] ("):
            index, change = re.match(r".*\((\d+), (.*)\)$", text).groups()
            index = int(index) - linear_shift
            if index < 0:  # torch's addmm bias
                skip_below = depth
                continue
            out.append((depth, "implicit", index, change))
        elif text.startswith("redistribute_input"):
            explicit = text.startswith("redistribute_input [explicit]")
            change = re.search(r"trace: (.*)\)$", text).group(1)
            if "->" in change:
                out.append((depth, "explicit" if explicit else "move", change))
        else:
            op = _read_op(depth, text, source, names)
            if op is None:
                skip_below = depth  # and what it nests (a view's output line)
            elif op:
                out.append(op)
                if op[1] == "op":
                    linear_shift = 1 if (source == "torch" and op[2] == "linear") else 0
    return out


def _read_op(depth, text, source, names):
    """The entry of an operation or collective line; () for a line on plain tensors
    (a local call, torch's local aten ops), None for a view."""
    m = _OP.match(text)
    if m is None:
        return ()
    name, args, result = m.groups()
    bare = name.split("::")[-1]
    if bare in COLLECTIVES:
        shapes = _T.findall(args)[:1] + _T.findall(result or "")
        return (depth, "collective", bare) + tuple(shapes)
    if not _DT.search(args):
        return ()
    name = names.get(name, name)
    if name is None:
        return None
    operands = _DT.findall(args)
    if source == "torch" and name == "linear":
        operands = operands[1:]  # addmm(bias, input, weight.T)
    contraction = name in CONTRACTIONS
    return (depth, "op", name) + tuple(
        (dtype,) + _operand(shape, pl, contraction) for dtype, shape, pl in operands)


def _blocks(entries) -> list:
    """The entries cut before each operation, module and explicit redistribute."""
    blocks = []
    for e in entries:
        if not blocks or e[1] in ("op", "module", "explicit"):
            blocks.append([])
        blocks[-1].append(e)
    return blocks


def aligned(mine: list, theirs: list) -> list:
    """``mine`` without the output lines of the operations whose output torch does
    not print (it prints one only when its dispatch takes its slow path;
    mpitensor prints one for every operation), block by block."""
    out, other = [], _blocks(theirs)
    for k, block in enumerate(_blocks(mine)):
        keep = k < len(other) and any(e[1] == "output" for e in other[k])
        out += [e for e in block if keep or e[1] != "output"]
    return out


def main() -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("run under mpiexec -n 2: the golden traces are torch's at 2 ranks")
    import torch

    traces = comm.gather(torch_trace(), root=0)
    if comm.Get_rank() == 0:
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        with open(GOLDEN, "w") as f:
            json.dump({"torch": torch.__version__, "world_size": 2, "traces": traces}, f,
                      indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
