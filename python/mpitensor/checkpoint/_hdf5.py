"""DTensors as HDF5 datasets: h5py (the ordinary wheel, without MPI) owns the file's
structure, and the bytes of a contiguous dataset go through the core's parallel
write and read, as a .npy file's do.

A new file is laid out in memory on the first rank: the dataset's structure and
attributes first, then its storage allocated without fill values, which puts the
data last in the file. Those bytes before the data are then what a .npy header
is to the core: it writes them, then each rank its own part at the data's offset,
under a temporary name renamed over the path once every rank is done, so a file
is replaced whole or not at all.

A dataset added to an existing file (``mode="a"``) cannot be written that way:
the first rank adds the dataset (allocated, unfilled) through h5py and closes the
file, then each rank writes its rows at the dataset's offset. The file's other
contents stay as they were, but the file is changed in place.

Loads read a contiguous dataset through the core, each rank its own box; a
chunked or compressed one (or one of a type whose bytes are not NumPy's) through
h5py, each rank opening the file and reading its own hyperslab, so only the
chunks it needs. bfloat16 is an HDF5 float type of its own (8 exponent bits, 7
mantissa bits), which plain h5py reads as float32 values.
"""

from __future__ import annotations

import io
import json
import math
import os

import numpy as np

from .. import _comm, _dtypes
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from . import _agree, _io, _npy, _paths, _stored, _tensor

MODES = ("w", "a")


def h5py():
    """The h5py module; ImportError that says how to install it. Local."""
    try:
        import h5py as module
    except ImportError:
        raise ImportError("HDF5 files need h5py: pip install 'mpitensor[io]' (or "
                          "h5py)") from None
    return module


def _bfloat16_type():
    """HDF5's description of bfloat16: float32 with its low 16 mantissa bits cut."""
    t = h5py().h5t.IEEE_F32LE.copy()
    t.set_fields(15, 7, 8, 0, 7)
    t.set_offset(0)
    t.set_precision(16)
    t.set_size(2)
    t.set_ebias(127)
    return t


def _file_type(dtype: np.dtype):
    if _dtypes.is_bfloat16(dtype):
        return _bfloat16_type()
    return h5py().h5t.py_create(dtype, logical=1)


def _create(group, name: str, shape: tuple, dtype: np.dtype, early: bool):
    """A contiguous dataset that is never filled: its storage, once allocated (now
    when ``early``), holds whatever is written there, so allocating it writes
    nothing. No times in its header, so equal saves give equal files."""
    h = h5py()
    dcpl = h.h5p.create(h.h5p.DATASET_CREATE)
    dcpl.set_layout(h.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h.h5d.ALLOC_TIME_EARLY if early else h.h5d.ALLOC_TIME_LATE)
    dcpl.set_fill_time(h.h5d.FILL_TIME_NEVER)
    dcpl.set_obj_track_times(False)
    lcpl = h.h5p.create(h.h5p.LINK_CREATE)
    lcpl.set_create_intermediate_group(True)
    space = h.h5s.create_simple(shape) if shape else h.h5s.create(h.h5s.SCALAR)
    return h.Dataset(h.h5d.create(group.id, name.encode(), _file_type(dtype), space,
                                  dcpl=dcpl, lcpl=lcpl))


def _allocate(d) -> None:
    """Allocates a contiguous dataset's storage by writing its first element: with
    no fill, the rest is left as it is."""
    h = h5py()
    tid = d.id.get_type()
    one = np.zeros(tid.get_size(), np.uint8)
    if d.shape:
        fspace = d.id.get_space()
        fspace.select_hyperslab((0,) * len(d.shape), (1,) * len(d.shape))
        mspace = h.h5s.create_simple((1,))
    else:
        fspace = mspace = h.h5s.ALL
    d.id.write(mspace, fspace, one, mtype=tid)


def _set_attrs(d, attrs) -> None:
    for key, value in (attrs or {}).items():
        d.attrs[key] = value


