"""``np.pad`` of DTensors: only the rows next to the edges move.

Along an axis no mesh dim shards, every rank pads its own block (NumPy on the
local array). Along an axis a mesh dim shards, the result is cut into
torch.chunk's blocks of the padded length: the input rows shift to their new
owners and each rank that holds part of a padded edge receives the few input rows
that edge is made of (none for ``constant``, the first or last row for ``edge``,
the ``width`` (+1) rows at the edge for ``symmetric`` (``reflect``), the rows at
the other end for ``wrap``), all in one exchange along that mesh dim
(``_row_exchange``); NumPy pads those rows and the rank keeps its part. The modes
covered are index maps (or a scalar constant), so padding axis by axis in any
order gives NumPy's corners, and a Partial is kept (reduced first for a nonzero
constant). Other modes, array constants, ``reflect_type='odd'`` and edges wider
than the axis (which NumPy pads by repeated reflection) go to the fallback.
"""

from __future__ import annotations


import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X

__all__ = ["pad"]

_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def _widths(name, pad_width, ndim):
    w = np.asarray(pad_width)
    if w.dtype.kind not in "iu":
        raise TypeError("`pad_width` must be of integral type.")
    try:
        w = np.broadcast_to(w, (ndim, 2))
    except ValueError:
        raise ValueError(f"{name}: pad_width cannot be broadcast to ({ndim}, 2)") from None
    if (w < 0).any():
        raise ValueError("index can't contain negative values")
    return [(int(b), int(e)) for b, e in w.tolist()]


def _edge_rows(mode, n, b, e):
    """The input rows ``[start, stop)`` each edge is made of (None: no rows)."""
    before = {"constant": None, "edge": (0, 1), "reflect": (0, b + 1),
              "symmetric": (0, b), "wrap": (n - b, n)}[mode]
    after = {"constant": None, "edge": (n - 1, n), "reflect": (n - 1 - e, n),
             "symmetric": (n - e, n), "wrap": (0, e)}[mode]
    return (before if b else None), (after if e else None)


def _fits(mode, n, b, e) -> bool:
    """Whether one reflection (or wrap) of the axis makes each edge."""
    limit = {"constant": None, "edge": None, "reflect": n - 1, "symmetric": n,
             "wrap": n}[mode]
    return limit is None or (max(b, e) <= limit and (n > 1 or mode != "reflect"))


def _pad_axis(name, a, ax, m, b, e, mode, kw):
    """``a`` padded along ``ax`` (which mesh dim ``m`` shards) by ``(b, e)``: one
    exchange along ``m``. Collective on the mesh."""
    spec = a._spec
    mesh = spec.mesh
    n = spec.shape[ax]
    total = b + n + e
    shape = spec.shape[:ax] + (total,) + spec.shape[ax + 1:]
    out_spec = DTensorSpec(mesh, spec.placements, shape, spec.dtype,
                           contiguous_strides(shape))
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    src, dst = X.bounds(n, p), X.bounds(total, p)
    transfers = X.moves(src, dst, 0, b, n)
    edges = _edge_rows(mode, n, b, e)
    regions = ((0, b), (b + n, total))
    # Each rank's buffer: its block, then the rows of each edge it holds part of.
    extra = np.zeros(p, np.int64)
    where = [[None, None] for _ in range(p)]
    for side in (0, 1):
        rows, (r0, r1) = edges[side], regions[side]
        if rows is None:
            continue
        for q in range(p):
            if max(int(dst[q]), r0) < min(int(dst[q + 1]), r1):
                at = int(dst[q + 1] - dst[q]) + int(extra[q])
                where[q][side] = at
                for c, row, off, run in X.cut(src, rows[0], rows[1] - rows[0]):
                    transfers.append((c, row, q, at + off, run))
                extra[q] += rows[1] - rows[0]
    send = X.along(a.to_local(), ax)
    mine = int(dst[me + 1] - dst[me])
    buf = np.empty((mine + int(extra[me]),) + send.shape[1:], spec.dtype)
    X.exchange(name, spec, m, send, transfers, buf)
    out, lo = buf[:mine], int(dst[me])
    rest = [(0, 0)] * (send.ndim - 1)
    for side in (0, 1):
        r0, r1 = regions[side]
        i0, i1 = max(lo, r0), min(lo + mine, r1)
        if i0 >= i1:
            continue
        if mode == "constant":
            out[i0 - lo:i1 - lo] = kw.get("constant_values", 0)
            continue
        s0, s1 = edges[side]
        rows = buf[where[me][side]:where[me][side] + s1 - s0]
        width = r1 - r0
        padded = np.pad(rows, [(width, 0) if side == 0 else (0, width)] + rest, mode)
        made = padded[:width] if side == 0 else padded[-width:]
        out[i0 - lo:i1 - lo] = made[i0 - r0:i1 - r0]
    return DTensor(np.ascontiguousarray(np.moveaxis(out, 0, ax)), out_spec)


