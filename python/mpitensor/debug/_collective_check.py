"""Collective mismatch detection: before each collective, the ranks of the mesh
agree on what they are about to call, so that a rank calling something else, or
skipping a collective, is an error message on every rank instead of a hang or
silently mixed data.

The agreement runs on a 1-D extension mesh of its own per mesh (made on the first
check, by the mesh's members only), so check messages never pair with data
messages: a rank that skipped a collective meets the others' check of that
collective with its check of the next one, and both sides see the mismatch. Its
calls go through the extension, as every collective of the package does, so the
collective watchdog (MPITENSOR_TIMEOUT) sees a check that waits forever.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from .. import _modes, _comm
from .._allgather_bytes import allgather_bytes
from .._fingerprint import fingerprint

__all__ = ["set_collective_checks", "collective_checks_enabled"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_check_meshes: dict = {}


def set_collective_checks(enabled: bool) -> None:
    """Turns collective mismatch detection on or off (off by default; on from the
    start with ``MPITENSOR_CHECK=1``). Local, but every rank must choose the same.

    While on, before each collective (redistribute, an operation's input
    redistribution, distribute_tensor, from_local's run_check) the ranks of the mesh
    agree on a fingerprint of the operation, the placements, the global shape, the
    dtype and the call site (file:line of the first caller outside mpitensor).
    When they differ, every rank raises a RuntimeError that names the ranks of
    each variant and what they called. Costs one small allreduce per collective.

    Example::

        >>> mpitensor.debug.set_collective_checks(True)
        >>> if mesh.get_rank() == 0:
        ...     dt.redistribute(mesh, [Shard(1)])   # the others run line 5
        ... else:
        ...     dt.redistribute(mesh, [Replicate()])
        RuntimeError: collective mismatch on DeviceMesh('cpu', [0, 1]): rank 0 called ...
    """
    _modes.set_checks(enabled)


def collective_checks_enabled() -> bool:
    """Whether collective mismatch detection is on. Local.

    Example: ``set_collective_checks(True); assert collective_checks_enabled()``.
    """
    return _modes.state.checks


def call_site() -> str:
    """file:line of the innermost caller outside the mpitensor package."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _check_mesh(mesh):
    """The ``_comm.Mesh`` of the mesh's members, in row-major mesh order, that carries
    its checks: made on first use, collective on the members only (a rank outside
    the mesh never checks). ``_comm.Mesh`` duplicates the communicator it is given, so
    the parent's and the group's serve as they are."""
    key = mesh._key()
    bare = _check_meshes.get(key)
    if bare is None:
        parent = mesh._comm
        ranks = [int(r) for r in mesh.mesh.ravel()]
        members = np.arange(len(ranks), dtype=np.intc)
        if ranks == list(range(parent.Get_size())):
            bare = _comm.Mesh(parent, (len(ranks),), members)
        else:
            group = parent.Get_group().Incl(ranks)
            comm = parent.Create_group(group)
            group.Free()
            bare = _comm.Mesh(comm, (len(ranks),), members)
            comm.Free()
        _check_meshes[key] = bare
    return bare


def agree(what: str, mesh) -> None:
    """Collective on the mesh: RuntimeError on every rank unless every rank is
    about to call the same ``what`` from the same call site."""
    if mesh._coordinate is None or mesh.size() == 1:
        return
    bare = _check_mesh(mesh)
    text = f"{what} at {call_site()}"
    try:
        # The agreement primitive: one small all-reduce, and every member raises
        # the same ValueError when the digests differ (every rank passes ok=True,
        # so that is the only ValueError it can give).
        _comm.agree(bare, True, fingerprint(text), "collective mismatch")
        return
    except ValueError:
        pass
    texts = [b.decode() for b in allgather_bytes(bare, 0, text.encode())]
    raise RuntimeError(mismatch_message(mesh, texts))


def mismatch_message(mesh, texts) -> str:
    """Names, in order of first rank, each variant and the mesh ranks that called it."""
    ranks = [int(r) for r in mesh.mesh.ravel()]
    groups: dict = {}
    for i, text in enumerate(texts):
        groups.setdefault(text, []).append(ranks[i])
    parts = []
    for text, who in groups.items():
        label = "rank" if len(who) == 1 else "ranks"
        parts.append(f"{label} {', '.join(map(str, who))} called {text}")
    return (f"collective mismatch on {mesh!r}: " + "; ".join(parts) + ". Every rank of "
            "the mesh must make the same collective calls in the same order.")


def configure_from_environment() -> None:
    """MPITENSOR_CHECK=1 turns the checks on from the start (mpitensor's import)."""
    value = os.environ.get("MPITENSOR_CHECK", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"MPITENSOR_CHECK must be 0 or 1, got {value!r}")
    set_collective_checks(value == "1")


_modes.register_checker(agree)
