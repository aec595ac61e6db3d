"""xarray Datasets whose variables are DTensors, written to netCDF-4 files and Zarr
stores and read back, each rank writing and reading its own block.

xarray's own writers would have every rank write the whole file (each rank runs
them), and h5py's file locks make that fail outright. Here the file's structure
(dimensions, coordinates, attributes, every variable's metadata and encoding, the
plain NumPy variables) is written by the first rank through xarray itself, with
each DTensor variable stood in for by a placeholder of its shape and dtype that
holds no values: xarray encodes it and has the backend create its dataset or
array, and our writer skips its values. Then each rank writes its own block of
each DTensor variable, encoded as xarray encodes the whole variable:

* netCDF-4 (HDF5): a DTensor variable's dataset is created contiguous and never
  filled, so allocating it writes nothing; the first rank allocates it and every
  rank writes its rows at the dataset's offset (the rows a torch.chunk of dim 0
  gives it), as mpitensor.save writes an HDF5 dataset. A chunked or compressed
  one (the variable's encoding asked for it) is written by the ranks in turn
  through h5py, each its own hyperslab.
* Zarr: each DTensor variable is chunked as its blocks lie (mpitensor.save's
  chunk grid), so each rank writes whole chunks of its own through zarr-python.

Both are written under a temporary name and put at the path once every rank is
done, so a file or store that a write replaces is replaced whole or not at all.

Reads open the file lazily on every rank; each rank decodes (through xarray) only
its block of each data variable and wraps it as a DTensor.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import os
import shutil

import numpy as np

from .._args import resolve_mesh
from .._dtensor import DTensor
from .._dtensor_spec import contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..array_api._creation import default_mesh, default_placements
from . import _agree, _hdf5, _paths, _tensor, _zarr

__all__ = ["to_netcdf", "to_zarr", "open_dataset"]


def _xarray():
    try:
        import xarray
    except ImportError:
        raise ImportError("Datasets need xarray: pip install 'mpitensor[io]' (or "
                          "xarray h5netcdf)") from None
    return xarray


def _writers():
    """xarray's dump_to_store and get_writable_zarr_store, which moved from
    backends.api to backends.writers."""
    try:
        from xarray.backends import writers
    except ImportError:
        from xarray.backends import api as writers
    return writers


def _h5netcdf() -> None:
    try:
        import h5netcdf  # noqa: F401
    except ImportError:
        raise ImportError("netCDF-4 files need h5netcdf: pip install 'mpitensor[io]' "
                          "(or h5netcdf)") from None


def _distributed(ds) -> dict:
    """The Dataset's variables that hold DTensors, by name."""
    return {name: v.data for name, v in ds.variables.items()
            if isinstance(v._data, DTensor)}


def _mesh_of(ds, tensors: dict):
    """The one mesh every DTensor variable lives on (else the default mesh of
    mpitensor.array_api); ValueError when they live on several."""
    meshes = {id(t.device_mesh): t.device_mesh for t in tensors.values()}
    if len(meshes) > 1:
        raise ValueError("the Dataset's DTensor variables live on different meshes; "
                         "redistribute them onto one first")
    if meshes:
        return next(iter(meshes.values()))
    return default_mesh()


def _first(mesh) -> bool:
    return mesh.get_coordinate() == [0] * mesh.ndim


# --- the structure, written by the first rank through xarray -------------------


class _Placeholder:
    """A DTensor variable's shape and dtype, without values: what xarray's writer is
    given in its place. A duck array to xarray, so that it passes through the
    encoding untouched (it is encoded already: _structure); anything that
    would still compute on it raises instead of gathering the values."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim, self.size = len(self.shape), math.prod(self.shape)

    def _refuse(self, *args, **kwargs):
        raise TypeError("this encoding of a DTensor variable needs all of its values "
                        "at once; drop it from the variable's encoding, or compute "
                        "it before writing")

    __array__ = __getitem__ = astype = _refuse

    def __array_function__(self, func, types, args, kwargs):
        self._refuse()

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        self._refuse()


def _holds_placeholder(source, placeholder) -> bool:
    """Whether ``source`` (what xarray hands its writer) is the placeholder, or
    xarray's lazy wrappers of it (an encoding's elementwise function, say)."""
    for _ in range(32):
        if isinstance(source, placeholder):
            return True
        source = getattr(source, "array", None)
        if source is None:
            return False
    return False


def _skipping_writer(placeholder):
    from xarray.backends.common import ArrayWriter

    class SkippingWriter(ArrayWriter):
        """xarray's writer, which leaves the placeholders' variables unwritten."""

        def add(self, source, target, region=None):
            if not _holds_placeholder(source, placeholder):
                super().add(source, target, region)

    return SkippingWriter()


def _with_encoding(ds, encoding):
    """``ds`` (shallow copy) with ``encoding=``'s entries as its variables'
    encodings, as xarray's writers take them (replacing, not merging)."""
    out = ds.copy(deep=False)
    for name, enc in (encoding or {}).items():
        if name in out.variables:
            out.variables[name].encoding = dict(enc)
    return out


