"""assert_close and assert_equal for DTensors: compare shard by shard, fail together.

Each rank compares its own shard with the matching part of the expected value, so
nothing is gathered; then one small summary per rank travels over the mesh, and
every rank raises the same AssertionError, naming global indices and ranks.
"""

from __future__ import annotations

import pickle

import numpy as np

from .. import device_mesh as _device_mesh
from .._allgather_bytes import allgather_bytes
from .._dtensor import DTensor
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Replicate

__all__ = ["assert_close", "assert_equal"]

# torch.testing.assert_close's defaults, by the dtype of `actual`: (rtol, atol).
_TOLERANCES = {
    np.dtype(np.float16): (1e-3, 1e-5),
    np.dtype(np.float32): (1.3e-6, 1e-5),
    np.dtype(np.float64): (1e-7, 1e-7),
    np.dtype(np.complex64): (1.3e-6, 1e-5),
    np.dtype(np.complex128): (1e-7, 1e-7),
}
_SHOWN = 5  # mismatching elements listed in a message


def assert_close(actual, expected, *, rtol=None, atol=None, equal_nan=False,
                 check_dtype=True, msg=None) -> None:
    """Asserts ``|actual - expected| <= atol + rtol * |expected|`` element-wise.

    ``actual`` and ``expected`` are DTensors, ndarrays or scalars (a 0-d expected
    value is compared with every element). A DTensor is compared shard by shard:
    each rank checks its local data against the same region of the other operand,
    which is redistributed to match when it is a DTensor too (a Partial is reduced
    first). Collective on the DTensor's mesh: every member raises the same
    AssertionError when any rank finds a difference, naming the global indices,
    the ranks and the placements; ranks outside the mesh return at once. Local
    when neither operand is a DTensor.

    Defaults follow ``torch.testing.assert_close``: ``rtol``/``atol`` by dtype
    (float64: 1e-7 and 1e-7, float32: 1.3e-6 and 1e-5, float16: 1e-3 and 1e-5,
    exact otherwise); give both or neither. ``check_dtype`` compares the dtypes
    when ``expected`` has one (a Python scalar or list takes ``actual``'s).
    ``msg`` is added to the message.

    Example (``mpiexec -n 4``)::

        >>> mesh = init_device_mesh("cpu", (4,))
        >>> x = distribute_tensor(np.arange(8.0), mesh, [Shard(0)])
        >>> assert_close(np.sqrt(x) ** 2, np.arange(8.0))
        >>> assert_close(x + 1, np.arange(8.0))
        AssertionError: Not equal to tolerance rtol=1e-07, atol=1e-07
        ...
        Mismatched elements: 8 / 8 (100%)
        ...
          global index (0,) on rank 0: actual 1.0, expected 0.0
    """
    # pytest leaves these frames out of a failure's traceback: the report stops at
    # the test's own line, the same on every rank, so the plugin shows it once.
    __tracebackhide__ = True
    if (rtol is None) != (atol is None):
        raise ValueError("assert_close: give both rtol and atol, or neither")
    if rtol is None:
        dtype = actual.dtype if isinstance(actual, DTensor) else np.result_type(actual)
        rtol, atol = _TOLERANCES.get(np.dtype(dtype), (0, 0))
    _compare(actual, expected, rtol, atol, bool(equal_nan), check_dtype,
             f"Not equal to tolerance rtol={rtol:g}, atol={atol:g}", msg)


def assert_equal(actual, expected, *, check_dtype=True, msg=None) -> None:
    """Asserts that ``actual`` and ``expected`` are equal element-wise (NaNs in the
    same places count as equal, as in ``numpy.testing.assert_array_equal``).

    Same operands and messages as :func:`assert_close`; collective on the mesh like
    it (every rank raises together).

    Example (``mpiexec -n 2``)::

        >>> mesh = init_device_mesh("cpu", (2,))
        >>> x = distribute_tensor(np.arange(6).reshape(2, 3), mesh, [Shard(1)])
        >>> assert_equal(x.redistribute(mesh, [Replicate()]), x)
        >>> assert_equal(x.T, np.arange(6).reshape(2, 3))
        AssertionError: Arrays are not equal
        ...
    """
    __tracebackhide__ = True
    _compare(actual, expected, 0, 0, True, check_dtype, "Arrays are not equal", msg)


# -- one comparison, two callers ----------------------------------------------------