def skeleton(shape: tuple, dtype: np.dtype, dataset: str, attrs) -> bytes:
    """On the first rank: the new file's bytes before the data, after the data's
    offset (8 bytes); for an empty dataset the whole file, offset at its end."""
    h = h5py()
    nbytes = math.prod(shape) * dtype.itemsize
    buf = io.BytesIO()
    with h.File(buf, "w") as f:
        _set_attrs(_create(f, dataset, shape, dtype, early=False), attrs)
    # Allocated in a second session: the structure written in the first holds
    # everything else, so the data is what comes last.
    with h.File(buf, "r+") as f:
        if nbytes:
            d = f[dataset]
            _allocate(d)
            offset, end = d.id.get_offset(), f.id.get_filesize()
            if offset is None or end != offset + nbytes:
                raise OSError(f"HDF5 did not place the dataset {dataset!r} at the end of "
                              f"the file; cannot write it in parallel")
    data = buf.getvalue()
    if not nbytes:
        offset = len(data)
    return offset.to_bytes(8, "little") + data[:offset].ljust(offset, b"\0")


def check_target(path: str, mode: str) -> bytes:
    """On the first rank, before a save: what _paths.check_target checks, and
    whether the dataset goes into an existing file (b"a") or a new one (b"w")."""
    _paths.check_target(path)
    return b"a" if mode == "a" and os.path.exists(path) else b"w"


def _rows(dt):
    """``dt`` laid out so that each rank holds one run of the file (whole rows of
    dim 0, in order), written by one rank of its replicas."""
    mesh = dt.device_mesh
    rows = [Shard(0) if dt.ndim else Replicate()] * mesh.ndim
    return dt.redistribute(mesh, rows) if tuple(dt.placements) != tuple(rows) else dt


def _in_file(path: str, dataset: str, shape: tuple, dtype: np.dtype, attrs) -> bytes:
    """On the first rank, in mode "a": the dataset added to the file (or the same
    shape and type found there, contiguous) with its storage allocated; its offset
    and the file's inode (8 bytes each). Not synced here: the one sync of the
    file after every rank's rows (_add) covers what h5py wrote too."""
    h = h5py()
    with h.File(path, "r+") as f:
        if dataset in f:
            d = _reusable(f[dataset], path, dataset, shape, dtype)
        else:
            d = _create(f, dataset, shape, dtype, early=True)
        _set_attrs(d, attrs)
        if math.prod(shape) and d.id.get_offset() is None:
            _allocate(d)
        offset = d.id.get_offset() or 0
        inode = os.fstat(f.id.get_vfd_handle()).st_ino
    return offset.to_bytes(8, "little") + inode.to_bytes(8, "little")


def _reusable(d, path: str, dataset: str, shape: tuple, dtype: np.dtype):
    """The existing dataset, when a save in mode "a" can write it in place."""
    h = h5py()
    if not isinstance(d, h.Dataset):
        raise TypeError(f"{path!r}: {dataset!r} is a group, not a dataset")
    plist = d.id.get_create_plist()
    if (d.shape != shape or d.id.get_type() != _file_type(dtype)
            or plist.get_layout() != h.h5d.CONTIGUOUS or plist.get_external_count()):
        raise ValueError(f"{path!r} already holds a dataset {dataset!r} of shape "
                         f"{d.shape} and dtype {d.dtype}, not a contiguous {shape} "
                         f"{dtype} one that could be written in place: delete it "
                         f"first, or save the file anew (mode='w')")
    return d


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    while data:
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


