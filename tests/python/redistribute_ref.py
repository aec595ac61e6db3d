"""Ground truth for the redistribute tests, written without mpitensor's planner.

- `contribution` builds what one mesh coordinate holds for a source with Partial
  mesh dims, such that reducing the Partial dims (in any order) gives the global
  array back exactly: sum/avg dims split the value and add noise that cancels,
  max/min dims add a penalty that vanishes on one coordinate per element.
- `expected_local` is the local array a rank must hold after a redistribute.
- `torch_plan` replays torch's per-mesh-dim plan (``_gen_transform_infos``,
  torch 2.4-2.8) and prices it without padding, a lower bound of what torch moves.
- `needed_bytes` is what a Shard/Replicate change must move at least: every rank
  receives the part of its target box it does not already hold.

All functions are Local and return the same on every rank.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

from mpitensor import Partial, Replicate, Shard
from mpi_helpers import coordinates, ref_box, ref_index

PLACEMENTS = (Replicate(), Shard(0), Shard(1), Partial("sum"), Partial("max"),
              Partial("avg"))
KINDS = ("all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor",
         "all_to_all_single", "broadcast", "scatter")


def name(placements) -> str:
    return "[" + ",".join(str(p) for p in placements) + "]"


def targets_for(src_one):
    """Allowed targets on one mesh dim for source placement `src_one`."""
    out = [Replicate(), Shard(0), Shard(1)]
    return out + [src_one] if isinstance(src_one, Partial) else out


def normalize(mesh_shape, placements):
    """Size-1 mesh dims relabelled Replicate: no box depends on their label."""
    return tuple(Replicate() if n == 1 else p for n, p in zip(mesh_shape, placements))


def reduced_dims(mesh_shape, src, dst):
    """Mesh dims whose Partial goes away (size-1 ones included)."""
    return [m for m, (s, d) in enumerate(zip(src, dst)) if isinstance(s, Partial) and s != d]


def strides(shape):
    """Row-major strides in elements (torch's stride()) for from_local(stride=)."""
    out, step = [], 1
    for s in reversed(shape):
        out.append(step)
        step *= max(s, 1)
    return tuple(reversed(out))


def mixed_partials(placements) -> bool:
    """Partials of two reduce ops other than sum with avg: torch refuses them."""
    ops = {p.reduce_op for p in placements if isinstance(p, Partial)}
    return len(ops) > 1 and ops != {"sum", "avg"}


def reduce_order_case(mesh_shape, src, dst) -> bool:
    """Two Partial mesh dims of size > 1 both reduced, the outer one to Shard(d) and
    the inner one to Replicate or the same Shard(d): the family where reducing the
    last mesh dim first moves up to 1.5x torch's bytes (a planner bug, now fixed)."""
    s, d = normalize(mesh_shape, src), normalize(mesh_shape, dst)
    dims = [m for m in range(len(s)) if isinstance(s[m], Partial) and s[m] != d[m]]
    return any(isinstance(d[a], Shard) and d[b] in (Replicate(), d[a])
               for a, b in itertools.combinations(dims, 2))


# ---- contributions and the expected local arrays ---------------------------------


def contribution(base: np.ndarray, mesh_shape, coord, placements) -> np.ndarray:
    """int64 array of the global shape that mesh coordinate `coord` contributes.

    `base` is the int64 global array. Reducing every Partial(sum|avg|max|min) mesh
    dim of the result, in any order, yields `base` exactly (integer arithmetic)."""
    base = np.asarray(base, dtype=np.int64)
    idx = np.arange(base.size, dtype=np.int64).reshape(base.shape)
    ops = {m: p.reduce_op for m, p in enumerate(placements) if isinstance(p, Partial)}
    if "product" in ops.values():
        raise ValueError("contribution() does not build Partial(product) sources")
    sums = [m for m, op in ops.items() if op in ("sum", "avg")]
    out = base * int(all(coord[m] == 0 for m in sums))
    noisy = [m for m in sums if mesh_shape[m] >= 2]
    if noisy:
        sign = math.prod({0: 1, 1: -1}.get(coord[m], 0) for m in noisy)
        out = out + sign * (idx % 5 + 1)
    for m, op in ops.items():
        if op == "avg":
            out = out * mesh_shape[m]
    for m, op in ops.items():
        if op in ("max", "min"):
            away = np.abs(coord[m] - idx % mesh_shape[m])
            out = out - 3 * away if op == "max" else out + 3 * away
    return out


def reduce_stack(values: np.ndarray, op: str, axis: int) -> np.ndarray:
    if op == "sum":
        return values.sum(axis=axis)
    if op == "avg":
        total = values.sum(axis=axis)
        n = values.shape[axis]
        assert (total % n == 0).all(), "contributions must average exactly"
        return total // n
    if op == "max":
        return values.max(axis=axis)
    if op == "min":
        return values.min(axis=axis)
    raise ValueError(op)


def reduced_value(base, mesh_shape, coord, src, dims) -> np.ndarray:
    """int64: the contributions of `coord`'s group along mesh dims `dims`, reduced."""
    dims = list(dims)
    stack = []
    for sub in itertools.product(*(range(mesh_shape[m]) for m in dims)):
        c = list(coord)
        for m, k in zip(dims, sub):
            c[m] = k
        stack.append(contribution(base, mesh_shape, c, src))
    values = np.stack(stack).reshape(tuple(mesh_shape[m] for m in dims) + np.shape(base))
    for axis in reversed(range(len(dims))):
        values = reduce_stack(values, src[dims[axis]].reduce_op, axis)
    return values


def source_local(base, mesh_shape, coord, src, dtype) -> np.ndarray:
    full = contribution(base, mesh_shape, coord, src)
    return np.array(full[ref_index(full.shape, mesh_shape, coord, src)], dtype=dtype, order="C")


def expected_local(base, mesh_shape, coord, src, dst, dtype) -> np.ndarray:
    value = reduced_value(base, mesh_shape, coord, src, reduced_dims(mesh_shape, src, dst))
    return np.array(value[ref_index(value.shape, mesh_shape, coord, dst)], dtype=dtype)


# ---- boxes --------------------------------------------------------------------------


def numel(shape) -> int:
    return math.prod(shape)


def overlap(a, b) -> int:
    """Elements in the intersection of two (shape, offset) boxes."""
    n = 1
    for (sa, oa), (sb, ob) in zip(zip(*a), zip(*b)):
        n *= max(0, min(oa + sa, ob + sb) - max(oa, ob))
    return n


def needed_elements(shape, mesh_shape, src, dst) -> int:
    """Sum over ranks of the target-box elements the rank does not already hold."""
    total = 0
    for c in coordinates(mesh_shape):
        s, t = ref_box(shape, mesh_shape, c, src), ref_box(shape, mesh_shape, c, dst)
        total += numel(t[0]) - overlap(s, t)
    return total


# ---- torch's plan -------------------------------------------------------------------


def step_kind(a, b) -> str:
    if isinstance(a, Shard) and isinstance(b, Replicate):
        return "all_gather_into_tensor"
    if isinstance(a, Shard) and isinstance(b, Shard):
        return "all_to_all_single"
    if isinstance(a, Replicate) and isinstance(b, Shard):
        return "chunk"
    if isinstance(a, Partial) and isinstance(b, Replicate):
        return "all_reduce"
    if isinstance(a, Partial) and isinstance(b, Shard):
        return "reduce_scatter_tensor"
    raise ValueError(f"torch has no step from {a} to {b}")


def torch_steps(mesh_shape, src, dst):
    """torch's transform infos: [(mesh_dim, from, to)]. A Shard target misaligned
    with the shards before it is first replicated (last mesh dim first), then the
    remaining changes run first mesh dim first."""
    cur, tgt, steps = list(src), list(dst), []
    nshards = math.prod(n for n, p in zip(mesh_shape, src) if isinstance(p, Shard))
    if nshards > 1:
        for m in reversed(range(len(cur))):
            c, t = cur[m], tgt[m]
            if isinstance(t, Shard):
                before_cur = [i for i in range(m) if cur[i] == Shard(t.dim)]
                before_tgt = [i for i in range(m) if tgt[i] == Shard(t.dim)]
                if before_cur != before_tgt:
                    t = Replicate()
            if c != t:
                steps.append((m, c, t))
                cur[m] = t
    for m in range(len(cur)):
        if cur[m] != tgt[m]:
            steps.append((m, cur[m], tgt[m]))
            cur[m] = tgt[m]
    return steps


def torch_plan(shape, mesh_shape, src, dst, itemsize):
    """(collective calls on mesh dims of size > 1, bytes received summed over all
    ranks) of torch's plan, without padding; all-reduce priced by the ring model
    (2 (G-1)/G of the buffer per rank), as mpitensor counts it."""
    cur, calls, nbytes = list(src), 0, Fraction(0)
    for m, a, b in torch_steps(mesh_shape, src, dst):
        nxt = list(cur)
        nxt[m] = b
        kind, g = step_kind(a, b), mesh_shape[m]
        if kind != "chunk" and g > 1:
            calls += 1
        for c in coordinates(mesh_shape):
            s, t = ref_box(shape, mesh_shape, c, cur), ref_box(shape, mesh_shape, c, nxt)
            if kind == "all_gather_into_tensor":
                nbytes += numel(t[0]) - numel(s[0])
            elif kind == "all_to_all_single":
                nbytes += numel(t[0]) - overlap(s, t)
            elif kind == "all_reduce":
                nbytes += Fraction(2 * (g - 1) * numel(s[0]), g)
            elif kind == "reduce_scatter_tensor":
                nbytes += numel(s[0]) - numel(t[0])
        cur = nxt
    return calls, nbytes * itemsize


# ---- the counts fixed exactly -----------------------------------------------------


def single_step(mesh_shape, src, dst):
    """The one collective that does this change, as {kind: 1} ({} for a local cut
    or no change), or None when the change is not one valid step on one mesh dim
    (more than one mesh dim of size > 1 changes, or a touched tensor dim is sharded
    again by a later mesh dim)."""
    s, d = normalize(mesh_shape, src), normalize(mesh_shape, dst)
    changed = [m for m in range(len(s)) if s[m] != d[m]]
    if not changed:
        return {}
    if len(changed) > 1:
        return None
    m = changed[0]
    a, b = s[m], d[m]

    def free(dim):  # no later mesh dim shards tensor dim `dim`
        return not any(s[k] == Shard(dim) for k in range(m + 1, len(s)))

    kind = step_kind(a, b)
    touched = ([a.dim] if isinstance(a, Shard) else []) + ([b.dim] if isinstance(b, Shard) else [])
    if not all(free(dim) for dim in touched):
        return None
    return {} if kind == "chunk" else {kind: 1}


def single_step_bytes(shape, mesh_shape, src, dst, itemsize):
    """Bytes sent summed over all ranks for a `single_step` change (all-reduce:
    the ring model, 2 (G-1) times the buffer per group)."""
    s, d = normalize(mesh_shape, src), normalize(mesh_shape, dst)
    changed = [m for m in range(len(s)) if s[m] != d[m]]
    if not changed:
        return 0
    m = changed[0]
    kind = step_kind(s[m], d[m])
    total = Fraction(0)
    for c in coordinates(mesh_shape):
        a, b = ref_box(shape, mesh_shape, c, src), ref_box(shape, mesh_shape, c, dst)
        if kind == "all_reduce":
            g = mesh_shape[m]
            total += Fraction(2 * (g - 1) * numel(a[0]) * itemsize, g)
        elif kind == "reduce_scatter_tensor":
            total += (numel(a[0]) - numel(b[0])) * itemsize
        else:
            total += (numel(b[0]) - overlap(a, b)) * itemsize
    assert total.denominator == 1
    return int(total)