def _compare(actual, expected, rtol, atol, equal_nan, check_dtype, head, msg) -> None:
    __tracebackhide__ = True
    actual, expected = _as_local(actual), _as_local(expected)
    lead = actual if isinstance(actual, DTensor) else expected
    if not isinstance(lead, DTensor):
        mine = _local_verdict(np.asarray(actual), expected, None, rtol, atol,
                              equal_nan, check_dtype)
        _raise_if_failed([mine], actual, expected, head, msg)
        return
    mesh = lead.device_mesh
    if mesh.get_coordinate() is None:
        return
    # Partial values mean nothing element by element: reduce them, keep the shards.
    placements = tuple(Replicate() if p.is_partial() else p for p in lead.placements)
    a = _aligned(actual, lead, placements)
    e = _aligned(expected, lead, placements)
    mine = _local_verdict(a, e, (lead, placements), rtol, atol, equal_nan, check_dtype)
    _raise_if_failed(_allgather_over_mesh(mine, mesh), actual, expected, head, msg)


def _as_local(x):
    """A DTensor on this process's local mesh is a local array that records for
    autograd (what ``full_tensor()`` of a tensor that requires grad gives in grad
    mode): compared as that array, as torch compares its plain tensor."""
    if isinstance(x, DTensor) and _device_mesh.is_local_mesh(x.device_mesh):
        return x.detach().to_local()
    return x


def _aligned(x, lead: DTensor, placements):
    """`x` as this rank's shard under `placements` when it is a DTensor (which may
    communicate); arrays and scalars are cut later, per rank."""
    if not isinstance(x, DTensor):
        return x
    x = x.detach()  # compared as data, also when it requires grad
    if x.shape != lead.shape:
        return _Shard(None, x.shape, x.dtype)
    if x.device_mesh == lead.device_mesh:
        return _Shard(x.redistribute(x.device_mesh, placements).to_local(), x.shape, x.dtype)
    ranks = [sorted(m.mesh.ravel().tolist()) for m in (x.device_mesh, lead.device_mesh)]
    if ranks[0] != ranks[1]:
        raise ValueError(
            f"cannot compare DTensors on meshes of different ranks: {lead.device_mesh} "
            f"and {x.device_mesh}")
    return x.full_tensor()


class _Shard:
    """A DTensor operand reduced to this rank's shard, with its global metadata
    (no data when its global shape differs: only the metadata is reported)."""

    def __init__(self, local, shape, dtype):
        self.local, self.shape, self.dtype = local, shape, dtype


def _local_verdict(a, e, where, rtol, atol, equal_nan, check_dtype) -> dict:
    """This rank's summary: metadata problems, or the mismatches in its shard.
    Never raises, so that every rank reaches the exchange of verdicts."""
    verdict = {"problem": None, "count": 0, "size": 0, "first": [], "max_abs": None,
               "max_rel": None, "primary": True, "rank": None, "coordinate": None}
    try:
        _fill_verdict(verdict, a, e, where, rtol, atol, equal_nan, check_dtype)
    except Exception as exc:  # noqa: BLE001 - reported on every rank, then raised
        verdict["problem"] = f"{type(exc).__name__}: {exc}"
    return verdict


def _fill_verdict(verdict, a, e, where, rtol, atol, equal_nan, check_dtype) -> None:
    offset = ()
    if where is not None:
        lead, placements = where
        mesh = lead.device_mesh
        coord = mesh.get_coordinate()
        verdict["rank"], verdict["coordinate"] = mesh.get_rank(), coord
        verdict["primary"] = all(c == 0 for c, p in zip(coord, placements) if not p.is_shard())
        gshape, gdtype = lead.shape, lead.dtype
        shape, offset = compute_local_shape_and_global_offset(gshape, mesh, placements)
        box = tuple(slice(o, o + s) for o, s in zip(offset, shape))
    else:
        gshape, gdtype, box = np.shape(a), np.asarray(a).dtype, None
    problem = (_metadata_problem(a, gshape, gdtype, check_dtype)
               or _metadata_problem(e, gshape, gdtype, check_dtype))
    if problem:
        verdict["problem"] = problem
        return
    a, e = (_cut(x, box) for x in (a, e))
    bad = ~_close(a, e, rtol, atol, equal_nan)
    verdict["size"] = int(a.size)
    if not bad.any():
        return
    _describe_mismatches(verdict, a, e, bad, offset)


def _metadata_problem(x, gshape, gdtype, check_dtype) -> str | None:
    if isinstance(x, (_Shard, np.ndarray, np.generic)):
        shape, dtype = x.shape, x.dtype
    elif x is None or isinstance(x, (str, bytes, dict, set)):
        return f"cannot compare with a {type(x).__name__}"
    else:
        shape, dtype = np.shape(x), None
    if shape != tuple(gshape) and shape != ():
        return f"shapes {tuple(gshape)}, {shape} mismatch"
    if check_dtype and dtype is not None and np.dtype(dtype) != gdtype:
        return f"dtypes {gdtype}, {np.dtype(dtype)} mismatch"
    return None


def _cut(x, box) -> np.ndarray:
    """This rank's region of an operand: a shard as it is, a 0-d value whole."""
    if isinstance(x, _Shard):
        return x.local
    x = np.asarray(x)
    return x if box is None or x.ndim == 0 else x[box]


