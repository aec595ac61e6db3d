"""torch's side of the FSDP comparison tests (they import torch with
pytest.importorskip first): the stack of linear layers the tests build in
mpitensor.nn, as a torch module with the same weights, each rank's rows of the
batch, and torch's collective counts under the names of mpitensor's counters."""

from __future__ import annotations

import numpy as np

AG, RS, AR = "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"


def torch_stack(dims, source, out=3):
    """torch's float64 copy of a stack of ``Linear(dims[i], dims[i + 1])`` layers,
    each followed by tanh, then a ``Linear(dims[-1], out)`` head (``layers`` and
    ``head``), its weights those of ``source`` (an mpitensor module with its
    parameters in the same order)."""
    import torch

    class TorchStack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(dims[i], dims[i + 1])
                                               for i in range(len(dims) - 1)])
            self.head = torch.nn.Linear(dims[-1], out)

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            return self.head(x)

    model = TorchStack().double()
    copy_weights(model, source)
    return model


def copy_weights(model, source) -> None:
    """``source``'s parameters (full values) into torch ``model``'s, in order."""
    import torch

    theirs, ours = list(model.parameters()), list(source.parameters())
    assert len(theirs) == len(ours)
    with torch.no_grad():
        for p, q in zip(theirs, ours):
            p.copy_(torch.from_numpy(np.array(q)))


def rank_rows(index: int, count: int, *arrays):
    """Rows ``index`` of ``count`` equal parts of each array, as torch tensors:
    what torch's data-parallel rank ``index`` trains on."""
    import torch

    out = []
    for a in arrays:
        rows = len(a) // count
        out.append(torch.from_numpy(np.ascontiguousarray(a[index * rows:(index + 1) * rows])))
    return out


def torch_counts(mode) -> dict:
    """A torch CommDebugMode's nonzero counts keyed as mpitensor's counters."""
    out: dict = {}
    for k, n in mode.get_comm_counts().items():
        name = getattr(k, "__name__", str(k)).lower()
        key = (AG if "gather" in name else RS if "reduce_scatter" in name else
               AR if "allreduce" in name or "all_reduce" in name else name)
        if n:
            out[key] = out.get(key, 0) + n
    return out


def at_most(ours: dict, theirs: dict) -> bool:
    """Whether each of our collectives runs no more often than torch's."""
    return all(n <= theirs.get(name, 0) for name, n in ours.items() if n)
