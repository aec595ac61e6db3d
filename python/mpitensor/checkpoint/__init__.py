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

import json
import os

import numpy as np

from .._dtensor import DTensor
from .._args import raise_on_every_rank, resolve_mesh
from ..device_mesh import _mesh_stack, init_device_mesh
from . import (_agree, _async, _directory, _formats, _hdf5, _npy, _npz, _numpy,  # noqa: F401
               _opened, _paths, _region, _tensor, _tree, _zarr)
from .._shard import DTensorShard, assemble

__all__ = ["save", "async_save", "load", "DTensorShard", "assemble"]

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


def save(obj, path, *, device_mesh=None, dataset=None, format=None, mode="w",
         attrs=None, durable=True) -> None:
    """Saves a DTensor as one .npy file, HDF5 dataset or Zarr array, or a
    state_dict as a directory.

    The format is ``format=`` (``"npy"``, ``"hdf5"``, ``"zarr"``) or the path's
    suffix (``.h5``/``.hdf5`` and ``.zarr``; anything else is a .npy file). An
    HDF5 file holds the DTensor as the dataset ``dataset=`` (a path such as
    ``"fields/u"``); ``mode="w"`` (the default) writes a new file in place of
    any file at ``path``, ``mode="a"`` adds the dataset to the existing file (or
    writes it into the same contiguous dataset of the same shape and dtype)
    and keeps the rest of the file. A ``.zarr`` path is a Zarr v3 array at the
    store's root, chunked as the DTensor is sharded. ``attrs=`` (a dict) become
    the dataset's or array's attributes.

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
    returns (a Zarr store likewise, as a directory; a dataset added to an
    existing HDF5 file is written in place: see docs/checkpoints.md).
    ``durable=False`` skips every sync (files, directories, an index), as
    ``numpy.save`` makes none: the replacement is still whole or not at all for
    other processes, even if the saving job is killed, but a crash of the machine
    may leave the old file, the new one, or the new name on unwritten bytes
    (as it may leave ``numpy.save``'s file cut short). A symlink
    is followed (its target is replaced, as by ``numpy.save``); anything else
    that is not a regular file (a directory, a FIFO, a device) is refused. A
    directory save is all or nothing for ``load``:
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
        >>> mpitensor.save(w, "run.h5", dataset="w", attrs={"units": "m"})
        >>> mpitensor.save(w, "w.zarr")
    """
    if isinstance(obj, DTensor):
        path = _real_path(path, obj.device_mesh)
        fmt = _on_every_rank(obj.device_mesh, lambda: _save_format(path, format, dataset,
                                                                   mode, attrs))
        if fmt == "hdf5":
            _hdf5.save(obj, path, dataset, mode, attrs, durable)
        elif fmt == "zarr":
            _zarr.save(obj, path, attrs, durable)
        else:
            if obj.device_mesh.get_coordinate() is not None:
                _agree.same_path(obj.device_mesh, path, lambda: _paths.check_target(path))
            _tensor.save_dtensor(obj, path, durable=durable)
    elif isinstance(obj, dict):
        mesh = _mesh_of(obj, device_mesh)
        path = _real_path(path, mesh)
        _on_every_rank(mesh, lambda: _dict_args(format, dataset, mode, attrs))
        _directory.save_dict(obj, path, mesh, durable)
    else:
        raise TypeError(f"save takes a DTensor or a dict of DTensors and ndarrays, got "
                        f"{type(obj).__name__}")


def async_save(obj, path, **kwargs):
    """Starts ``save(obj, path, **kwargs)`` on a worker thread and returns its
    ``concurrent.futures.Future``, as torch's DCP ``async_save``: ``result()``
    waits for it and returns None, or raises what ``save`` raised (the same on
    every rank). The DTensors and arrays of ``obj`` are copied first, so the
    values saved are those of the call. Every rank of the meshes involved makes
    the same async_save calls in the same order, as with ``save``. Local; the
    save runs collectively in the background (on meshes the worker makes once,
    of the same ranks and dim names).

    Example::

        >>> fut = mpitensor.async_save({"model": model.state_dict()}, "ckpt")
        >>> loss = train_step()   # overlaps the write
        >>> fut.result()          # the checkpoint is whole and synced from here
    """
    return _async.start(save, obj, path, kwargs)