def _close(a, e, rtol, atol, equal_nan) -> np.ndarray:
    a, e = np.broadcast_arrays(a, np.asarray(e))
    if a.dtype.kind not in "fc" and e.dtype.kind not in "fc":
        if rtol == 0 and atol == 0 or a.dtype.kind == "b":
            return np.asarray(a == e)
        a, e = a.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan)


def _describe_mismatches(verdict, a, e, bad, offset) -> None:
    a, e = np.broadcast_arrays(a, np.asarray(e))
    where = np.flatnonzero(bad)
    verdict["count"] = int(where.size)

    def index(flat):
        local = np.unravel_index(int(flat), a.shape)
        return tuple(int(i) + int(o) for i, o in zip(local, offset or (0,) * a.ndim))

    verdict["first"] = [(index(i), a.flat[i].item(), e.flat[i].item()) for i in where[:_SHOWN]]
    if a.dtype.kind not in "iufc" or e.dtype.kind not in "iufc":
        return  # booleans have no difference to report
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        av, ev = a.ravel()[where], e.ravel()[where]
        diff = np.abs(av.astype(np.result_type(av, ev, np.float64)) - ev)
        rel = diff / np.abs(ev)
    for key, values in (("max_abs", diff), ("max_rel", rel)):
        finite = np.where(np.isfinite(values), values, -np.inf)
        k = int(np.argmax(finite))
        if np.isfinite(finite[k]):
            verdict[key] = (float(finite[k]), index(where[k]))


def _allgather_over_mesh(item, mesh) -> list:
    """Every member's `item`, on every member: one all-gather per mesh dim, so only
    members of the mesh take part (ranks of its communicator outside it do not)."""
    items = [item]
    for d in reversed(range(mesh.ndim)):
        blobs = allgather_bytes(mesh, d, pickle.dumps(items))
        items = [x for blob in blobs for x in pickle.loads(blob)]
    return sorted(items, key=lambda v: v["rank"])


# -- the message -------------------------------------------------------------------

def _raise_if_failed(verdicts, actual, expected, head, msg) -> None:
    __tracebackhide__ = True
    failed = [v for v in verdicts if v["problem"] or v["count"]]
    if not failed:
        return
    lines = [head, ""] + ([str(msg)] if msg else [])
    lines += [f"ACTUAL: {_describe(actual)}", f"DESIRED: {_describe(expected)}"]
    problems = {v["problem"] for v in failed if v["problem"]}
    if problems:
        lines += _problem_lines(failed, problems)
    else:
        lines += _mismatch_lines(verdicts, failed)
    raise AssertionError("\n".join(lines))


def _describe(x) -> str:
    if isinstance(x, DTensor):
        return (f"DTensor of shape {x.shape}, dtype {x.dtype}, placements "
                f"{list(x.placements)} on {x.device_mesh!r}")
    if isinstance(x, np.ndarray):
        return f"ndarray of shape {x.shape}, dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"[:200]


def _where(v) -> str:
    return "" if v["rank"] is None else f" on rank {v['rank']} (mesh coordinate {v['coordinate']})"


def _problem_lines(failed, problems) -> list:
    if len(problems) == 1 and len(failed) == len([v for v in failed if v["problem"]]):
        return [f"({problems.pop()})"]
    return [f"({v['problem']}){_where(v)}" for v in failed if v["problem"]]


def _mismatch_lines(verdicts, failed) -> list:
    total = sum(v["size"] for v in verdicts if v["primary"])
    unique = sum(v["count"] for v in verdicts if v["primary"])
    share = 100.0 * unique / total if total else 0.0
    lines = [f"Mismatched elements: {unique} / {total} ({share:.3g}%)"]
    if unique == 0:
        lines = ["Replicas differ: the first replica of every shard matches, other replicas do not"]
    elif unique < sum(v["count"] for v in failed):
        lines[-1] += ", each element counted once (replicas are counted by rank below)"
    for key, what in (("max_abs", "absolute"), ("max_rel", "relative")):
        best = max((v for v in failed if v[key]), key=lambda v: v[key][0], default=None)
        if best is not None:
            value, index = best[key]
            lines.append(f"Max {what} difference among violations: {value:.8g}"
                         f" at global index {index}{_where(best)}")
    if failed[0]["rank"] is not None:
        lines.append("Mismatches by rank: " + ", ".join(
            f"rank {v['rank']}: {v['count']} of {v['size']}" for v in failed))
    lines.append("First mismatches:")
    shown: dict = {}
    # First replicas first, and each global index once.
    for v in sorted(failed, key=lambda v: not v["primary"]):
        for index, a, e in v["first"]:
            if index not in shown and len(shown) < _SHOWN:
                shown[index] = f"  global index {index}{_where(v)}: actual {a!r}, expected {e!r}"
    return lines + list(shown.values())
