"""The checks before a state dict loads (Module's and Optimizer's): every rank
checks its own values, then the ranks agree once per mesh, so that a state dict
that is wrong on one rank raises on every rank instead of leaving the others in
the next value's redistribution."""

from __future__ import annotations

import numpy as np

from .. import _comm
from .._dtensor import DTensor
from .._fingerprint import fingerprint


def _same_ranks(a, b) -> bool:
    """Meshes of the same ranks in the same shape, whatever their dim names."""
    return a == b or (a._comm.handle == b._comm.handle and a.mesh.shape == b.mesh.shape
                      and np.array_equal(a.mesh, b.mesh))


def _load_problem(key: str, target, value) -> str | None:
    """Why ``value`` cannot load into ``target`` (torch's words for a size
    mismatch), or None. Local: every rank asks before any rank starts a collective
    of the load, so that the ranks raise together instead of one raising while the
    others wait in the next key's redistribution."""
    got = tuple(value.shape) if isinstance(value, DTensor) else np.shape(value)
    want = tuple(target.shape)
    if got != want:
        return (f"size mismatch for {key}: copying a param with shape {got} from "
                f"checkpoint, the shape in current model is {want}.")
    dtype = value.dtype if isinstance(value, (DTensor, np.ndarray)) else \
        np.asarray(value).dtype
    if not np.can_cast(dtype, target.dtype, casting="same_kind"):
        return (f"dtype mismatch for {key}: copying a param of dtype {dtype} from "
                f"checkpoint, the dtype in current model is {target.dtype}.")
    if (isinstance(target, DTensor) and any(p.is_partial() for p in target.placements)
            and not (isinstance(value, DTensor)
                     and _same_ranks(value.device_mesh, target.device_mesh))):
        return f"{key} is a Partial DTensor: load a DTensor on its mesh into it."
    return None


def _load_layout(value: DTensor) -> tuple:
    """What of a loaded DTensor decides the load's collectives (its shape, dtype,
    placements and ranks), so that the ranks can check it is the same on all of
    them; a plain value loads without communication."""
    return (tuple(value.shape), value.dtype.str, tuple(value.placements),
            value.device_mesh.mesh.tolist())


def _agree_load(meshes, errors: list, layout, head: str, kind: type,
                mismatch: str | None = None) -> None:
    """One agreement per mesh (each mesh once, in the order given, which is the
    same on every rank) on the local ``errors`` and the ``layout`` of the values:
    every rank raises ``kind`` with ``head`` and the first failing rank's errors,
    or with ``head`` and ``mismatch`` (a sentence on the DTensors' layout by
    default) when the layouts differ. No communication when no mesh is given
    (nothing is distributed)."""
    error = head + "\n\t".join(errors) if errors else None
    seen = []
    mine = fingerprint(layout)
    for mesh in meshes:
        if any(_same_ranks(mesh, m) for m in seen):
            continue
        seen.append(mesh)
        try:
            _comm.agree(mesh, error is None, mine, error or head + (mismatch or (
                "the state dict's DTensors (their keys, shapes, dtypes or "
                "placements) differ across the ranks of the mesh; every rank must load "
                "the same layout.")), kind)
        except Exception as agreed:  # noqa: BLE001 - the same on every rank of mesh
            # Go on to the other meshes with it, so that no rank of those waits
            # for this one.
            error = str(agreed)
    if error is not None:
        raise kind(error)