def _structure(ds, tensors: dict, encoding):
    """``ds`` with every DTensor variable a placeholder of its shape, and the
    encodings to write it with. A placeholder is the variable already encoded:
    its stored dtype and attributes (fill value, scale and offset), found by
    encoding an empty array of its dtype, and the encoding left (chunks,
    compression), which xarray's second pass leaves as it is; so xarray never
    computes on the values, whatever the encoding packs them into."""
    xr = _xarray()
    out = ds.copy(deep=False)
    encoding = {k: dict(v) for k, v in (encoding or {}).items()}
    for name, t in tensors.items():
        v = ds.variables[name]
        empty = np.zeros((0,) * t.ndim, t.dtype)
        e = xr.conventions.encode_cf_variable(xr.Variable(v.dims, empty, v.attrs,
                                                          v.encoding), name=name)
        out[name] = xr.Variable(v.dims, _Placeholder(t.shape, e.dtype), e.attrs,
                                e.encoding)
        if name in encoding:
            encoding[name] = dict(e.encoding)
    return out, _Placeholder, encoding


def _encoded_block(ds, name: str, block: np.ndarray) -> np.ndarray:
    """``block`` (part of the variable ``name``) as xarray stores it: through the
    same encoding (fill values, scale and offset, dtype) the whole variable has."""
    xr = _xarray()
    v = ds.variables[name]
    enc = xr.conventions.encode_cf_variable(xr.Variable(v.dims, block, v.attrs,
                                                        v.encoding), name=name)
    return _c_order(np.asarray(enc.values))


def _c_order(a) -> np.ndarray:
    """``a`` as a C-ordered ndarray of its own dims (np.ascontiguousarray would
    make a 0-d one 1-d)."""
    return np.asarray(a, order="C")


def _rows_block(t: DTensor):
    """The DTensor in rows (Shard(0) on every mesh dim, as _hdf5 writes), this
    rank's part, its first row and whether this rank writes it (one replica of a
    0-d one)."""
    t = _hdf5._rows(t.detach())
    mesh = t.device_mesh
    local = _c_order(t.to_local())
    if t.ndim == 0:
        return local, 0, _first(mesh)
    _, starts = compute_local_shape_and_global_offset(t.shape, mesh, t.placements)
    return local, starts[0], local.size > 0


def _each_rank(mesh, step) -> None:
    """Collective: ``step()`` on every rank; its failure on any raised on all."""
    failed = []

    def attempt():
        try:
            step()
        except Exception as e:  # noqa: BLE001 - raised on every rank just below
            failed.append(e if isinstance(e, (OSError, ValueError, TypeError))
                          else OSError(f"{type(e).__name__}: {e}"))
            raise

    _agree.everywhere(mesh, attempt, lambda: failed[0])


# --- netCDF-4 ------------------------------------------------------------------


def _unfilled_store(path: str, names: set):
    """xarray's h5netcdf store whose DTensor variables are created with no fill:
    allocating one then writes nothing, so that each rank's rows are the only
    bytes written there."""
    from xarray.backends import H5NetCDFStore

    class Store(H5NetCDFStore):
        def prepare_variable(self, name, variable, check_encoding=False,
                             unlimited_dims=None):
            if name not in names:
                return super().prepare_variable(name, variable, check_encoding,
                                                unlimited_dims)
            # a creation property list of our own (h5py's fill_time= is newer
            # than the h5py versions mpitensor takes), which h5py completes
            h5py = _hdf5.h5py()
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            group = self.ds
            group.create_variable = functools.partial(type(group).create_variable,
                                                      group, dcpl=dcpl)
            try:
                return super().prepare_variable(name, variable, check_encoding,
                                                unlimited_dims)
            finally:
                del group.create_variable

    return Store.open(path, mode="w")