def _on_every_rank(mesh, check):
    """``check()``'s result; when it raises on some members of the mesh, the same
    exception on every member, through the agreement that the others enter next
    (the one on the path). Collective on the mesh only when it fails."""
    try:
        return check()
    except Exception as e:
        if mesh.get_coordinate() is not None:
            raise_on_every_rank(mesh, e)
        raise


def _dict_args(format, dataset, mode, attrs) -> None:
    if format not in (None, "npy") or dataset is not None or mode != "w" or attrs is not None:
        raise TypeError("a dict is saved as a directory of .npy files: format=, "
                        "dataset=, mode= and attrs= are for one DTensor")


def _save_format(path: str, format, dataset, mode, attrs) -> str:
    """The format of a save of one DTensor, once the arguments that only some
    formats take are checked."""
    fmt = _formats.named(path, format) or "npy"
    if fmt == "hdf5":
        _hdf5.h5py()
        if not isinstance(dataset, str) or not dataset.strip("/"):
            raise ValueError("an HDF5 save names its dataset: dataset='x'")
        if mode not in _hdf5.MODES:
            raise ValueError(f"mode= takes 'w' (a new file) or 'a' (add to the file), "
                             f"got {mode!r}")
    elif dataset is not None or mode != "w":
        raise ValueError(f"dataset= and mode= are for HDF5 files; a {fmt} save writes "
                         f"one array")
    if fmt == "zarr":
        _zarr.zarr()
    if attrs is not None and (fmt == "npy" or not isinstance(attrs, dict)):
        raise TypeError("attrs= is a dict, for HDF5 datasets and Zarr arrays (a .npy "
                        "file has none)")
    return fmt


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


def _load_format(path: str, format):
    """The format ``format=`` or the suffix names (None: what is there decides),
    with its library imported."""
    fmt = _formats.named(path, format)
    if fmt == "hdf5":
        _hdf5.h5py()
    if fmt == "zarr":
        _zarr.zarr()
    return fmt


def _look(path: str, opened: _opened.Opened, fmt, dataset) -> bytes:
    """On the first rank: what stands at ``path``, as a kind (its first byte) and
    what the kind needs: b"D" for a state_dict directory, b"Z" for a Zarr store,
    b"H" and the dataset's description for an HDF5 file, b"F" and the file's size
    and first bytes (its .npy header) for a .npy file; one broadcast serves every
    question."""
    if fmt == "zarr" or os.path.isdir(path):
        if not os.path.isdir(path):
            if os.path.exists(path):
                raise NotADirectoryError(f"{path!r} is not a Zarr store: a store is a "
                                         f"directory")
            raise FileNotFoundError(f"no Zarr store at {path!r}: no such directory")
        if fmt == "zarr" or _formats.found(path, b"") == "zarr":
            return b"Z" + _zarr.describe(opened)
        return b"D"
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}: no such file or directory")
    if fmt is None:
        with opened.file() as f:
            fmt = _formats.found(path, f.read(len(_formats.HDF5_SIGNATURE)))
    if fmt == "hdf5":
        return b"H" + _hdf5.describe(opened, dataset)
    return b"F" + _tensor.look_file(opened)


