"""xarray Datasets of DTensors written to netCDF-4 and Zarr and read back.

mpitensor.to_netcdf and mpitensor.to_zarr write a Dataset whose variables are
DTensors (rows sharded over the world, uneven at np 3) with coordinates,
attributes and plain NumPy variables; plain xarray on one rank reads the same
values, and mpitensor.open_dataset reads them back as DTensors on every rank.
Each rank writes its own block only and nothing is gathered.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.array_api as xp
from mpitensor.checkpoint import _xarray
from mpitensor.debug import CommDebugMode

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")
pytest.importorskip("zarr")

ROWS = 7  # 3, 3, 1 at np 3: uneven blocks

A = np.arange(ROWS * 4, dtype=np.float64).reshape(ROWS, 4) / 3
B = np.linspace(-1, 1, ROWS).astype(np.float32)
N = (np.arange(ROWS * 4, dtype=np.int64).reshape(ROWS, 4) - 9) * 1000003
K = np.arange(ROWS, dtype=np.int32) * -7


def _dataset(a=A):
    return xr.Dataset(
        {"a": (("y", "x"), xp.asarray(a), {"units": "K", "long_name": "temperature"}),
         "b": ("y", xp.asarray(B), {"units": "m"}),
         "n": (("y", "x"), xp.asarray(N)),
         "k": ("y", xp.asarray(K)),
         "p": ("x", np.array([0.5, 1.5, 2.5, 3.5]), {"note": "plain"})},
        coords={"y": np.arange(ROWS) * 10, "x": np.array([0.0, 0.25, 0.5, 0.75]),
                "label": ("x", np.array([1, 2, 3, 4], np.int16))},
        attrs={"title": "run", "step": 7})


def _check_plain(got, a=A):
    """A Dataset read by plain xarray holds the values written, exactly."""
    want = {"a": a, "b": B, "n": N, "k": K, "p": np.array([0.5, 1.5, 2.5, 3.5])}
    assert set(got.data_vars) == set(want)
    for name, values in want.items():
        assert got[name].dtype == values.dtype, name
        np.testing.assert_array_equal(got[name].values, values)
    assert got["a"].dims == ("y", "x") and got["b"].dims == ("y",)
    assert got["a"].attrs["units"] == "K" and got["a"].attrs["long_name"] == "temperature"
    assert got["p"].attrs["note"] == "plain"
    np.testing.assert_array_equal(got["y"].values, np.arange(ROWS) * 10)
    np.testing.assert_array_equal(got["x"].values, [0.0, 0.25, 0.5, 0.75])
    np.testing.assert_array_equal(got["label"].values, [1, 2, 3, 4])
    assert got.attrs["title"] == "run" and int(got.attrs["step"]) == 7


def _check_distributed(got, a=A):
    """A Dataset read by mpitensor.open_dataset: DTensor data variables of the
    values written, rows sharded; coordinates plain NumPy."""
    want = {"a": a, "b": B, "n": N, "k": K, "p": np.array([0.5, 1.5, 2.5, 3.5])}
    for name, values in want.items():
        data = got[name].data
        assert isinstance(data, mt.DTensor), name
        assert data.placements == (mt.Shard(0),)
        assert data.dtype == values.dtype
        np.testing.assert_array_equal(data.full_tensor(), values)
        sizes, _ = mt.compute_local_shape_and_global_offset(data.shape, data.device_mesh,
                                                            data.placements)
        assert data.to_local().shape == tuple(sizes)
    for name in ("x", "y", "label"):
        assert isinstance(got[name].values, np.ndarray)
        assert not isinstance(got[name].data, mt.DTensor)
    np.testing.assert_array_equal(got["y"].values, np.arange(ROWS) * 10)
    np.testing.assert_array_equal(got["label"].values, [1, 2, 3, 4])
    assert got["a"].attrs["units"] == "K"
    assert got.attrs["title"] == "run"


def _read_plain(path, engine):
    if engine == "zarr":
        with xr.open_zarr(path) as ds:
            return ds.load()
    with xr.open_dataset(path, engine=engine) as ds:
        return ds.load()


WRITERS = {"netcdf": (_xarray.to_netcdf, "x.nc", "h5netcdf"),
           "zarr": (_xarray.to_zarr, "x.zarr", "zarr")}


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_round_trip(folder, comm, fmt):
    write, name, engine = WRITERS[fmt]
    path = os.path.join(folder, name)
    write(_dataset(), path)
    if comm.Get_rank() == 0:
        _check_plain(_read_plain(path, engine))
    comm.Barrier()
    _check_distributed(mt.open_dataset(path))


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_replaces_whole(folder, comm, fmt):
    write, name, engine = WRITERS[fmt]
    path = os.path.join(folder, name)
    write(_dataset(), path)
    write(_dataset(A * 2), path)
    if comm.Get_rank() == 0:
        _check_plain(_read_plain(path, engine), A * 2)
        assert sorted(os.listdir(folder)) == [name]  # no temporary left
    comm.Barrier()
    _check_distributed(mt.open_dataset(path), A * 2)


def test_zarr_format_2(folder, comm):
    path = os.path.join(folder, "x.zarr")
    _xarray.to_zarr(_dataset(), path, zarr_format=2)
    _xarray.to_zarr(_dataset(A * 2), path, zarr_format=2)
    assert os.path.exists(os.path.join(path, ".zgroup"))
    if comm.Get_rank() == 0:
        _check_plain(_read_plain(path, "zarr"), A * 2)
    comm.Barrier()
    _check_distributed(mt.open_dataset(path), A * 2)


def test_public_names():
    assert mt.to_netcdf is _xarray.to_netcdf and mt.to_zarr is _xarray.to_zarr
    assert mt.open_dataset is _xarray.open_dataset
    for f in (mt.to_netcdf, mt.to_zarr, mt.open_dataset):
        assert "Collective" in f.__doc__ and "Example" in f.__doc__


def test_netcdf_rank_writes_only_its_rows(folder, monkeypatch):
    """Each rank writes the bytes of its own rows of each DTensor variable, once,
    and no collective gathers any of them."""
    written = []
    real = _xarray._write_rows

    def spy(path, inode, data, at, durable):
        written.append(data.nbytes)
        real(path, inode, data, at, durable)

    monkeypatch.setattr(_xarray, "_write_rows", spy)
    ds = _dataset()
    mine = sum(ds[n].data.to_local().nbytes for n in ("a", "b", "n", "k"))
    with CommDebugMode() as comm_mode:
        _xarray.to_netcdf(ds, os.path.join(folder, "x.nc"))
    assert sum(written) == mine
    counts = comm_mode.get_comm_counts()
    assert counts["all_gather_into_tensor"] == 0 and counts["all_to_all_single"] == 0


def test_zarr_rank_writes_only_its_block(folder, monkeypatch):
    written = []
    real = _xarray._write_box

    def spy(tmp, name, block, offsets, durable=False):
        written.append((name, block.shape, offsets))
        real(tmp, name, block, offsets, durable)

    monkeypatch.setattr(_xarray, "_write_box", spy)
    ds = _dataset()
    with CommDebugMode() as comm_mode:
        _xarray.to_zarr(ds, os.path.join(folder, "x.zarr"))
    for name, shape, offsets in written:
        dt = ds[name].data
        sizes, starts = mt.compute_local_shape_and_global_offset(dt.shape, dt.device_mesh,
                                                                 dt.placements)
        assert shape == tuple(sizes) and offsets == tuple(starts)
    assert {w[0] for w in written} <= {"a", "b", "n", "k"}
    assert comm_mode.get_comm_counts()["all_gather_into_tensor"] == 0


def test_netcdf_chunked_and_compressed(folder, comm):
    """A variable whose encoding asks for chunks and compression is written by the
    ranks in turn, each its own rows."""
    path = os.path.join(folder, "x.nc")
    _xarray.to_netcdf(_dataset(), path,
                      encoding={"a": {"zlib": True, "complevel": 4, "chunksizes": (2, 4)},
                                "n": {"chunksizes": (3, 2)}})
    if comm.Get_rank() == 0:
        got = _read_plain(path, "h5netcdf")
        _check_plain(got)
        assert got["a"].encoding["chunksizes"] == (2, 4)
    comm.Barrier()
    _check_distributed(mt.open_dataset(path))


def test_netcdf_unlimited_dim(folder, comm):
    """An unlimited dim makes its variables chunked: written by the ranks in turn."""
    path = os.path.join(folder, "x.nc")
    _xarray.to_netcdf(_dataset(), path, unlimited_dims=["y"])
    if comm.Get_rank() == 0:
        got = _read_plain(path, "h5netcdf")
        _check_plain(got)
        assert "y" in got.encoding["unlimited_dims"]
    comm.Barrier()
    _check_distributed(mt.open_dataset(path))


def test_zarr_chunks_across_blocks_raise_everywhere(folder, comm):
    """Chunks that two ranks' blocks share would lose one rank's part: refused on
    every rank; chunks within the blocks are kept."""
    path = os.path.join(folder, "x.zarr")
    if comm.Get_size() > 1:
        with pytest.raises(ValueError, match="cut across the blocks"):
            _xarray.to_zarr(_dataset(), path, encoding={"a": {"chunks": (5, 4)}})
    _xarray.to_zarr(_dataset(), path, encoding={"a": {"chunks": (1, 2)}})
    if comm.Get_rank() == 0:
        got = _read_plain(path, "zarr")
        _check_plain(got)
        assert tuple(got["a"].encoding["chunks"]) == (1, 2)
    comm.Barrier()


def test_sharded_columns_are_written_as_rows(folder, comm):
    """A DTensor sharded along another dim is redistributed into rows, not
    gathered."""
    mesh = mt.init_device_mesh("cpu", (comm.Get_size(),))
    cols = mt.distribute_tensor(A, mesh, [mt.Shard(1)])
    ds = xr.Dataset({"a": (("y", "x"), cols)})
    for write, name, engine in WRITERS.values():
        path = os.path.join(folder, name)
        write(ds, path)
        if comm.Get_rank() == 0:
            np.testing.assert_array_equal(_read_plain(path, engine)["a"].values, A)
        comm.Barrier()


def test_open_dataset_placements(folder, comm):
    path = os.path.join(folder, "x.nc")
    _xarray.to_netcdf(_dataset(), path)
    got = mt.open_dataset(path, placements={"a": [mt.Shard(1)], "b": [mt.Replicate()]})
    assert got["a"].data.placements == (mt.Shard(1),)
    assert got["b"].data.placements == (mt.Replicate(),)
    assert got["n"].data.placements == (mt.Shard(0),)
    np.testing.assert_array_equal(got["a"].data.full_tensor(), A)
    np.testing.assert_array_equal(got["b"].data.to_local(), B)
    rep = mt.open_dataset(path, placements=[mt.Replicate()])
    np.testing.assert_array_equal(rep["n"].data.to_local(), N)


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_packed_encoding(folder, comm, fmt):
    """A variable packed into int16 by a scale and offset, with a fill value for
    its NaNs: each rank packs its own block as xarray packs the whole."""
    write, name, engine = WRITERS[fmt]
    path = os.path.join(folder, name)
    values = np.arange(ROWS * 4, dtype=np.float64).reshape(ROWS, 4) * 0.5 - 3
    values[ROWS - 1, 2] = np.nan
    ds = xr.Dataset({"a": (("y", "x"), xp.asarray(values), {"units": "K"})})
    enc = {"a": {"scale_factor": 0.5, "add_offset": -3.0, "dtype": "int16",
                 "_FillValue": -32767}}
    write(ds, path, encoding=enc)
    if comm.Get_rank() == 0:
        with (xr.open_zarr(path, decode_cf=False) if fmt == "zarr" else
              xr.open_dataset(path, engine=engine, decode_cf=False)) as raw:
            assert raw["a"].dtype == np.int16
            assert float(raw["a"].attrs["scale_factor"]) == 0.5
            np.testing.assert_array_equal(raw["a"].values[0], [0, 1, 2, 3])
        np.testing.assert_array_equal(_read_plain(path, engine)["a"].values, values)
    comm.Barrier()
    got = mt.open_dataset(path)
    assert isinstance(got["a"].data, mt.DTensor)
    np.testing.assert_array_equal(got["a"].data.full_tensor(), values)
    # read back and written again: the encoding it was read with packs it alike
    again = os.path.join(folder, "again" + os.path.splitext(name)[1])
    write(got, again)
    np.testing.assert_array_equal(mt.open_dataset(again)["a"].data.full_tensor(), values)


def test_missing_file_raises_everywhere(folder):
    with pytest.raises((FileNotFoundError, OSError)):
        mt.open_dataset(os.path.join(folder, "none.nc"))


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_scalar_empty_and_one_row_variables(folder, comm, fmt):
    """A 0-d DTensor (one rank writes it), an empty one, one of a single row (the
    other ranks hold none), a DTensor coordinate and a time coordinate."""
    pd = pytest.importorskip("pandas")
    write, name, engine = WRITERS[fmt]
    path = os.path.join(folder, name)
    times = pd.date_range("2020-01-01", periods=1)
    ds = xr.Dataset({"s": ((), xp.asarray(np.float64(3.5))),
                     "e": ("z", xp.asarray(np.zeros(0, np.float32))),
                     "one": ("w", xp.asarray(np.array([42], np.int16)))},
                    coords={"t": times, "aux": ("w", xp.asarray(np.array([9.0])))})
    write(ds, path)
    if comm.Get_rank() == 0:
        got = _read_plain(path, engine)
        assert float(got["s"]) == 3.5 and got["e"].shape == (0,)
        np.testing.assert_array_equal(got["one"].values, [42])
        np.testing.assert_array_equal(got["aux"].values, [9.0])
        np.testing.assert_array_equal(got["t"].values, times.values)
    comm.Barrier()
    got = mt.open_dataset(path)
    assert got["s"].data.placements == (mt.Replicate(),)
    assert float(got["s"].data.full_tensor()) == 3.5
    assert got["e"].data.shape == (0,) and got["e"].dtype == np.float32
    np.testing.assert_array_equal(got["one"].data.full_tensor(), [42])
    assert isinstance(got["aux"].values, np.ndarray)
    np.testing.assert_array_equal(got["t"].values, times.values)


def test_netcdf4_reads_the_file(folder, comm):
    """The file is netCDF-4 as netCDF-C writes it: the netCDF4 library reads it."""
    pytest.importorskip("netCDF4")
    path = os.path.join(folder, "x.nc")
    _xarray.to_netcdf(_dataset(), path)
    if comm.Get_rank() == 0:
        _check_plain(_read_plain(path, "netcdf4"))
    comm.Barrier()


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_missing_folder_raises_everywhere(folder, fmt):
    write, name, _ = WRITERS[fmt]
    with pytest.raises(FileNotFoundError):
        write(_dataset(), os.path.join(folder, "no", name))


@pytest.mark.parametrize("engine", ["h5netcdf", "zarr"])
def test_open_dataset_reads_what_xarray_wrote(folder, comm, engine):
    """A file plain xarray wrote on one rank (chunked and compressed netCDF, a
    Zarr store of its own chunks) loads as DTensors, each rank its block."""
    plain = xr.Dataset({"a": (("y", "x"), A), "k": ("y", K)},
                       coords={"x": np.array([0.0, 0.25, 0.5, 0.75])})
    path = os.path.join(folder, "plain.zarr" if engine == "zarr" else "plain.nc")
    if comm.Get_rank() == 0:
        if engine == "zarr":
            plain.to_zarr(path, encoding={"a": {"chunks": (2, 3)}})
        else:
            plain.to_netcdf(path, engine="h5netcdf",
                            encoding={"a": {"zlib": True, "chunksizes": (2, 3)}})
    comm.Barrier()
    got = mt.open_dataset(path, engine=engine)
    np.testing.assert_array_equal(got["a"].data.full_tensor(), A)
    np.testing.assert_array_equal(got["k"].data.full_tensor(), K)
    assert got["a"].data.placements == (mt.Shard(0),)
    np.testing.assert_array_equal(got["x"].values, plain["x"].values)


def test_two_dim_mesh(folder, comm):
    """A DTensor on a 2-D mesh, sharded along both dims, is written and read on it."""
    n = comm.Get_size()
    if n % 2:
        pytest.skip("a 2-D mesh of two rows needs an even number of ranks")
    mesh = mt.init_device_mesh("cpu", (2, n // 2))
    dt = mt.distribute_tensor(A, mesh, [mt.Shard(0), mt.Shard(1)])
    ds = xr.Dataset({"a": (("y", "x"), dt)})
    for write, name, engine in WRITERS.values():
        path = os.path.join(folder, name)
        write(ds, path)
        if comm.Get_rank() == 0:
            np.testing.assert_array_equal(_read_plain(path, engine)["a"].values, A)
        comm.Barrier()
        got = mt.open_dataset(path, mesh=mesh, placements=[mt.Shard(0), mt.Shard(1)])
        assert got["a"].data.placements == (mt.Shard(0), mt.Shard(1))
        np.testing.assert_array_equal(got["a"].data.full_tensor(), A)


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_bool_and_unsigned(folder, comm, fmt):
    """bool (stored as int8, as xarray stores it) and unsigned integers."""
    write, name, engine = WRITERS[fmt]
    path = os.path.join(folder, name)
    flags = np.arange(ROWS) % 3 == 0
    counts = np.arange(ROWS, dtype=np.uint16) * 9000
    write(xr.Dataset({"f": ("y", xp.asarray(flags)), "c": ("y", xp.asarray(counts))}),
          path)
    if comm.Get_rank() == 0:
        got = _read_plain(path, engine)
        assert got["f"].dtype == bool and got["c"].dtype == np.uint16
        np.testing.assert_array_equal(got["f"].values, flags)
        np.testing.assert_array_equal(got["c"].values, counts)
    comm.Barrier()
    got = mt.open_dataset(path)
    np.testing.assert_array_equal(got["f"].data.full_tensor(), flags)
    np.testing.assert_array_equal(got["c"].data.full_tensor(), counts)