def _netcdf_skeleton(ds, tensors: dict, path: str, encoding, unlimited_dims) -> bytes:
    """On the first rank: the file's structure under a temporary name beside
    ``path``, every DTensor variable's dataset allocated when contiguous; JSON of
    the temporary name, its inode and each such dataset's offset (None when
    chunked) and stored dtype."""
    dump_to_store = _writers().dump_to_store
    h5py = _hdf5.h5py()
    _paths.check_target(path)
    tmp = _paths.temp_name(path)
    try:
        structure, placeholder, encoding = _structure(ds, tensors, encoding)
        store = _unfilled_store(tmp, set(tensors))
        try:
            dump_to_store(structure, store, _skipping_writer(placeholder),
                          encoding=encoding, unlimited_dims=unlimited_dims)
        finally:
            store.close()
        out = {}
        with h5py.File(tmp, "r+") as f:
            for name in tensors:
                d = f[name]
                plist = d.id.get_create_plist()
                contiguous = plist.get_layout() == h5py.h5d.CONTIGUOUS
                if contiguous and d.size and d.id.get_offset() is None:
                    _hdf5._allocate(d)
                offset = d.id.get_offset() if contiguous else None
                out[name] = [offset if d.size else None, d.dtype.str]
            inode = os.fstat(f.id.get_vfd_handle()).st_ino
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return json.dumps({"tmp": tmp, "inode": inode, "vars": out}).encode()


def _write_rows(path: str, inode: int, data: np.ndarray, at: int, durable: bool) -> None:
    """This rank's rows, at byte ``at`` of the file (a seam for tests that count
    what each rank writes)."""
    _hdf5._write_rows(path, inode, data, at, durable)


def _write_hyperslab(path: str, name: str, data: np.ndarray, start: int) -> None:
    h5py = _hdf5.h5py()
    with h5py.File(path, "r+") as f:
        d = f[name]
        if d.ndim == 0:
            d[()] = data
        else:
            d[start:start + data.shape[0]] = data


def _rank_of(mesh) -> int:
    coord = mesh.get_coordinate()
    return int(np.ravel_multi_index(coord, mesh.shape)) if mesh.ndim else 0


def to_netcdf(ds, path, *, encoding=None, unlimited_dims=None, durable=True) -> None:
    """Writes an xarray Dataset whose variables may be DTensors as one netCDF-4
    file, each rank writing its own block of each DTensor variable.

    Collective on the DTensors' mesh (every rank of it calls with the same
    Dataset structure and path; without DTensor variables, on the default mesh
    of ``mpitensor.array_api``). The first rank writes the file's structure
    through xarray's h5netcdf backend: dimensions, coordinates, attributes, the
    plain NumPy variables, and every variable's metadata and ``encoding``
    (``encoding=`` and ``unlimited_dims=`` as ``Dataset.to_netcdf`` takes them).
    Then each rank writes its rows of each DTensor variable, encoded as xarray
    encodes the whole variable; nothing is gathered, no rank holds more than its
    block. A contiguous variable (the default) is written by every rank at once
    at its offset in the file; a chunked or compressed one by the ranks in turn.
    The file is written under a temporary name and renamed over ``path`` once
    every rank is done (and synced, unless ``durable=False``), so a file there
    is replaced whole or not at all. Plain ``xarray.open_dataset(path,
    engine="h5netcdf")`` reads it; :func:`open_dataset` reads it back as
    DTensors. A failure on any rank raises the same exception on every rank.

    Example (``mpiexec -n 4``)::

        >>> import xarray as xr, mpitensor.array_api as xp
        >>> ds = xr.Dataset({"t": (("y", "x"), xp.asarray(np.ones((10, 3))))},
        ...                 coords={"x": [0.0, 1.0, 2.0]}, attrs={"title": "run"})
        >>> mpitensor.to_netcdf(ds, "run.nc")
        >>> xr.open_dataset("run.nc", engine="h5netcdf")["t"].shape
        (10, 3)
    """
    _xarray()
    ds = _with_encoding(ds, encoding)
    tensors = _distributed(ds)
    mesh = _mesh_of(ds, tensors)
    path = os.path.realpath(os.fspath(path))
    _h5netcdf()
    if mesh.get_coordinate() is None:
        return
    _agree.same_path(mesh, path, layout=repr(sorted(map(str, ds.variables))))
    rows = {name: _rows_block(t) for name, t in tensors.items()}
    got = json.loads(_agree.first_rank(mesh, lambda: _netcdf_skeleton(
        ds, tensors, path, encoding, unlimited_dims)))
    tmp, inode = got["tmp"], got["inode"]
    try:
        encoded = {}

        def encode():
            for name, (local, _, writes) in rows.items():
                if writes:
                    block = _encoded_block(ds, name, local)
                    if block.dtype.str != got["vars"][name][1]:
                        block = block.astype(np.dtype(got["vars"][name][1]))
                    encoded[name] = block

        _each_rank(mesh, encode)

        def parallel():
            for name, (offset, _) in got["vars"].items():
                if offset is not None and name in encoded:
                    block, start = encoded[name], rows[name][1]
                    row = math.prod(tensors[name].shape[1:]) * block.dtype.itemsize
                    _write_rows(tmp, inode, block, offset + start * row, durable)

        _each_rank(mesh, parallel)
        in_turn = [n for n, (offset, _) in got["vars"].items()
                   if offset is None and tensors[n].size]
        if in_turn:
            # HDF5 cannot take writes from several processes at once (each would
            # rewrite the chunk index): the ranks take turns, each its hyperslab.
            me = _rank_of(mesh)
            for turn in range(mesh.size()):
                def mine():
                    if turn == me:
                        for n in in_turn:
                            if n in encoded:
                                _write_hyperslab(tmp, n, encoded[n], rows[n][1])
                _each_rank(mesh, mine)
        if durable:
            _hdf5._sync_once(mesh, tmp)

        def commit() -> bytes:
            os.replace(tmp, path)
            if durable:
                _paths.sync_dir(os.path.dirname(path))
            return b""

        _agree.first_rank(mesh, commit)
    except BaseException:
        if _first(mesh):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