def load(path, device_mesh=None, placements=None, *, like=None, dataset=None,
         format=None, index=None):
    """Loads a .npy file, an HDF5 dataset or a Zarr array as a DTensor, or a
    checkpoint directory as a dict.

    Collective on the mesh. Any mesh and placements (Shard, Replicate, even or
    not) work, whatever the file was saved with; each rank reads only its own box,
    or, when the boxes interleave in the file, one row slab that an in-memory
    exchange then turns into its box.
    Plain .npy files written by NumPy load too, Fortran order and any byte order
    included. The format is ``format=`` or the path's suffix (``.h5``, ``.hdf5``,
    ``.nc`` for netCDF-4, ``.zarr``); with neither, what is at the path decides.
    ``dataset=`` names an HDF5 file's dataset (by default its only one); a
    chunked or compressed dataset, and a Zarr array, are read by each rank
    through h5py or zarr, only the chunks it needs. ``index=`` (integers and
    slices of step 1, as ``np.s_[10:20, :, 3]``) loads that part of the array
    alone, as the DTensor of its shape, reading nothing else but the rows (or
    chunks) it touches. ``device_mesh`` defaults to the mesh of ``like``, then
    to the current ``with mesh:``, then to a 1-D mesh of all ranks;
    ``placements`` to Replicate.
    For a directory, ``placements`` may be one list for every entry or a dict of
    names to lists; entries without one keep the placements they were saved with
    when the mesh has the same shape, else are replicated; ndarray entries come back
    as ndarrays; a nested dict comes back nested (``placements`` names its
    entries by their dotted paths). ``like`` (a DTensor, or a dict of DTensors
    and ndarrays such as a ``state_dict()``, nested or not) gives each entry its mesh and placements and must match the
    checkpoint's keys, shapes and dtypes (KeyError, ValueError, TypeError).
    Every rank reads the file it opened, and the ranks check that they opened the
    same one: a file replaced while it is loaded gives one version on every rank
    or an OSError on every rank, never a mix.
    A missing, truncated or non-.npy file, a missing dataset (KeyError), a damaged
    HDF5 file or Zarr store, a path that is not a regular file or
    directory, a malformed ``index.json`` or one that names files outside its
    directory, paths, placements or ``like`` that differ between ranks, and a part
    that some rank cannot allocate raise the same exception on every rank, so that
    "resume from the checkpoint, else start afresh" works with ``try``/``except``.

    Example (``mpiexec -n 3``)::

        >>> mesh = init_device_mesh("cpu", (3,))
        >>> w = mpitensor.load("ckpt/w.npy", mesh, [Shard(0)])  # 4 rows: 2, 2, 0 (torch.chunk)
        >>> sd = mpitensor.load("ckpt", mesh, {"w": [Shard(1)]})
        >>> opt.load_state_dict(mpitensor.load("run")["optim"])  # a nested save
        >>> u = mpitensor.load("run.h5", mesh, [Shard(0)], dataset="fields/u",
        ...                    index=np.s_[100:200])
    """
    mesh = _load_mesh(device_mesh, like)
    path = _real_path(path, mesh)
    fmt = _on_every_rank(mesh, lambda: _load_format(path, format))
    layout = _layout_of(placements, like) + repr((fmt, dataset, index))
    with _opened.Opened(path) as opened:
        seen = _agree.same_path(mesh, path, lambda: _look(path, opened, fmt, dataset),
                                outsiders=True, layout=layout)
        kind, rest = seen[:1], seen[1:]
        if kind in (b"D", b"Z", b"F") and dataset is not None:
            raise ValueError(f"dataset= names a dataset of an HDF5 file; {path!r} is not "
                             f"one")
        if kind == b"D":
            if index is not None:
                raise ValueError(f"{path!r} is a checkpoint directory; index= is for "
                                 f"one array")
            if like is not None and not isinstance(like, dict):
                raise TypeError(f"{path!r} is a checkpoint directory; like= must be a dict")
            return _directory.load_dict(path, mesh, placements, like)
        if kind in (b"H", b"Z"):
            look = json.loads(rest)
            shape, dtype = tuple(look["shape"]), _npy.dtype_of(look["dtype"])
        else:
            head = _tensor.header_of(rest, path)
            shape, dtype = head.shape, head.dtype
        region = _region.region_of(index, shape) if index is not None else None
        if like is not None:
            _tensor.check_like(like, path, shape if region is None else region.shape,
                               dtype)
            mesh, placements = ((mesh, None) if isinstance(like, np.ndarray)
                                else (like.device_mesh, like.placements))
        opened.directory = kind == b"Z"
        if kind == b"H":
            out = _hdf5.load(opened, look, mesh, placements, region)
        elif kind == b"Z":
            out = _zarr.load(opened, look, mesh, placements, region)
        else:
            out = _tensor.load_dtensor(head, opened, mesh, placements, region)
        return out.to_local() if isinstance(like, np.ndarray) else out


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
