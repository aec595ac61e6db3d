"""DTensors as Zarr v3 arrays, through zarr-python: the array at the root of a
store (a directory), chunked as the DTensor is sharded.

A Shard cuts a dim as torch.chunk does, into pieces of ceil(n / k) elements but
the last: a regular chunk grid. So each rank's part is whole chunks, which it
writes alone, with no rank reading or rewriting another's; a layout that is no
such grid (one dim sharded by several mesh dims, a strided shard) is first
redistributed into one that is. Chunks larger than CHUNK_BYTES are cut further
along a dim, so that a load on more ranks (or a part of the array) reads little
beyond what it needs. A rank encodes its chunks with the codecs zarr-python
gave the array (its default: bytes, then zstd) and writes their files itself, the
bytes zarr-python would write, without its event loop and temporary files; any
other codecs it leaves to zarr-python.

A save writes a new store under a temporary name beside the path and swaps it
with the old one in one rename (renameat2's exchange, where the file system has
it), so a store is replaced whole or not at all. The old store's ``zarr.json`` is
removed before its chunks: a load that read it and still finds it after reading
its chunks read none that had gone (a Zarr reader takes a missing chunk for the
fill value). Then the ranks that wrote remove the old store's files, a share each:
an unlink can cost milliseconds, and a store of many chunks took the first rank
alone seconds while the others waited. Each rank of a load reads through its
descriptor of the store's directory, agreed to be the same one on every rank.

bfloat16 is the Zarr data type ``"bfloat16"`` (zarr-extensions), registered with
zarr-python here when ml_dtypes is installed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import math
import os
import shutil
import sys
import zlib

import numpy as np

from .. import _dtypes, _strided
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from . import _agree, _io, _npy, _paths, _stored, _tensor

# Uncompressed bytes of a chunk at most, where a dim can be cut further. zarr's
# default codec (zstd) encodes chunks of a few MiB faster per byte than chunks of
# tens of MiB, whose output buffers are too large for the allocator to reuse (each
# is mapped anew and its pages faulted in); loads read either as fast.
CHUNK_BYTES = 8 << 20

# Threads of each rank that remove a replaced store's files (_remove_share).
REMOVERS = 4

# Chunk keys as "c.0.1" (Zarr v3's default encoding, "." separator): every chunk
# file lies in the store's own folder, so a save makes, syncs and later removes no
# folder per chunk, where "/" gives one per chunk of all but the last dim. Readers
# take the separator from zarr.json, so stores of either load alike.
SEPARATOR = "."


def zarr():
    """The zarr module (3 or later), with bfloat16 registered; ImportError that
    says how to install it. Local."""
    try:
        import zarr as module
    except ImportError:
        raise ImportError("Zarr stores need zarr-python 3: pip install 'mpitensor[io]' "
                          "(or zarr)") from None
    if int(module.__version__.split(".")[0]) < 3:
        raise ImportError(f"Zarr stores need zarr-python 3 or later; {module.__version__} "
                          f"is installed")
    if _dtypes.loaded_bfloat16() is not None:
        _register_bfloat16()
    return module


def _register_bfloat16() -> None:
    """Registers zarr-extensions' bfloat16 with zarr-python, once ml_dtypes is
    imported."""
    from zarr.core.dtype import data_type_registry

    bfloat16 = _dtypes.loaded_bfloat16()
    if bfloat16 is None or "bfloat16" in data_type_registry.contents:
        return
    from zarr.core.dtype.npy.float import BaseFloat

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class BFloat16(BaseFloat):
        """zarr-extensions' bfloat16, as ml_dtypes' bfloat16 in memory."""

        dtype_cls = type(bfloat16)
        _zarr_v3_name = "bfloat16"
        _zarr_v2_names = ()

        @property
        def item_size(self) -> int:
            return 2

        def to_native_dtype(self):
            return bfloat16

    data_type_registry.register("bfloat16", BFloat16)


def _grid(shape: tuple, placements, mesh_shape) -> list | None:
    """The chunk shape that makes every rank's box whole chunks, or None when the
    layout is no regular grid."""
    if _strided.has_strided(placements):
        return None
    chunks, cut = list(shape), set()
    for m, p in enumerate(placements):
        if p.is_shard():
            d = p.dim % len(shape)
            if d in cut:
                return None
            cut.add(d)
            chunks[d] = -(-shape[d] // mesh_shape[m])
    return [max(1, c) for c in chunks]


def _divisor_at_most(n: int, most: int) -> int:
    return max((k for k in range(1, min(n, most) + 1) if n % k == 0), default=1)


def _cut(chunks: list, itemsize: int, sharded: set) -> list:
    """``chunks`` cut along dims, first to last, until a chunk holds CHUNK_BYTES
    at most. A sharded dim is cut only into a divisor of its chunk (a rank's part
    stays whole chunks), and only when that divisor is not much smaller than
    needed."""
    chunks = list(chunks)
    for d in range(len(chunks)):
        nbytes = math.prod(chunks) * itemsize
        if nbytes <= CHUNK_BYTES:
            break
        want = max(1, chunks[d] * CHUNK_BYTES // nbytes)
        if d not in sharded:
            chunks[d] = want
        elif chunks[d] > 1:
            k = _divisor_at_most(chunks[d], want) if chunks[d] <= 1 << 20 else 1
            chunks[d] = k if 8 * k >= want else chunks[d]
    return chunks


def _layout(dt):
    """``dt`` in a layout of whole chunks (redistributed when it is not), and the
    chunk shape."""
    mesh = dt.device_mesh
    placements = _tensor.written_placements(dt.placements)
    if placements != tuple(dt.placements):
        dt = dt.redistribute(mesh, placements)
    if dt.ndim and _grid(dt.shape, placements, mesh.shape) is None:
        placements = tuple(Shard(m) if m < dt.ndim else Replicate()
                           for m in range(mesh.ndim))
        dt = dt.redistribute(mesh, placements)
    chunks = _grid(dt.shape, placements, mesh.shape) if dt.ndim else []
    sharded = {p.dim % dt.ndim for p in placements if p.is_shard()} if dt.ndim else set()
    return dt, _cut(chunks, dt.dtype.itemsize, sharded)


def _is_store(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, n)) for n in ("zarr.json", ".zarray",
                                                                ".zgroup"))


def check_target(path: str) -> bytes:
    """On the first rank, before a save: the directory to hold the store exists,
    and at ``path`` is nothing, an empty directory or a Zarr store (a save
    replaces nothing else); removes what killed saves left."""
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot save to {path!r}: the directory {parent!r} "
                                f"does not exist")
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise NotADirectoryError(f"cannot save a Zarr store to {path!r}: it is a "
                                     f"file; a save replaces Zarr stores only")
        # a store first: a store of many chunks is not listed to see it is not empty
        if not _is_store(path) and os.listdir(path):
            raise IsADirectoryError(f"cannot save a Zarr store to {path!r}: it is a "
                                    f"directory that holds no Zarr store")
    _paths.remove_leftovers(parent, [os.path.basename(path)])
    return b""


def _begin(path: str, shape: tuple, dtype: np.dtype, chunks: list, attrs) -> bytes:
    """On the first rank: a new store under a temporary name beside ``path``,
    holding the array's metadata; its name."""
    z = zarr()
    tmp = _paths.temp_name(path)
    os.mkdir(tmp)
    try:
        z.create_array(z.storage.LocalStore(tmp), shape=shape, chunks=tuple(chunks),
                       dtype=dtype, attributes=dict(attrs or {}), zarr_format=3,
                       chunk_key_encoding={"name": "default", "separator": SEPARATOR})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return os.fsencode(tmp)


