"""Sharded checkpoints as ordinary .npy files, each rank writing and reading its share.

A DTensor saved by N ranks is one standard ``.npy`` file that ``numpy.load``
reads; it loads back onto any mesh and placements, each rank reading about a 1/N
share of the file. A state_dict (a dict of names to DTensors and ndarrays) is a directory
with one ``.npy`` per entry and an ``index.json``.

Example (``mpiexec -n 4``)::

    >>> mesh = init_device_mesh("cpu", (2, 2))
    >>> dt = distribute_tensor(np.arange(24.0).reshape(4, 6), mesh, [Shard(0), Shard(1)])
    >>> mpitensor.save(dt, "x.npy")
    >>> np.load("x.npy").shape
    (4, 6)
    >>> mpitensor.load("x.npy", init_device_mesh("cpu", (4,)), [Shard(1)]).placements
    (Shard(dim=1),)
"""

from __future__ import annotations

import os

from .._dtensor import DTensor
from .._args import raise_on_every_rank, resolve_mesh
from ..device_mesh import _mesh_stack, init_device_mesh
from . import _agree, _directory, _paths, _tensor, _tree
from .._shard import DTensorShard, assemble

__all__ = ["save", "load", "DTensorShard", "assemble"]

_world_mesh = []


def _default_mesh():
    """The innermost ``with mesh:``, else a 1-D mesh of every rank (made once)."""
    if _mesh_stack:
        return _mesh_stack[-1]
    if not _world_mesh:
        from mpi4py import MPI

        _world_mesh.append(init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),)))
    return _world_mesh[0]


def _mesh_of(obj, device_mesh):
    if device_mesh is not None:
        return resolve_mesh(device_mesh)
    if isinstance(obj, DTensor):
        return obj.device_mesh
    leaves = _tree.flatten(obj)[0].values() if isinstance(obj, dict) else []
    meshes = [v.device_mesh._get_root_mesh() for v in leaves if isinstance(v, DTensor)]
    # A slice (mesh["tp"]) stands for the mesh it was cut from, so that every slice
    # takes part; the largest mesh holds the others' members.
    return max(meshes, key=lambda m: m.size()) if meshes else _default_mesh()


def save(obj, path, *, device_mesh=None) -> None:
    """Saves a DTensor as one .npy file, or a state_dict as a directory.

    A dict may nest dicts (str or int keys), lists and tuples, as an optimizer's
    ``state_dict()`` does: each array is an entry named by its dotted path
    (``optim.state.0.exp_avg``), and plain values (None, bool, int, float, str)
    are kept in the index, taken to be equal on every rank; ``load`` gives the
    same structure back.

    Collective on the DTensor's mesh (for a dict: on ``device_mesh``, else the
    largest mesh among its DTensors, a slice such as ``mesh["tp"]`` counting as the
    mesh it was cut from, else the current ``with mesh:`` or all ranks).
    Every byte is written once: of the replicas of a box only the one at
    coordinate 0 of every Replicate mesh dim writes it, and a Partial is reduced
    first. When the boxes interleave in the file (Shard(1), say) they are first
    exchanged in memory into row slabs, so each rank writes one run, a 1/N share.
    The file is written under a temporary name, synced to the device and renamed
    into place after every rank has finished, so an existing file is replaced
    whole or not at all, and the new one survives a power cut once ``save``
    returns. A symlink is followed (its target is replaced, as by
    ``numpy.save``); anything else that is not a regular file (a directory, a
    FIFO, a device) is refused. A directory save is all or nothing for ``load``:
    the entries are written under new names and ``index.json``, which names them,
    is switched last; a failed or killed save leaves the previous checkpoint
    whole, and the next save removes what it left. Every rank must pass the
    same path (ValueError otherwise). ndarray entries of a dict must be equal on
    every rank; the first rank writes them. Likewise an entry on a slice of a larger mesh is taken to be equal on
    every slice (data-parallel replicas, as torch's checkpoints assume): only the
    first slice (coordinate 0 on the dims cut away) writes it. Any failure (a
    missing directory, an unwritable path, ...) raises the same
    exception on every rank.

    Example (``mpiexec -n 2``)::

        >>> mesh = init_device_mesh("cpu", (2,))
        >>> w = distribute_tensor(np.ones((4, 3), np.float32), mesh, [Shard(0)])
        >>> mpitensor.save({"w": w, "step": np.array(7)}, "ckpt")   # ckpt/w.npy, ...
    """
    if isinstance(obj, DTensor):
        path = _real_path(path, obj.device_mesh)
        if obj.device_mesh.get_coordinate() is not None:
            _agree.same_path(obj.device_mesh, path, lambda: _paths.check_target(path))
        _tensor.save_dtensor(obj, path)
    elif isinstance(obj, dict):
        mesh = _mesh_of(obj, device_mesh)
        _directory.save_dict(obj, _real_path(path, mesh), mesh)
    else:
        raise TypeError(f"save takes a DTensor or a dict of DTensors and ndarrays, got "
                        f"{type(obj).__name__}")


