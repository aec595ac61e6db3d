"""One rank looks, every rank learns: file-system checks made by the mesh's first
rank and broadcast, so that every rank raises the same exception or none does;
the path every rank passed, checked to be the same; and steps that can fail on
some ranks only (allocations), agreed on before the collective that follows. The
checks go through the one agreement primitive, ``_comm.agree``.

A file system may answer differently on different ranks (caches, races with other
jobs); when each rank looked for itself, one could raise while the others went on
into a collective and waited forever.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import _comm
from .._fingerprint import fingerprint

# Exceptions that may travel, by index; anything else travels as OSError.
_HEAD = 16  # int64 kind and int64 payload length
_KINDS = (None, FileNotFoundError, IsADirectoryError, NotADirectoryError,
          PermissionError, FileExistsError, OSError, ValueError, TypeError, KeyError)


def _bcast_from_first(mesh, buf: np.ndarray) -> None:
    """Collective on the mesh: ``buf`` from coordinate (0, ..., 0) to every rank,
    one mesh dim after another."""
    for d in range(mesh.ndim):
        _comm.bcast(mesh, buf, d)


def _kind_of(e: Exception) -> int:
    """The index of the most specific travelling type that ``e`` is."""
    for i, k in enumerate(_KINDS[1:], 1):
        if type(e) is k:
            return i
    return next((i for i, k in enumerate(_KINDS[1:], 1) if isinstance(e, k)),
                _KINDS.index(OSError))


def _outcome(produce) -> tuple[int, bytes]:
    try:
        return 0, bytes(produce())
    except Exception as e:  # noqa: BLE001 - every kind travels to the other ranks
        # str() of a KeyError quotes its message; the message itself travels
        text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        return _kind_of(e), text.encode("utf-8")


def first_rank(mesh, produce: Callable[[], bytes], cap: int = 4096, *,
               outsiders: bool = False) -> bytes:
    """Collective on the mesh. The bytes that ``produce()`` returns on the mesh's
    first rank, on every rank; or the exception it raised there, raised on every
    rank with the same type and message. Ranks outside the mesh, which take part in
    no collective, run ``produce()`` themselves when ``outsiders`` is set (to learn
    a file's header) and get b"" otherwise. One broadcast when the result fits in
    ``cap`` bytes, two otherwise.

    Example::

        >>> prefix = first_rank(mesh, lambda: open(path, "rb").read(64))
    """
    coord = mesh.get_coordinate()
    if coord is None:
        return bytes(produce()) if outsiders else b""
    kind, payload = _outcome(produce) if coord == [0] * mesh.ndim else (0, b"")
    buf = np.zeros(_HEAD + cap, np.uint8)
    buf[:_HEAD].view(np.int64)[:] = (kind, len(payload))
    buf[_HEAD:_HEAD + min(cap, len(payload))] = np.frombuffer(payload[:cap], np.uint8)
    _bcast_from_first(mesh, buf)
    kind, length = (int(v) for v in buf[:_HEAD].view(np.int64))
    if length > cap:
        rest = np.frombuffer(bytearray(payload[cap:].ljust(length - cap, b"\0")), np.uint8)
        _bcast_from_first(mesh, rest)
        payload = buf[_HEAD:].tobytes() + rest.tobytes()
    else:
        payload = buf[_HEAD:_HEAD + length].tobytes()
    if kind == 0:
        return payload
    raise _KINDS[kind](payload.decode("utf-8", "replace"))


def same_path(mesh, path: str, look: Callable[[], bytes] = bytes, *,
              outsiders: bool = False, layout: str = "") -> bytes:
    """Collective on the mesh. Every rank of the mesh checks that it passed the same
    ``path`` as the others (paths are compared resolved, so pass
    ``os.path.realpath``'s): ValueError on every rank when any differs, since a
    collective save or load of several files (a per-rank temporary directory, a pid
    in the name) would mix them or leave holes; then ``first_rank(mesh, look)``.
    ``layout`` describes the other arguments that must be the same on every rank
    (a load's placements and ``like``): it rides in the same hash. One small
    all-reduce (``_comm.agree`` on a hash of the path) and one broadcast.

    Example::

        >>> head = same_path(mesh, os.path.realpath(p), lambda: read_prefix(p))
    """
    if mesh.get_coordinate() is not None:
        what = "path, placements and like=" if layout else "path"
        _comm.agree(mesh, True,
                 fingerprint((path, layout)),
                 f"every rank of the mesh must pass the same {what}; the first rank's "
                 f"path is {path!r} (symlinks resolved) and another rank's arguments "
                 f"differ")
    return first_rank(mesh, look, outsiders=outsiders)


def everywhere(mesh, attempt: Callable[[], object], failure: Callable[[], Exception],
               fingerprint: int = 0, differ: str = ""):
    """Collective on the mesh. ``attempt()`` on every rank, and its result when it
    returned on every rank; otherwise the first failing rank's ``failure()`` raised
    on every rank (chained to the rank's own error where it had one), so that a step
    that can fail on some ranks only (an allocation, above all) never leaves the
    others waiting in the collective that follows. A check that the ranks hold
    the same thing rides along: ValueError(``differ``) on every rank when their
    ``fingerprint`` values differ. One small all-reduce (``_comm.agree``).

    Example::

        >>> out = everywhere(mesh, lambda: np.empty(shape), lambda: MemoryError("..."))
    """
    try:
        result, error = attempt(), None
    except Exception as e:  # noqa: BLE001 - MemoryError, ValueError, OverflowError alike
        result, error = None, e
    mine = failure() if error is not None else ValueError(differ)
    try:
        _comm.agree(mesh, error is None, fingerprint, str(mine), type(mine))
    except Exception as agreed:  # noqa: BLE001 - the first failing rank's, everywhere
        raise agreed from error
    return result