# --- Zarr ----------------------------------------------------------------------


def _zarr_blocks(tensors: dict, encoding: dict) -> dict:
    """Each DTensor variable in a layout of whole chunks (mpitensor.save's), this
    rank's box and whether it writes it, and the chunk shape: the encoding's own
    when it asked for one (checked below to be whole chunks on every rank)."""
    out = {}
    for name, t in tensors.items():
        t, chunks = _zarr._layout(t.detach())
        mesh = t.device_mesh
        sizes, offsets = compute_local_shape_and_global_offset(t.shape, mesh,
                                                               t.placements)
        local = _c_order(t.to_local())
        writes = local.size > 0 and _tensor._writes(mesh, t.placements)
        enc = encoding.get(name) or {}
        asked = enc.get("chunks")
        out[name] = (local, tuple(offsets), writes, list(asked) if asked else chunks,
                     list(enc.get("shards") or asked or chunks))
    return out


def _check_chunks(tensors: dict, blocks: dict) -> None:
    """ValueError when a rank's box is not whole chunks of its variable: two ranks
    would write the same chunk, and one would lose the other's part."""
    for name, (local, offsets, writes, _, chunks) in blocks.items():
        if not writes or not local.ndim:
            continue
        shape = tensors[name].shape
        for o, s, c, n in zip(offsets, local.shape, chunks, shape):
            if o % c or ((o + s) % c and o + s != n):
                raise ValueError(f"the Zarr chunks {tuple(chunks)} of {name!r} cut "
                                 f"across the blocks of the ranks; leave its "
                                 f"encoding's 'chunks' to mpitensor or make each "
                                 f"block whole chunks")


def _zarr_skeleton(ds, tensors: dict, path: str, encoding: dict, chunks: dict,
                   zarr_format) -> bytes:
    """On the first rank: the store's structure under a temporary name beside
    ``path``, every DTensor variable an array with no chunk written; the name."""
    writers = _writers()
    dump_to_store, get_writable_zarr_store = (writers.dump_to_store,
                                              writers.get_writable_zarr_store)

    _zarr.check_target(path)
    tmp = _paths.temp_name(path)
    try:
        structure, placeholder, enc = _structure(ds, tensors, encoding)
        for name, c in chunks.items():
            enc.setdefault(name, {})["chunks"] = tuple(c)
        store = get_writable_zarr_store(tmp, mode="w-", zarr_format=zarr_format)
        try:
            store._validate_encoding(enc)
            dump_to_store(structure, store, _skipping_writer(placeholder), encoding=enc)
        finally:
            store.close()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return os.fsencode(tmp)