def _real_path(path, mesh) -> str:
    """``path`` with symlinks resolved (a save's rename then replaces the link's
    target, and the ranks compare the files they name). A path that is no path on
    one rank raises on every rank of the mesh, through the agreement on the path
    that the others enter next. Collective on the mesh only when it fails."""
    try:
        return os.path.realpath(os.fspath(path))
    except Exception as e:
        if mesh.get_coordinate() is not None:
            raise_on_every_rank(mesh, e)
        raise


def _look(path: str) -> bytes:
    """On the first rank: b"D" for a directory, else b"F" and the file's size and
    first bytes (its .npy header), so one broadcast serves both questions."""
    if os.path.isdir(path):
        return b"D"
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}: no such file or directory")
    return b"F" + _tensor.look_file(path)


def load(path, device_mesh=None, placements=None, *, like=None):
    """Loads a .npy file as a DTensor, or a checkpoint directory as a dict.

    Collective on the mesh. Any mesh and placements (Shard, Replicate, even or
    not) work, whatever the file was saved with; each rank reads only its own box,
    or, when the boxes interleave in the file, one row slab that an in-memory
    exchange then turns into its box.
    Plain .npy files written by NumPy load too, Fortran order and any byte order
    included. ``device_mesh`` defaults to the mesh of ``like``, then to the current
    ``with mesh:``, then to a 1-D mesh of all ranks; ``placements`` to Replicate.
    For a directory, ``placements`` may be one list for every entry or a dict of
    names to lists; entries without one keep the placements they were saved with
    when the mesh has the same shape, else are replicated; ndarray entries come back
    as ndarrays; a nested dict comes back nested (``placements`` names its
    entries by their dotted paths). ``like`` (a DTensor, or a dict of DTensors
    and ndarrays such as a ``state_dict()``, nested or not) gives each entry its mesh and placements and must match the
    checkpoint's keys, shapes and dtypes (KeyError, ValueError, TypeError).
    A missing, truncated or non-.npy file, a path that is not a regular file or
    directory, a malformed ``index.json`` or one that names files outside its
    directory, paths, placements or ``like`` that differ between ranks, and a part
    that some rank cannot allocate raise the same exception on every rank, so that
    "resume from the checkpoint, else start afresh" works with ``try``/``except``.

    Example (``mpiexec -n 3``)::

        >>> mesh = init_device_mesh("cpu", (3,))
        >>> w = mpitensor.load("ckpt/w.npy", mesh, [Shard(0)])  # 4 rows: 2, 2, 0 (torch.chunk)
        >>> sd = mpitensor.load("ckpt", mesh, {"w": [Shard(1)]})
        >>> opt.load_state_dict(mpitensor.load("run")["optim"])  # a nested save
    """
    mesh = _load_mesh(device_mesh, like)
    path = _real_path(path, mesh)
    seen = _agree.same_path(mesh, path, lambda: _look(path), outsiders=True,
                            layout=_layout_of(placements, like))
    if seen == b"D":
        if like is not None and not isinstance(like, dict):
            raise TypeError(f"{path!r} is a checkpoint directory; like= must be a dict")
        return _directory.load_dict(path, mesh, placements, like)
    head = _tensor.header_of(seen[1:], path)
    if like is not None:
        return _tensor.load_like(head, path, like, mesh)
    return _tensor.load_dtensor(head, path, mesh, placements)


def _layout_of(placements, like) -> str:
    """The placements and ``like``'s entries (keys, types, global shapes, dtypes,
    placements) as text that is the same on every rank that passed the same ones:
    a load that some rank asks for in another layout must fail on every rank, not
    read other boxes there and leave the next collective unmatched."""
    def entry(v):
        if isinstance(v, dict):
            return sorted((str(k), entry(x)) for k, x in v.items())
        if isinstance(v, DTensor):
            return ("DTensor", tuple(v.shape), str(v.dtype), tuple(map(repr, v.placements)))
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            return (type(v).__name__, tuple(v.shape), str(v.dtype))
        return type(v).__name__
    if isinstance(placements, dict):
        placements = sorted((str(k), repr(v)) for k, v in placements.items())
    return repr((repr(placements), entry(like)))


def _load_mesh(device_mesh, like):
    if device_mesh is not None or like is None:
        return resolve_mesh(device_mesh) if device_mesh is not None else _default_mesh()
    return _mesh_of(like, None)
