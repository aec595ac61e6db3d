"""The C I/O of sharded files (mpitensor/io/io.h), bound through ctypes in the
``_C`` object (:mod:`mpitensor._clib`): each member of a mesh writes or reads its
own box of one C-order array, by POSIX I/O per rank or MPI-IO. The .npy format
itself is :mod:`._npy`'s; these move the header and the data. The options every
later save and load of this process passes live here, the counters in ``_C``.
"""

from __future__ import annotations

import operator
import os

import numpy as np

from .. import _C, _comm
from .._clib import MAX_NDIM, Error, I64, _Box, _int64s, call, check, exported, status_of
from .._bind.io import (IoArray as _Array, IoOptions as _Options, mt_io_save, mt_io_load,
                        mt_io_options_default, mt_io_counters_read, mt_io_exchange,
                        mt_io_sync_range, mt_io_release_cache)

__all__ = ["io_save", "io_load", "io_counters", "io_pipeline", "exchange", "sync_range",
           "release_cache"]

# io_save's durable that syncs the file but not its directory (MT_IO_DURABLE_FILE)
DURABLE_FILE = 2

_COUNTERS = exported(_C.IO_COUNTERS, "mpitensor._C.io_counters")  # io_counters() reads
_options = mt_io_options_default()  # what every later io_save and io_load passes
_options.counters = _COUNTERS


def _array_box(shape, itemsize, offset, box_offset, box_shape):
    """(mt_io_array, mt_box) of the array's shape, itemsize and data offset, and of
    the box's offset and shape."""
    a = _Array(itemsize=operator.index(itemsize), offset=operator.index(offset))
    sh, a.ndim = _int64s(shape, MAX_NDIM, "shape")
    off, no = _int64s(box_offset, MAX_NDIM, "box offset")
    size, ns = _int64s(box_shape, MAX_NDIM, "box shape")
    if no != ns:
        raise ValueError("box offset and box shape differ in length")
    box = _Box(ndim=ns, offset=(I64 * MAX_NDIM)(*off[:ns]),
               shape=(I64 * MAX_NDIM)(*size[:ns]))
    a.shape[:a.ndim] = sh[:a.ndim]
    return a, box


def _data(buf, writable: bool) -> np.ndarray:
    """The bytes of C-contiguous ``buf`` (writable when asked) as an array of them;
    their count is checked in the core, on every rank alike."""
    view = memoryview(buf)
    if not view.c_contiguous:
        raise BufferError("the buffer is not C-contiguous")
    if writable and view.readonly:
        raise BufferError("the buffer is not writable")
    return np.frombuffer(view.cast("B") if view.nbytes else b"", np.uint8)


def io_save(mesh, path, header: bytes, shape, itemsize: int, offset: int, box_offset,
            box_shape, buf, durable: bool | int = True) -> None:
    """Writes a new file of ``header`` and the array of ``shape`` at ``offset``,
    this rank's box (``box_offset``, ``box_shape``) from the C-contiguous ``buf``;
    synced to the device before it returns when ``durable``, with its directory
    unless ``durable`` is DURABLE_FILE. Collective on the mesh.

    Example: ``io_save(mesh, "x.npy", head, (4,), 8, len(head), (0,), (4,),
    local.view(np.uint8))``.
    """
    m = _comm.checked(mesh)
    name, head = os.fsencode(path), bytes(header)
    array, box = _array_box(shape, itemsize, offset, box_offset, box_shape)
    data = _data(buf, False)
    opts = _Options.from_buffer_copy(_options)
    opts.durable = DURABLE_FILE if durable == DURABLE_FILE else int(bool(durable))
    call(mt_io_save, m, name, head, len(head), array, box, data, data.nbytes, opts)


def io_load(mesh, path, shape, itemsize: int, offset: int, box_offset, box_shape,
            out) -> None:
    """Fills the writable C-contiguous ``out`` with this rank's box of the array of
    ``shape`` at ``offset`` in the file. Collective on the mesh.

    Example: ``io_load(mesh, "x.npy", (4,), 8, 128, (0,), (4,), raw)``.
    """
    m = _comm.checked(mesh)
    name = os.fsencode(path)
    array, box = _array_box(shape, itemsize, offset, box_offset, box_shape)
    data = _data(out, True)
    opts = _Options.from_buffer_copy(_options)
    call(mt_io_load, m, name, array, box, data, data.nbytes, opts)


def exchange(a: str, b: str) -> bool:
    """Swaps the names ``a`` and ``b`` in one step, as the saves of files put them
    in place; False, with nothing changed, where either is missing or the file
    system cannot; OSError for any other failure. Local.

    Example: ``if exchange(tmp, "u.zarr"): shutil.rmtree(tmp)``.
    """
    err = Error()
    rc = mt_io_exchange(os.fsencode(a), os.fsencode(b), err)
    if rc == status_of(NotImplementedError):
        return False
    check(rc, err)
    return True


def sync_range(fd: int, at: int, nbytes: int, path: str) -> None:
    """Writes back bytes [at, at + nbytes) of the open file ``fd`` and waits for
    the device to have them, leaving the rest of the file alone (Linux's
    sync_file_range; elsewhere an fsync); OSError on failure. The file's
    metadata and the device's write cache still need one ``os.fsync`` of it,
    after every writer's range. Local.

    Example: ``sync_range(fd, offset, data.nbytes, path); os.fsync(fd)``.
    """
    call(mt_io_sync_range, operator.index(fd), operator.index(at), operator.index(nbytes),
         os.fsencode(path))


def release_cache(path: str) -> None:
    """Drops the cached pages of the regular file ``path``, which a save is about
    to replace, when none is dirty, so that the new file's pages reuse them (see
    mt_io_release_cache: in a virtual machine, free memory unused for a while can
    cost many times more to write into). The file stays whole on the device; a
    missing file, a symlink or a dirty file is let be. Local.

    Example: ``release_cache(os.path.join(store, "c.0.0"))``, then write the new
    chunk.
    """
    mt_io_release_cache(os.fsencode(path))


def io_counters() -> tuple[int, int]:
    """(data bytes read, data bytes written) by this process. Local."""
    read, written = I64(), I64()
    mt_io_counters_read(_COUNTERS, read, written)
    return read.value, written.value


def io_pipeline(chunk_bytes: int, io_thread) -> tuple[int, bool]:
    """How boxes of many short runs move through row slabs (mt_io_options), for
    every later save and load; returns the previous pair. Local.

    Example: ``old = io_pipeline(1 << 20, False)``.
    """
    chunk, threaded = operator.index(chunk_bytes), bool(io_thread)
    if chunk < 1:
        raise ValueError("chunk_bytes must be positive")
    old = (_options.chunk_bytes, bool(_options.io_thread))
    _options.chunk_bytes, _options.io_thread = chunk, threaded
    return old