def _write_box(tmp: str, name: str, block: np.ndarray, offsets: tuple,
               durable: bool = False) -> None:
    """This rank's box of the array ``name`` (whole chunks of its own), its chunk
    files synced when ``durable`` (no other rank writes them)."""
    z = _zarr.zarr()
    arr = z.open_array(z.storage.LocalStore(tmp), path=name, mode="r+")
    if block.ndim == 0:
        arr[()] = block
    else:
        arr[tuple(slice(o, o + s) for o, s in zip(offsets, block.shape))] = block
    if not durable or not block.size:
        return
    grid = arr.shards or arr.chunks
    ranges = [range(o // c, -(-(o + s) // c)) for o, s, c in zip(offsets, block.shape,
                                                                    grid)]
    for index in itertools.product(*ranges):
        key = os.path.join(tmp, name, *arr.metadata.encode_chunk_key(index).split("/"))
        if os.path.exists(key):  # an all-fill chunk is not stored
            _paths.sync_file(key)


def _sync_structure(tmp: str) -> None:
    """On the first rank, once every rank has synced its chunks: the store's
    metadata files and every folder, which name the chunks."""
    for folder, _, files in os.walk(tmp):
        for f in files:
            if f in ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"):
                _paths.sync_file(os.path.join(folder, f))
        _paths.sync_dir(folder)


def _commit_store(tmp: str, path: str, durable: bool) -> bytes:
    """On the first rank, once every rank has written (and synced) its chunks: the
    store's structure synced, then the store put at ``path`` (_zarr._commit, whose
    own sync looks for a Zarr v3 root only); the old store's name, or b""."""
    if durable:
        _sync_structure(tmp)
    old = _zarr._commit(tmp, path, False)
    if durable:
        _paths.sync_dir(os.path.dirname(path))
    return old


def to_zarr(ds, path, *, encoding=None, zarr_format=None, durable=True) -> None:
    """Writes an xarray Dataset whose variables may be DTensors as one Zarr store,
    each rank writing its own chunks of each DTensor variable.

    Collective on the DTensors' mesh (every rank of it calls with the same
    Dataset structure and path; without DTensor variables, on the default mesh
    of ``mpitensor.array_api``). The first rank writes the store's structure
    through xarray's Zarr backend (``encoding=`` and ``zarr_format=`` as
    ``Dataset.to_zarr`` takes them): groups, coordinates, attributes, the plain
    NumPy variables, every variable's metadata. Each DTensor variable is chunked
    as it is sharded (a chunk never spans two ranks' blocks; an ``encoding``
    that asks for chunks that do raises ValueError), and each rank writes its
    chunks, encoded as xarray encodes the whole variable: nothing is gathered.
    The store is written under a temporary name and put at ``path`` once every
    rank is done, so a store there is replaced whole or not at all. Plain
    ``xarray.open_zarr(path)`` reads it; :func:`open_dataset` reads it back as
    DTensors. A failure on any rank raises the same exception on every rank.

    Example (``mpiexec -n 4``)::

        >>> ds = xr.Dataset({"t": (("y", "x"), xp.asarray(np.ones((10, 3))))})
        >>> mpitensor.to_zarr(ds, "run.zarr")
        >>> xr.open_zarr("run.zarr")["t"].shape
        (10, 3)
    """
    _xarray()
    _zarr.zarr()
    ds = _with_encoding(ds, encoding)
    tensors = _distributed(ds)
    for name in tensors:
        if name not in (encoding or {}):
            # chunks a variable kept from the store it was read from need not
            # follow the blocks of the ranks now: it is chunked as it is sharded
            for key in ("chunks", "preferred_chunks", "shards"):
                ds.variables[name].encoding.pop(key, None)
    mesh = _mesh_of(ds, tensors)
    path = os.path.realpath(os.fspath(path))
    if mesh.get_coordinate() is None:
        return
    _agree.same_path(mesh, path, layout=repr(sorted(map(str, ds.variables))))
    encoding = dict(encoding or {})
    blocks = _zarr_blocks(tensors, encoding)
    _each_rank(mesh, lambda: _check_chunks(tensors, blocks))
    chunks = {name: b[3] for name, b in blocks.items()}
    tmp = os.fsdecode(_agree.first_rank(mesh, lambda: _zarr_skeleton(
        ds, tensors, path, encoding, chunks, zarr_format)))
    try:
        def write():
            for name, (local, offsets, writes, _, _) in blocks.items():
                if writes:
                    _write_box(tmp, name, _encoded_block(ds, name, local), offsets,
                               durable)

        _each_rank(mesh, write)
        old = os.fsdecode(_agree.first_rank(mesh, lambda: _commit_store(tmp, path,
                                                                          durable)))
    except BaseException:
        if _first(mesh):
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old and _first(mesh):
        shutil.rmtree(old, ignore_errors=True)