def _write_rows(path: str, inode: int, data: np.ndarray, at: int, durable: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_ino != inode:
            raise OSError(f"{path!r} was replaced while a dataset was being added to it")
        _pwrite_all(fd, memoryview(data.reshape(-1).view(np.uint8)), at)
        if durable:
            # this rank's rows only: _add syncs the whole file once they all are
            _io.sync_range(fd, at, data.nbytes, path)
    finally:
        os.close(fd)


def _sync_once(mesh, path: str) -> None:
    """Collective on the mesh, once every rank has written back its own bytes of
    the file ``path`` (_io.sync_range): the one fsync that makes it durable, by
    the first rank (the ranks of one node share its page cache), or by every rank
    where they lie on several nodes (a sync flushes only what its own node wrote);
    a failure raises on every rank.

    Example::

        >>> _sync_once(mesh, "/data/run.h5")
    """
    if _comm.nodes(mesh)[0] == "one":
        _agree.first_rank(mesh, lambda: _paths.sync_file(path) or b"")
        return
    failed = []

    def attempt():
        try:
            _paths.sync_file(path)
        except OSError as e:
            failed.append(e)
            raise

    _agree.everywhere(mesh, attempt, lambda: failed[0])


def _add(dt, path: str, dataset: str, attrs, durable: bool) -> None:
    """Collective. Mode "a" on an existing file: the first rank adds the dataset,
    then every rank writes its rows in place; when ``durable``, each rank writes
    back its own rows and then the file is synced once (_sync_once)."""
    dt = _rows(dt.detach())
    mesh = dt.device_mesh
    if mesh.get_coordinate() is None:
        return
    got = _agree.first_rank(mesh, lambda: _in_file(path, dataset, tuple(dt.shape),
                                                   dt.dtype, attrs))
    offset, inode = int.from_bytes(got[:8], "little"), int.from_bytes(got[8:], "little")
    local = np.ascontiguousarray(dt.to_local())
    sizes, starts = compute_local_shape_and_global_offset(dt.shape, mesh, dt.placements)
    row = math.prod(dt.shape[1:]) * dt.dtype.itemsize
    first = dt.ndim == 0 and mesh.get_coordinate() == [0] * mesh.ndim
    writes = local.size > 0 and (dt.ndim > 0 or first)
    at = offset + (starts[0] * row if dt.ndim else 0)
    failed = []

    def attempt():
        try:
            if writes:
                _write_rows(path, inode, local, at, durable)
        except Exception as e:  # noqa: BLE001 - raised on every rank just below
            failed.append(e if isinstance(e, OSError) else OSError(str(e)))
            raise

    _agree.everywhere(mesh, attempt, lambda: failed[0])
    if durable:
        _sync_once(mesh, path)


def save(dt, path: str, dataset: str, mode: str, attrs, durable: bool) -> None:
    """Collective on ``dt``'s mesh. Writes ``dt`` as the dataset ``dataset`` of the
    HDF5 file ``path`` (symlinks resolved, checked alike on every rank): a new file
    replacing ``path`` whole (mode "w", or "a" where no file is), or a dataset
    added to the existing file (mode "a").

    Example::

        >>> save(dt, "/data/run.h5", "fields/u", "w", {"units": "m/s"}, True)
    """
    mesh = dt.device_mesh
    where = b"w"
    if mesh.get_coordinate() is not None:
        where = _agree.same_path(mesh, path, lambda: check_target(path, mode),
                                 layout=repr((dataset, mode, sorted(attrs or {}))))
    if where == b"a":
        _add(dt, path, dataset, attrs, durable)
        return

    def layout(shape, dtype):
        got = _agree.first_rank(mesh, lambda: skeleton(shape, dtype, dataset, attrs))
        return got[8:], int.from_bytes(got[:8], "little")

    _tensor.save_dtensor(dt, path, layout=layout, durable=durable)


def _only_dataset(f, path: str) -> str:
    names = []
    f.visititems(lambda name, obj: names.append(name)
                 if isinstance(obj, h5py().Dataset) else None)
    if len(names) != 1:
        raise ValueError(f"{path!r} holds {len(names)} datasets ({', '.join(names[:8])}"
                         f"{', ...' if len(names) > 8 else ''}): name one with dataset=")
    return names[0]


def _dtype_of(d, path: str, name: str) -> np.dtype:
    if d.id.get_type() == _bfloat16_type():
        return _dtypes.require_bfloat16()
    dtype = d.dtype
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype:
        raise TypeError(f"{path!r}: the dataset {name!r} holds dtype {dtype}; DTensors "
                        f"hold numeric data (bool, int, uint, float, complex, bfloat16)")
    return dtype


def _raw_offset(d, dtype: np.dtype):
    """Where a contiguous dataset's bytes start when they are NumPy's bytes of
    ``dtype`` (the core reads them in place), else None (h5py reads it)."""
    h = h5py()
    plist = d.id.get_create_plist()
    if plist.get_layout() != h.h5d.CONTIGUOUS or plist.get_external_count():
        return None
    if d.id.get_type() != _file_type(dtype):
        return None
    return d.id.get_offset()


def describe(opened, dataset) -> bytes:
    """On the first rank: the dataset ``dataset`` (the file's only one when None)
    of the file ``opened`` holds, as JSON: its name, shape, dtype, the offset of
    its bytes when the core can read them in place, and the file's size. KeyError
    when it is missing; OSError when the file is no HDF5 file or is damaged."""
    h = h5py()
    path = opened.path
    try:
        f = h.File(opened.name, "r")
    except OSError as e:
        raise OSError(f"cannot open {path!r} as an HDF5 file: {opened.local(str(e))}") \
            from None
    with f:
        name = dataset if dataset is not None else _only_dataset(f, path)
        if name not in f:
            raise KeyError(f"{path!r} has no dataset {name!r}")
        d = f[name]
        if not isinstance(d, h.Dataset):
            raise TypeError(f"{path!r}: {name!r} is a group, not a dataset")
        if d.shape is None:
            raise ValueError(f"{path!r}: the dataset {name!r} has no dataspace (it "
                             f"holds no array)")
        dtype = _dtype_of(d, path, name)
        return json.dumps({"dataset": name, "shape": list(d.shape),
                           "dtype": _npy.descr(dtype), "offset": _raw_offset(d, dtype),
                           "size": os.fstat(opened.open()).st_size}).encode()


class H5Reader(_stored.Reader):
    """Each rank's hyperslab of a dataset through h5py: only the chunks it needs,
    decompressed by HDF5's filters."""

    def __init__(self, opened, dataset: str, dtype: np.dtype):
        self.opened, self.dataset, self.dtype = opened, dataset, dtype

    def read(self, room, offsets: tuple, sizes: tuple) -> np.ndarray:
        room = room.reshape(sizes)
        if room.size == 0:
            return room
        h = h5py()
        with h.File(self.opened.name, "r") as f:
            d = f[self.dataset]
            bfloat16 = _dtypes.is_bfloat16(self.dtype)
            mtype = d.id.get_type() if bfloat16 else None
            if sizes:
                fspace = d.id.get_space()
                fspace.select_hyperslab(offsets, sizes)
                mspace = h.h5s.create_simple(sizes)
            else:
                fspace = mspace = h.h5s.ALL
            d.id.read(mspace, fspace, room.view(np.uint16) if bfloat16 else room,
                      mtype=mtype)
        return room


def load(opened, look: dict, mesh, placements, region):
    """Collective on the mesh. The dataset ``look`` describes (describe's JSON),
    which the ranks have agreed is in the one file they hold open, or its
    ``region``, as a DTensor with ``placements``."""
    shape, dtype = tuple(look["shape"]), _npy.dtype_of(look["dtype"])
    if look["offset"] is not None:
        head = _npy.NpyHeader(shape, dtype, False, look["offset"])
        if look["size"] < head.offset + head.nbytes:
            raise OSError(f"{opened.path!r} is truncated: it has {look['size']} bytes, "
                          f"the dataset {look['dataset']!r} needs "
                          f"{head.offset + head.nbytes}")
        return _tensor.load_dtensor(head, opened, mesh, placements, region)
    reader = H5Reader(opened, look["dataset"], dtype.newbyteorder("="))
    return _stored.load(opened.path, shape, mesh, placements, reader, region)
