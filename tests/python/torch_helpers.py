"""torch.distributed on gloo beside the MPI job, for the optional comparison tests
(they import torch with pytest.importorskip first), and what they share: torch's
placements of ours, a Partial's local parts, and a counter of the collectives
torch runs with the same byte model as mpitensor's counters."""

from __future__ import annotations

import numpy as np

from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from mpitensor.testing import init_torch_gloo


def init_gloo():
    """torch.distributed over gloo with one process per MPI rank, initialised once."""
    return init_torch_gloo()


def parse(text):
    """'S0' / 'R' / 'Psum' -> (mpitensor placement, torch placement)."""
    from torch.distributed.tensor import Partial as TP, Replicate as TR, Shard as TS
    if text == "R":
        return Replicate(), TR()
    if text[0] == "S":
        return Shard(int(text[1:])), TS(int(text[1:]))
    return Partial(text[1:]), TP(text[1:])


def torch_placements(pls):
    """torch's placements of mpitensor's (Shard, Replicate, Partial)."""
    from torch.distributed.tensor import Partial as TP, Replicate as TR, Shard as TS
    return [TS(p.dim) if p.is_shard() else TP(p.reduce_op) if p.is_partial() else TR()
            for p in pls]


def local_parts(g, mesh, pls):
    """This rank's local array of global `g` under `pls`: its shard, and on each
    Partial mesh dim a part such that the reduction gives the value back."""
    plain = [Replicate() if p.is_partial() else p for p in pls]
    local = distribute_tensor(g, mesh, plain, src_data_rank=None).to_local().copy()
    coord = mesh.get_coordinate()
    for m, p in enumerate(pls):
        if not p.is_partial():
            continue
        n, first = mesh.shape[m], coord[m] == 0
        if p.reduce_op == "sum":
            local = local - (n - 1) * 0.5 if first else np.full_like(local, 0.5)
        elif p.reduce_op == "avg":
            local = local + (n - 1) * 0.25 if first else local - 0.25
        elif p.reduce_op == "max":
            local = local if first else local - 1.5
        elif p.reduce_op == "min":
            local = local if first else local + 1.5
    return np.ascontiguousarray(local)


def pair_of(g, mesh, tmesh, texts, requires_grad=False):
    """The DTensor of global value `g` placed by `texts` ('S0', 'R', 'Psum', one per
    mesh dim) in mpitensor and in torch, from the same local arrays; leaves that
    require grad with `requires_grad`."""
    import torch
    from torch.distributed.tensor import DTensor as TD
    pls = [parse(t) for t in texts]
    mpl, tpl = [p[0] for p in pls], [p[1] for p in pls]
    local = local_parts(g, mesh, mpl)
    stride = tuple(int(s) // g.itemsize for s in np.empty(g.shape).strides)
    ours = DTensor.from_local(local, mesh, mpl, shape=g.shape, stride=stride)
    theirs = TD.from_local(torch.from_numpy(local.copy()), tmesh, tpl,
                           shape=torch.Size(g.shape), stride=stride)
    if requires_grad:
        ours, theirs = ours.requires_grad_(), theirs.requires_grad_()
    return ours, theirs


def torch_bytes_mode():
    """A dispatch mode that counts the functional collectives torch runs (forward
    and backward) and adds up the payload this rank delivers in them, by the same
    model as mpitensor's counters: an all-reduce of N bytes over G ranks 2(G-1)N/G,
    a reduce-scatter (G-1)N/G, an all-gather its input times G-1, an all-to-all
    what leaves the rank. ``calls``, ``bytes`` and ``counts`` (per collective)."""
    import torch
    from torch.distributed.distributed_c10d import _resolve_process_group
    from torch.distributed.tensor import DTensor as TD
    from torch.utils._python_dispatch import TorchDispatchMode

    def group(name):
        pg = _resolve_process_group(name)
        return pg.size(), pg.rank()

    class Bytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0.0
            self.calls = 0
            self.counts: dict = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, TD) for t in types):
                return NotImplemented  # DTensor decides; its collectives come back here
            out = func(*args, **(kwargs or {}))
            if func.namespace != "_c10d_functional":
                return out
            name = func._overloadpacket.__name__
            t = args[0]
            n = t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
            if name == "all_reduce":
                g, _ = group(args[2])
                self.bytes += 2 * (g - 1) * n / g
            elif name == "reduce_scatter_tensor":
                g, _ = group(args[3])
                self.bytes += (g - 1) * n / g
            elif name == "all_gather_into_tensor":
                g, _ = group(args[2])
                self.bytes += (g - 1) * n
            elif name == "all_to_all_single":
                g, me = group(args[3])
                splits = args[2]
                row = n / t.shape[0] if t.dim() and t.shape[0] else 0
                mine = splits[me] * row if splits else n / g
                self.bytes += n - mine
            else:
                return out
            self.calls += 1
            self.counts[name] = self.counts.get(name, 0) + 1
            return out

    return Bytes()