# --- reading -------------------------------------------------------------------


def _engine(path: str, engine):
    if engine is not None:
        return engine
    if os.path.isdir(path):
        return "zarr"
    _h5netcdf()
    return "h5netcdf"


def _placements_for(name, placements, mesh, ndim: int):
    pl = placements.get(name) if isinstance(placements, dict) else placements
    return tuple(pl) if pl is not None else default_placements(mesh, ndim)


def _numeric(dtype: np.dtype) -> bool:
    return dtype.kind in "biufc" and dtype.fields is None


def open_dataset(path, mesh=None, placements=None, engine=None, **kwargs):
    """Reads a netCDF-4/HDF5 file or a Zarr store as an xarray Dataset whose
    numeric data variables are DTensors, each rank reading and decoding only its
    block of each.

    Collective on ``mesh`` (default: the current ``with mesh:``, else the world,
    as ``mpitensor.array_api`` makes arrays). Every rank opens the file lazily
    through xarray (``engine=``: ``"h5netcdf"`` for a file, ``"zarr"`` for a
    directory, by default; ``**kwargs`` go to ``xarray.open_dataset``), then each
    data variable of a numeric dtype becomes a DTensor with ``placements`` (one
    list for every variable, or a dict of names to lists; default ``Shard(0)``
    on every mesh dim, Replicate for a 0-d variable), each rank reading only the
    chunks or rows of its own block and decoding them as xarray does (fill
    values to NaN, scale and offset). Coordinates and non-numeric variables
    (times, strings) come back as plain NumPy on every rank; attributes and
    encodings are kept, so :func:`to_netcdf` writes the Dataset back alike. The
    file is closed before it returns. A failure on any rank raises the same
    exception on every rank.

    Example (``mpiexec -n 4``)::

        >>> ds = mpitensor.open_dataset("run.nc")
        >>> ds["t"].data.placements
        (Shard(dim=0),)
        >>> float(ds["t"].mean())
        1.0
    """
    xr = _xarray()
    mesh = resolve_mesh(mesh) if mesh is not None else default_mesh()
    path = os.path.realpath(os.fspath(path))
    engine = _engine(path, engine)
    member = mesh.get_coordinate() is not None
    if member:
        _agree.same_path(mesh, path, layout=repr((engine, placements)))
    opened = []

    def open_():
        opened.append(xr.open_dataset(path, engine=engine, **kwargs))

    (_each_rank(mesh, open_) if member else open_())
    src = opened[0]
    try:
        data_vars, plain = {}, {}

        def read():
            for name, v in src.data_vars.items():
                if not _numeric(v.dtype):
                    plain[name] = v.variable.load()
                    continue
                pl = _placements_for(name, placements, mesh, v.ndim)
                shape = tuple(v.shape)
                if member:
                    sizes, offsets = compute_local_shape_and_global_offset(shape, mesh, pl)
                    box = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
                    local = _c_order(v.variable[box].values)
                else:
                    local = np.empty((0,), v.dtype)
                data_vars[name] = (v, local, pl, shape)

        (_each_rank(mesh, read) if member else read())
        coords = {name: c.variable.load() for name, c in src.coords.items()}
        out_vars = dict(plain)
        for name, (v, local, pl, shape) in data_vars.items():
            dt = DTensor.from_local(local, mesh, pl, shape=shape,
                                    stride=contiguous_strides(shape))
            out_vars[name] = xr.Variable(v.dims, dt, v.attrs, v.encoding)
        out = xr.Dataset({n: out_vars[n] for n in src.data_vars}, coords=coords,
                         attrs=src.attrs)
        out.encoding = dict(src.encoding)
        return out
    finally:
        src.close()