def _chunk_keys(offsets: tuple, sizes: tuple, chunks: list) -> list:
    """The keys (SEPARATOR's) of the chunks that a box of whole chunks holds."""
    if not sizes:
        return ["c"]
    ranges = [range(o // c, (o + s - 1) // c + 1)
              for o, s, c in zip(offsets, sizes, chunks)]
    keys = [[]]
    for r in ranges:
        keys = [k + [i] for k in keys for i in r]
    return ["c" + SEPARATOR + SEPARATOR.join(map(str, k)) for k in keys]


def _encoder(arr, dtype: np.dtype):
    """The bytes zarr-python would store for a chunk of ``arr``, as a function of
    the chunk (whole, contiguous): for the codecs a save gives its arrays (bytes
    in little-endian order, then zstd) on a little-endian machine; None for any
    other, which zarr-python encodes."""
    z = zarr()
    codecs = arr.metadata.codecs
    if (sys.byteorder != "little" or dtype.byteorder == ">" or len(codecs) != 2
            or not isinstance(codecs[0], z.codecs.BytesCodec)
            or getattr(codecs[0].endian, "value", "little") != "little"
            or not isinstance(codecs[1], z.codecs.ZstdCodec)):
        return None
    # zarr-python's zstd codec is numcodecs' Zstd with the same level and checksum
    from numcodecs.zstd import Zstd

    zstd = Zstd(level=codecs[1].level, checksum=codecs[1].checksum)
    # Each chunk's output comes from malloc at zstd's bound for the chunk, and
    # is cut to the encoded size before it is freed. glibc maps a block above its
    # mmap threshold anew and raises the threshold to the size of a mapped block
    # freed, which the cut output never reaches: every chunk's output was a new
    # mapping whose pages faulted in anew, at a large share of the codec's time.
    # Freeing one mapped block above the bound (never touched) lifts the
    # threshold, so the outputs reuse the same memory.
    nbytes = math.prod(arr.chunks) * dtype.itemsize
    lift = np.empty(nbytes + nbytes // 128 + (64 << 10), np.uint8)
    del lift
    return lambda chunk: zstd.encode(chunk.reshape(-1).view(np.uint8))


def _all_fill(chunk: np.ndarray, fill) -> bool:
    """Whether zarr-python would leave ``chunk`` unstored (all of it the fill
    value), by its own comparison; its first element first, which settles most
    chunks without a pass over them."""
    nd = zarr().core.buffer.cpu.NDBuffer
    flat = chunk.reshape(-1)
    return all(nd.from_numpy_array(v).all_equal(fill) for v in (flat[:1], flat))


def _put(name: str, data) -> None:
    """A new file ``name`` in a store of this save's own, holding ``data``."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        view, done = memoryview(data).cast("B"), 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)


def _write_chunk(arr, encode, tmp: str, key: str, part: np.ndarray, at: list,
                 end: list) -> None:
    """The chunk ``key`` (``part``, from ``at`` to ``end`` in the array), encoded
    here by ``encode`` or, when that is None, by zarr-python."""
    if encode is None:
        arr[tuple(slice(a, e) for a, e in zip(at, end))] = part
        return
    fill = arr.metadata.fill_value
    if part.shape != arr.chunks:  # an edge chunk: stored whole, fill beyond
        whole = np.full(arr.chunks, fill, dtype=part.dtype)
        whole[tuple(slice(0, n) for n in part.shape)] = part
        part = whole
    part = np.ascontiguousarray(part)
    if not _all_fill(part, fill):
        _put(os.path.join(tmp, key), encode(part))


def _write(tmp: str, local: np.ndarray, offsets: tuple, chunks: list,
           durable: bool, old: str) -> None:
    """This rank's box into the store at ``tmp``, each of its chunk files synced
    when ``durable`` (files of its own, which no other rank writes; an all-fill
    chunk is not stored, as Zarr does). The store's folder, which names them all,
    is synced once every rank has written (_commit). The cached pages of the
    chunks of the store ``old``, which this save replaces, that hold the same
    elements (_old_chunks) are released just before (_io.release_cache), for the
    new chunk's to reuse."""
    z = zarr()
    arr = z.open_array(z.storage.LocalStore(tmp), mode="r+")
    covering = _old_chunks(old)
    encode, sizes = _encoder(arr, local.dtype), local.shape
    # One chunk at a time, so that a save holds one chunk's copy and its bytes
    # beside the data at most. Encoded here, the chunk skips zarr-python's event
    # loop, its temporary file and its rename, whose cost per chunk is a good
    # part of the codec's. Each chunk's file is synced by a thread while the next
    # chunk is encoded, so the device writes as the codec runs.
    with concurrent.futures.ThreadPoolExecutor(1) as syncer:
        syncs = []
        for key in _chunk_keys(offsets, sizes, chunks):
            index = [int(i) for i in key.split(SEPARATOR)[1:]]
            at = [max(i * c, o) for i, c, o in zip(index, chunks, offsets)]
            end = [min((i + 1) * c, o + s)
                   for i, c, o, s in zip(index, chunks, offsets, sizes)]
            part = local[tuple(slice(a - o, e - o) for a, e, o in zip(at, end, offsets))]
            for name in covering(at, end):
                _io.release_cache(os.path.join(old, name))
            _write_chunk(arr, encode, tmp, key, part, at, end)
            name = os.path.join(tmp, key)
            if durable and os.path.exists(name):
                syncs.append(syncer.submit(_paths.sync_file, name))
        for done in syncs:
            done.result()


def _old_chunks(old: str):
    """The keys of the chunks of the store ``old`` that hold any of a box (from
    ``at`` to ``end``), as a function of the box, by the old store's own chunk
    shape (its shards' when sharded: they are its files) and key encoding, which
    may differ from the new one's; no keys when ``old`` holds no array that
    zarr-python opens (nothing there, a group)."""
    z = zarr()
    try:
        arr = z.open_array(z.storage.LocalStore(old, read_only=True), mode="r")
        chunks, encode = arr.shards or arr.chunks, arr.metadata.encode_chunk_key
    except Exception:  # noqa: BLE001 - only a cache to release: none then
        return lambda at, end: []
    grid = [-(-n // c) for n, c in zip(arr.shape, chunks)]

    def covering(at: list, end: list) -> list:
        if len(at) != len(chunks):
            return []
        ranges = [range(a // c, min(-(-e // c), g))
                  for a, e, c, g in zip(at, end, chunks, grid)]
        return [encode(index) for index in itertools.product(*ranges)]
    return covering


def _drop_metadata(path: str) -> None:
    """Removes the metadata of the replaced store ``path``, before any chunk of it
    (see the module's comment)."""
    for name in ("zarr.json", ".zarray"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(path, name))


def _commit(tmp: str, path: str, durable: bool) -> bytes:
    """On the first rank, once every rank has written: the new store at ``path``;
    the name of the old one, its metadata removed, whose files the ranks remove
    next (_remove_share), or b"" when there was none."""
    if durable:
        _paths.sync_file(os.path.join(tmp, "zarr.json"))
        _paths.sync_dir(tmp)
    old = ""
    if not os.path.exists(path):
        os.rename(tmp, path)
    elif _io.exchange(tmp, path):
        old = tmp
    else:
        # Without an exchange the old store is moved aside first: for a moment
        # nothing is at the path, but the old store stays whole until the new one
        # is in place.
        old = _paths.temp_name(path)
        os.rename(path, old)
        os.rename(tmp, path)
    if old:
        _drop_metadata(old)
    if durable:
        _paths.sync_dir(os.path.dirname(path))
    return os.fsencode(old)


def _remover(mesh, placements) -> tuple | None:
    """(share, shares): this rank's share of a replaced store's files, among the
    ranks that wrote the new store (they see its folder, as the ranks of other
    nodes may not); None for a replica that wrote nothing."""
    if not _tensor._writes(mesh, placements):
        return None
    coord, share, shares = mesh.get_coordinate(), 0, 1
    for m, p in enumerate(placements):
        if p.is_shard():
            share, shares = share * mesh.shape[m] + coord[m], shares * mesh.shape[m]
    return share, shares


def _remove_share(old: str, share: int, shares: int) -> None:
    """Removes the files of the replaced store ``old`` that fall to ``share`` of
    ``shares`` (by a hash of the file's name, so that ranks listing the store while
    others remove from it agree on the shares), then tries each folder that held
    one, deepest first: the rank that empties a folder last removes it. An unlink
    waits on the file system's journal more than it computes, so REMOVERS threads
    overlap them. Errors are let be: what stays, the first rank removes next."""
    mine, folders = [], set()
    for folder, _, files in os.walk(old):
        for f in files:
            name = os.path.join(folder, f)
            if zlib.crc32(os.fsencode(os.path.relpath(name, old))) % shares == share:
                mine.append(name)
                folders.add(folder)
    for d in list(folders):
        while len(d) > len(old):  # up to the store's own folder
            d = os.path.dirname(d)
            folders.add(d)
    levels = {}
    for d in folders:
        levels.setdefault(d.count(os.sep), []).append(d)
    with concurrent.futures.ThreadPoolExecutor(REMOVERS) as pool:
        list(pool.map(_quietly(os.unlink), mine))
        for depth in sorted(levels, reverse=True):
            list(pool.map(_quietly(os.rmdir), levels[depth]))


def _quietly(remove):
    """``remove`` that lets an OSError be (a file gone already, or not ours)."""
    def attempt(name: str) -> None:
        with contextlib.suppress(OSError):
            remove(name)
    return attempt


def _remove_old(mesh, placements, old: str) -> None:
    """Collective on the mesh: the replaced store ``old`` removed, each writing rank
    its share of the files (_remove_share), then the first rank what is left (a
    share of a rank that could not see it, a symlink). A kill at any point leaves
    part of it under its temporary name, which the next save removes."""
    mine = _remover(mesh, placements)
    _agree.everywhere(mesh, lambda: mine and _remove_share(old, *mine),
                      lambda: OSError(f"cannot remove {old!r}"))
    if mesh.get_coordinate() == [0] * mesh.ndim and os.path.lexists(old):
        shutil.rmtree(old, ignore_errors=True)


def save(dt, path: str, attrs, durable: bool) -> None:
    """Collective on ``dt``'s mesh. Writes ``dt`` as a Zarr v3 array at the root of
    the store ``path`` (a directory, replaced whole), each rank writing whole
    chunks of its own.

    Example::

        >>> save(dt, "/data/u.zarr", {"units": "m/s"}, True)
    """
    mesh = dt.device_mesh
    if mesh.get_coordinate() is not None:
        # before the redistribution below: the agreement that a rank whose
        # arguments failed their checks has entered (checkpoint.save)
        _agree.same_path(mesh, path, lambda: check_target(path),
                         layout=repr(sorted(attrs or {})))
    dt, chunks = _layout(dt.detach())
    if mesh.get_coordinate() is None:
        return
    shape = tuple(dt.shape)
    tmp = os.fsdecode(_agree.first_rank(
        mesh, lambda: _begin(path, shape, dt.dtype, chunks, attrs)))
    try:
        local = np.ascontiguousarray(dt.to_local())
        sizes, offsets = compute_local_shape_and_global_offset(shape, mesh, dt.placements)
        writes = local.size > 0 and _tensor._writes(mesh, dt.placements)
        failed = []

        def attempt(step):
            try:
                if writes:
                    step()
            except Exception as e:  # noqa: BLE001 - raised on every rank just below
                failed.append(_stored._travels(e))
                raise

        _agree.everywhere(mesh, lambda: attempt(lambda: _write(
            tmp, local.reshape(tuple(sizes)), tuple(offsets), chunks, durable, path)),
            lambda: failed[0])
        old = os.fsdecode(_agree.first_rank(mesh, lambda: _commit(tmp, path, durable)))
    except BaseException:
        if mesh.get_coordinate() == [0] * mesh.ndim:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old:
        _remove_old(mesh, dt.placements, old)


def describe(opened) -> bytes:
    """On the first rank: the array at the root of the store ``opened`` holds (a
    directory), as JSON: shape, dtype and the metadata file a load checks for
    after reading. ValueError for a store that holds no valid array."""
    z = zarr()
    path = opened.path
    opened.directory = True
    _bfloat16_of(opened.name)
    try:
        arr = z.open_array(z.storage.LocalStore(opened.name, read_only=True), mode="r")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{path!r} holds no Zarr array at its root: "
                                f"{opened.local(str(e))}") from None
    except Exception as e:  # noqa: BLE001 - zarr's own errors, of many kinds
        raise ValueError(f"{path!r} holds no valid Zarr array at its root: "
                         f"{type(e).__name__}: {opened.local(str(e))}") from None
    dtype = np.dtype(arr.dtype)
    if (dtype.kind not in "biufc" and not _dtypes.is_bfloat16(dtype)) or dtype.fields:
        raise TypeError(f"{path!r} holds dtype {dtype}; DTensors hold numeric data "
                        f"(bool, int, uint, float, complex, bfloat16)")
    meta = "zarr.json" if arr.metadata.zarr_format == 3 else ".zarray"
    return json.dumps({"shape": list(arr.shape), "dtype": _npy.descr(dtype),
                       "meta": meta}).encode()


def _bfloat16_of(root: str) -> None:
    """Imports ml_dtypes and registers bfloat16 with zarr-python when the metadata
    of the store at ``root`` names bfloat16: zarr-python parses it as it opens the
    store, and the program may never have asked for bfloat16."""
    for name in ("zarr.json", ".zarray"):
        try:
            with open(os.path.join(root, name), "rb") as f:
                named = b'"bfloat16"' in f.read()
        except OSError:
            continue
        if named:
            try:
                _dtypes.require_bfloat16()
            except ImportError:
                return  # zarr-python's error names the data type
            _register_bfloat16()
        return


class ZarrReader(_stored.Reader):
    """Each rank's box of a Zarr array through zarr-python: the chunks it touches,
    from the store this rank holds open."""

    def __init__(self, opened, look: dict):
        self.opened, self.meta = opened, look["meta"]
        self.dtype = _npy.dtype_of(look["dtype"]).newbyteorder("=")

    def read(self, room, offsets: tuple, sizes: tuple) -> np.ndarray:
        room = room.reshape(sizes)
        if room.size == 0:
            return room
        z = zarr()
        try:
            arr = z.open_array(z.storage.LocalStore(self.opened.name, read_only=True),
                               mode="r")
            room[...] = arr[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
        except Exception as e:  # noqa: BLE001 - a codec's error on a damaged chunk
            self._check_whole()
            if isinstance(e, OSError):
                raise type(e)(self.opened.local(str(e))) from None
            raise ValueError(f"cannot read {self.opened.path!r}: a chunk is damaged: "
                             f"{type(e).__name__}: {self.opened.local(str(e))}") from None
        self._check_whole()
        return room

    def _check_whole(self) -> None:
        """OSError when the store has been removed (a save replaced it): its
        metadata goes first, so while it is there no chunk has gone."""
        if not os.path.exists(os.path.join(self.opened.name, self.meta)):
            raise OSError(f"{self.opened.path!r} was replaced while it was being "
                          f"loaded; load it again")


def load(opened, look: dict, mesh, placements, region):
    """Collective on the mesh. The array ``look`` describes (describe's JSON), in
    the store the ranks have agreed they hold open, or its ``region``, as a
    DTensor with ``placements``."""
    reader = ZarrReader(opened, look)
    return _stored.load(opened.path, tuple(look["shape"]), mesh, placements, reader,
                        region)