@_registry.implements(np.pad)
def pad(array, pad_width, mode="constant", **kwargs):
    """``np.pad`` of a DTensor in the modes ``constant`` (a scalar), ``edge``,
    ``reflect``, ``symmetric`` and ``wrap``: local along axes no mesh dim shards;
    along a sharded axis only the rows next to the edges move, in one exchange
    along its mesh dim, and the result stays sharded there. Collective on the
    mesh when a padded axis is sharded.

    Example: ``np.pad(dt, 2, mode="reflect")`` of a (10,) ``[Shard(0)]`` DTensor is a
    (14,) ``[Shard(0)]`` DTensor.
    """
    name = "numpy.pad"
    if type(array) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(array).__name__}")
    if not isinstance(mode, str) or mode not in _MODES:
        raise _registry.NoRule(f"{name}: mode={mode!r} has no distributed rule")
    allowed = {"constant": {"constant_values"}, "reflect": {"reflect_type"},
               "symmetric": {"reflect_type"}}.get(mode, set())
    unsupported = set(kwargs) - allowed
    if unsupported:
        raise ValueError(f"unsupported keyword arguments for mode '{mode}': {unsupported}")
    value = kwargs.get("constant_values", 0)
    if isinstance(value, DTensor) or np.ndim(value) != 0:
        raise _registry.NoRule(f"{name}: constant_values other than a scalar have no "
                               f"distributed rule")
    if kwargs.get("reflect_type", "even") != "even":
        raise _registry.NoRule(f"{name}: reflect_type='odd' has no distributed rule")
    if isinstance(pad_width, DTensor):
        raise _registry.NoRule(f"{name}: a DTensor pad_width has no distributed rule")
    widths = _widths(name, pad_width, array.ndim)
    spec = array._spec
    X.check_movable(name, spec.dtype)
    for ax, (b, e) in enumerate(widths):
        if spec.shape[ax] == 0 and (b or e) and mode != "constant":
            raise ValueError(f"can't extend empty axis {ax} using modes other than "
                             f"'constant' or 'empty'")
    mesh = spec.mesh
    cut = {}
    for ax in range(array.ndim):
        if widths[ax] != (0, 0):
            _, m = X.sharding_mesh_dim(name, array, ax)
            if m is not None:
                if not _fits(mode, spec.shape[ax], *widths[ax]):
                    raise _registry.NoRule(f"{name}: an edge wider than the axis in mode "
                                           f"{mode!r} has no distributed rule")
                cut[ax] = m
    if mode == "constant" and bool(np.asarray(value) != 0):
        # A nonzero constant is not linear: Partials are summed first.
        array = D.relayout(name, array, [Replicate() if p.is_partial() else p
                                         for p in spec.placements])
    for ax in cut:
        array, cut[ax] = X.sharding_mesh_dim(name, array, ax)
    spec = array._spec
    local_widths = [(0, 0) if ax in cut else w for ax, w in enumerate(widths)]
    shape = tuple(n if ax in cut else n + b + e
                  for ax, (n, (b, e)) in enumerate(zip(spec.shape, widths)))
    if mesh.get_coordinate() is None:
        shape = tuple(n + b + e for n, (b, e) in zip(spec.shape, widths))
        return DTensor(np.empty((0,), spec.dtype),
                       DTensorSpec(mesh, spec.placements, shape, spec.dtype,
                                   contiguous_strides(shape)))
    # With nothing to pad locally, the exchange writes the rows into a new array: a
    # copy here would be one more pass over the data.
    if not cut or any(b or e for b, e in local_widths):
        local = np.pad(array.to_local(), local_widths, mode, **kwargs)
        array = DTensor(np.ascontiguousarray(local),
                        DTensorSpec(mesh, spec.placements, shape, spec.dtype,
                                    contiguous_strides(shape)))
    for ax, m in cut.items():
        array = _pad_axis(name, array, ax, m, *widths[ax], mode, kwargs)
    return array
