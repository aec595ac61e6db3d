"""HDF5 datasets saved and loaded in parallel: files that plain h5py
reads with the right values and attributes, files that h5py writes (contiguous,
chunked, gzip-compressed, big-endian, in groups, netCDF-4 style) loaded onto any
mesh and placements, a slice loaded alone, a dataset added to an existing file,
and bad files that raise the same exception on every rank.
"""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, init_device_mesh
from mpi_helpers import Problems, all_ranks, bits_equal, expect_same_error
from io_helpers import (DTYPES, N, RANK, array, check_dtensor, layouts, on_first)

COMM = MPI.COMM_WORLD



def read_h5(path: str, name: str):
    """Rank 0's plain h5py read of a dataset (values, dtype, attributes),
    broadcast."""
    got = None
    if RANK == 0:
        with h5py.File(path, "r") as f:
            d = f[name]
            got = (d[()], d.dtype, dict(d.attrs), d.chunks, d.compression)
    return COMM.bcast(got)


def write_h5(path: str, name: str, data: np.ndarray, **kwargs) -> None:
    """Rank 0 writes a dataset with plain h5py (a new file), the others wait."""
    def action():
        with h5py.File(path, "w") as f:
            f.create_dataset(name, data=data, **kwargs)
    on_first(action)


# -- written by mpitensor, read by h5py and by mpitensor ------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips_and_h5py_reads_it(tmp, dtype):
    path = os.path.join(tmp, f"dt_{dtype}.h5")
    g = array((2 * N + 1, 3), dtype)
    mesh = init_device_mesh("cpu", (N,))
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path, dataset="x")
    values, stored, _, chunks, _ = read_h5(path, "x")
    p = Problems()
    if dtype == "bfloat16":  # h5py reads HDF5's bfloat16 type as float32 values
        p.expect(np.array_equal(values, g.astype(np.float32)), "h5py's float32 values")
    else:
        p.expect(bits_equal(values, g) and stored == g.dtype, f"h5py read {stored}")
    p.expect(chunks is None, "the dataset is contiguous")
    back = mt.load(path, mesh, [Shard(1)], dataset="x")
    p.expect(back.dtype == g.dtype and back.placements == (Shard(1),), "spec")
    check_dtensor(p, back, g, f"{dtype} back as Shard(1)")
    assert p == []


@pytest.mark.parametrize("shape", [(), (5,), (2 * N + 1, 3), (3, 2 * N, 2), (2, 3, N + 1, 2),
                                   (0, 4), (1, 3)])
def test_every_rank_count_and_shape_in_every_layout(tmp, shape):
    """0-d to 4-d, empty, and fewer rows than ranks (ranks with nothing), saved
    from and loaded into every layout of this run."""
    g = array(shape, "float64", 3)
    p = Problems()
    for k, (mesh_shape, pl) in enumerate(layouts(len(shape))):
        path = os.path.join(tmp, f"shape{len(shape)}_{k}.h5")
        mesh = init_device_mesh("cpu", mesh_shape)
        mt.save(mt.distribute_tensor(g, mesh, pl), path, dataset="x")
        values = read_h5(path, "x")[0]
        p.expect(bits_equal(values, g), f"{shape} saved as {pl}: h5py reads other values")
        for mesh2, pl2 in layouts(len(shape))[::2]:
            back = mt.load(path, init_device_mesh("cpu", mesh2), pl2, dataset="x")
            check_dtensor(p, back, g, f"{shape}: saved {pl} on {mesh_shape}, loaded {pl2}")
    assert p == []


def test_attributes_groups_and_the_file_is_plain_hdf5(tmp):
    path = os.path.join(tmp, "attrs.h5")
    g = array((4, N + 1), "float32")
    mesh = init_device_mesh("cpu", (N,))
    attrs = {"units": "m/s", "scale": 0.5, "axes": np.arange(3)}
    mt.save(mt.distribute_tensor(g, mesh, [Shard(1)]), path, dataset="fields/u",
            attrs=attrs)
    values, _, got, _, _ = read_h5(path, "fields/u")
    p = Problems()
    p.expect(bits_equal(values, g), "values")
    p.expect(got["units"] == "m/s" and got["scale"] == 0.5
             and np.array_equal(got["axes"], np.arange(3)), f"attributes {got}")
    back = mt.load(path, mesh, [Shard(0)])  # the file's only dataset
    check_dtensor(p, back, g, "the only dataset, without dataset=")
    assert p == []


# -- written by h5py, loaded by mpitensor ----------------------------------------------

@pytest.mark.parametrize("kind", ["contiguous", "chunked", "gzip", "big-endian", "fletcher"])
def test_files_that_h5py_writes_load_in_every_layout(tmp, kind):
    options = {"contiguous": {}, "chunked": {"chunks": (3, 2)},
               "gzip": {"chunks": (2, 5), "compression": "gzip", "shuffle": True},
               "big-endian": {}, "fletcher": {"chunks": (4, 4), "fletcher32": True}}[kind]
    g = array((2 * N + 3, 5), "float64", 1)
    data = g.astype(">f8") if kind == "big-endian" else g
    path = os.path.join(tmp, f"h5py_{kind}.h5")
    write_h5(path, "grp/v", data, **options)
    p = Problems()
    for mesh_shape, pl in layouts(2):
        back = mt.load(path, init_device_mesh("cpu", mesh_shape), pl, dataset="grp/v")
        p.expect(back.dtype == np.float64, f"dtype {back.dtype}")
        check_dtensor(p, back, g, f"{kind} as {pl} on {mesh_shape}")
    assert p == []


@pytest.mark.parametrize("dtype", ["bool", "int16", "uint32", "complex64", "complex128",
                                   "float16"])
def test_h5py_dtypes_chunked_and_not(tmp, dtype):
    g = array((N + 2, 3), dtype, 2)
    p = Problems()
    mesh = init_device_mesh("cpu", (N,))
    for chunks in (None, (2, 3)):
        path = os.path.join(tmp, f"h5py_{dtype}_{chunks is None}.h5")
        write_h5(path, "x", g, chunks=chunks)
        check_dtensor(p, mt.load(path, mesh, [Shard(0)], dataset="x"), g,
                      f"{dtype} chunks={chunks}")
    assert p == []


def test_a_netcdf4_variable_loads_by_name(tmp):
    """A netCDF-4 file is HDF5: its variables are datasets, its dimensions
    datasets too (dimension scales), so the variable is named."""
    path = os.path.join(tmp, "ocean.nc")
    g = array((N + 1, 4), "float32", 5)

    def action():
        with h5py.File(path, "w") as f:
            f.attrs["Conventions"] = "CF-1.8"
            f.create_dataset("lat", data=np.arange(N + 1.0))
            f["lat"].make_scale("lat")
            f.create_dataset("lon", data=np.arange(4.0))
            f["lon"].make_scale("lon")
            t = f.create_dataset("temp", data=g, chunks=(1, 4), compression="gzip")
            t.dims[0].attach_scale(f["lat"])
            t.dims[1].attach_scale(f["lon"])
            t.attrs["units"] = "K"
    on_first(action)
    p = Problems()
    check_dtensor(p, mt.load(path, init_device_mesh("cpu", (N,)), [Shard(0)],
                             dataset="temp"), g, "temp")
    expect_same_error(p, "without dataset=", lambda: mt.load(path), ValueError,
                      "holds 3 datasets")
    assert p == []


def test_like_gives_mesh_placements_and_checks(tmp):
    path = os.path.join(tmp, "like.h5")
    g = array((2 * N, 3), "float32")
    mesh = init_device_mesh("cpu", (N,))
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path, dataset="w")
    like = mt.distribute_tensor(np.zeros_like(g), mesh, [Shard(1)])
    p = Problems()
    back = mt.load(path, like=like, dataset="w")
    p.expect(back.placements == (Shard(1),), "like's placements")
    check_dtensor(p, back, g, "like=")
    whole = mt.load(path, like=np.zeros_like(g), dataset="w")
    p.expect(isinstance(whole, np.ndarray) and bits_equal(whole, g), "like= an ndarray")
    expect_same_error(p, "like of another shape", lambda: mt.load(
        path, like=np.zeros((3, 3), np.float32), dataset="w"), ValueError, "shape")
    assert p == []


# -- a part of the dataset alone -------------------------------------------------------

def test_index_loads_a_slice_reading_only_its_rows(tmp):
    path = os.path.join(tmp, "slice.h5")
    g = array((6 * N, 4), "float64")
    mesh = init_device_mesh("cpu", (N,))
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path, dataset="x")
    p = Problems()
    for index in (np.s_[N:3 * N], np.s_[2:5, 1:3], np.s_[3], np.s_[..., 2], np.s_[-2:]):
        for pl in ([Shard(0)], [Replicate()]):
            before = mt.checkpoint._io.io_counters()[0]
            back = mt.load(path, mesh, pl, dataset="x", index=index)
            read = mt.checkpoint._io.io_counters()[0] - before
            check_dtensor(p, back, g[index], f"index {index} as {pl}")
            if pl == [Shard(0)] and index == np.s_[N:3 * N]:  # whole rows
                total = COMM.allreduce(read)
                p.expect(total == g[index].nbytes, f"{index}: {total} bytes read for a "
                                                   f"slice of {g[index].nbytes}")
    expect_same_error(p, "a step", lambda: mt.load(path, mesh, [Shard(0)], index=np.s_[::2]),
                      ValueError, "step 1")
    expect_same_error(p, "out of bounds", lambda: mt.load(path, mesh, index=np.s_[6 * N]),
                      IndexError, "out of bounds")
    assert p == []


def test_index_of_a_compressed_dataset_reads_only_its_chunks(tmp):
    """The chunks outside the slice are made garbage: the slice still loads (no
    rank read them), and the whole dataset raises on every rank."""
    path = os.path.join(tmp, "chunks.h5")
    g = array((4 * N, 6), "float32")
    write_h5(path, "x", g, chunks=(N, 6), compression="gzip")

    def spoil():
        with h5py.File(path, "r") as f:
            d = f["x"]
            spots = [d.id.get_chunk_info(i) for i in range(d.id.get_num_chunks())]
        with open(path, "r+b") as f:
            for info in spots:
                if info.chunk_offset[0] >= 2 * N:  # rows from 2N on
                    f.seek(info.byte_offset)
                    f.write(b"\xff" * info.size)
    on_first(spoil)
    mesh = init_device_mesh("cpu", (N,))
    p = Problems()
    check_dtensor(p, mt.load(path, mesh, [Shard(1)], index=np.s_[:2 * N]), g[:2 * N],
                  "the rows before the spoiled chunks")
    expect_same_error(p, "the spoiled chunks", lambda: mt.load(path, mesh, [Shard(0)]),
                      OSError, "")
    assert p == []


# -- adding to a file -------------------------------------------------------------------

def test_mode_a_adds_a_dataset_and_keeps_the_rest(tmp):
    path = os.path.join(tmp, "add.h5")
    mesh = init_device_mesh("cpu", (N,))
    a, b = array((N + 2, 3), "float64"), array((3, 2 * N + 1), "int32", 4)

    def first():
        with h5py.File(path, "w") as f:
            f.attrs["run"] = 7
            f.create_dataset("a", data=a, chunks=(1, 3))
    on_first(first)
    mt.save(mt.distribute_tensor(b, mesh, [Shard(1)]), path, dataset="g/b", mode="a",
            attrs={"k": 1})
    p = Problems()
    if RANK == 0:
        with h5py.File(path, "r") as f:
            p.expect(bits_equal(f["a"][()], a) and f.attrs["run"] == 7, "the rest kept")
            p.expect(bits_equal(f["g/b"][()], b) and f["g/b"].attrs["k"] == 1, "added")
    # the same dataset again, written in place: its attributes stay
    mt.save(mt.distribute_tensor(b + 1, mesh, [Shard(0)]), path, dataset="g/b", mode="a")
    values, _, attrs, _, _ = read_h5(path, "g/b")
    p.expect(bits_equal(values, b + 1) and attrs == {"k": 1}, f"rewritten: {attrs}")
    check_dtensor(p, mt.load(path, mesh, [Shard(1)], dataset="a"), a, "a")
    expect_same_error(p, "another shape", lambda: mt.save(
        mt.distribute_tensor(np.zeros((2, 2)), mesh, [Shard(0)]), path, dataset="a",
        mode="a"), ValueError, "already holds")
    # mode "a" without a file writes a new one
    new = os.path.join(tmp, "add_new.h5")
    mt.save(mt.distribute_tensor(a, mesh, [Shard(0)]), new, dataset="x", mode="a")
    p.expect(bits_equal(read_h5(new, "x")[0], a), "a new file in mode 'a'")
    assert p == []


def test_a_0d_and_an_empty_dataset_added(tmp):
    path = os.path.join(tmp, "add_small.h5")
    mesh = init_device_mesh("cpu", (N,))
    write_h5(path, "a", np.arange(3))
    for name, g in (("s", np.array(2.5)), ("e", np.zeros((0, 3), np.int16))):
        mt.save(mt.distribute_tensor(g, mesh, [Replicate()]), path, dataset=name, mode="a")
        assert all_ranks(bits_equal(read_h5(path, name)[0], g)), name
        back = mt.load(path, mesh, [Replicate()], dataset=name)
        assert all_ranks(bits_equal(back.full_tensor(), g)), name


# -- whole or not at all ----------------------------------------------------------------

def test_a_failed_save_leaves_the_old_file(tmp, monkeypatch):
    path = os.path.join(tmp, "keep.h5")
    mesh = init_device_mesh("cpu", (N,))
    old = array((2 * N, 3), "float64")
    mt.save(mt.distribute_tensor(old, mesh, [Shard(0)]), path, dataset="x")
    real = mt.checkpoint._io.io_save

    def failing(mesh_, path_, header, shape, itemsize, offset, box_offset, box_shape, buf,
                **kw):
        if RANK == N - 1:  # a box outside the array: the core refuses on every rank
            box_offset = (shape[0],) + tuple(box_offset[1:])
        return real(mesh_, path_, header, shape, itemsize, offset, box_offset, box_shape,
                    buf, **kw)

    monkeypatch.setattr(mt.checkpoint._io, "io_save", failing)
    p = Problems()
    expect_same_error(p, "failed save", lambda: mt.save(
        mt.distribute_tensor(old + 1, mesh, [Shard(0)]), path, dataset="y"), IndexError,
        "outside")
    monkeypatch.undo()
    p.expect(bits_equal(read_h5(path, "x")[0], old), "the old file is whole")
    left = COMM.bcast(sorted(os.listdir(tmp)) if RANK == 0 else None)
    p.expect(not [f for f in left if f.startswith("keep.h5.")], f"leftovers {left}")
    assert p == []


# -- bad files --------------------------------------------------------------------------

def test_bad_files_raise_the_same_error_everywhere(tmp):
    mesh = init_device_mesh("cpu", (N,))
    good = os.path.join(tmp, "good.h5")
    g = array((4 * N, 8), "float64")
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), good, dataset="x")

    def make():
        data = open(good, "rb").read()
        with open(os.path.join(tmp, "short.h5"), "wb") as f:
            f.write(data[:len(data) // 2])
        with open(os.path.join(tmp, "header.h5"), "wb") as f:
            f.write(data[:600])
        with open(os.path.join(tmp, "garbage.h5"), "wb") as f:
            f.write(b"not an hdf5 file" * 100)
        with h5py.File(os.path.join(tmp, "kinds.h5"), "w") as f:
            f.create_group("grp")
            f.create_dataset("text", data=np.array([b"ab", b"cd"]))
            f.create_dataset("rec", data=np.zeros(3, [("a", "i4"), ("b", "f8")]))
            f.create_dataset("huge", shape=(1 << 40, 1 << 20), dtype="f8", chunks=(1, 8))
    on_first(make)
    p = Problems()
    cases = [("missing file", "nothing.h5", "x", FileNotFoundError, "no checkpoint"),
             ("missing dataset", "good.h5", "y", KeyError, "no dataset 'y'"),
             ("truncated data", "short.h5", "x", OSError, "truncated"),
             ("truncated structure", "header.h5", "x", OSError, "HDF5"),
             ("not HDF5", "garbage.h5", "x", OSError, "HDF5"),
             ("a group", "kinds.h5", "grp", TypeError, "group"),
             ("strings", "kinds.h5", "text", TypeError, "numeric"),
             ("records", "kinds.h5", "rec", TypeError, "numeric"),
             ("a huge shape", "kinds.h5", "huge", MemoryError, "cannot allocate")]
    for what, name, dataset, exc, match in cases:
        expect_same_error(p, what, lambda: mt.load(os.path.join(tmp, name), mesh,
                                                   [Shard(0)], dataset=dataset), exc, match)
    expect_same_error(p, "a save without dataset=", lambda: mt.save(
        mt.distribute_tensor(g, mesh, [Shard(0)]), good), ValueError, "dataset=")
    expect_same_error(p, "bad mode", lambda: mt.save(
        mt.distribute_tensor(g, mesh, [Shard(0)]), good, dataset="x", mode="r+"),
        ValueError, "mode=")
    # and the job goes on
    check_dtensor(p, mt.load(good, mesh, [Shard(1)], format="hdf5"), g, "after the errors")
    assert p == []


@pytest.mark.skipif(N < 2, reason="needs ranks that can pass different arguments")
def test_arguments_that_differ_on_one_rank_raise_everywhere(tmp):
    """The last rank passes another dataset, index, format or mode: every rank
    raises the same exception (in the agreement on the path), none waits in a
    collective that the last rank never enters, and the job goes on."""
    path = os.path.join(tmp, "args.h5")
    mesh = init_device_mesh("cpu", (N,))
    g = array((2 * N, 3), "float64")
    dt = mt.distribute_tensor(g, mesh, [Shard(0)])
    mt.save(dt, path, dataset="x")
    last = RANK == N - 1
    p = Problems()
    for what, kwargs, exc in (
            ("dataset", {"dataset": "y" if last else "x"}, ValueError),
            ("index", {"dataset": "x", "index": np.s_[1:] if last else None}, ValueError),
            ("format", {"format": "zarr" if last else None}, ValueError),
            ("no such format", {"format": "csv" if last else None}, ValueError)):
        expect_same_error(p, f"load with another {what}", lambda: mt.load(
            path, mesh, [Shard(0)], **kwargs), exc, "")
    for what, kwargs, exc in (
            ("dataset", {"dataset": "y" if last else "x"}, ValueError),
            ("mode", {"dataset": "x", "mode": "r" if last else "w"}, ValueError),
            ("attrs", {"dataset": "x", "attrs": [1] if last else None}, TypeError),
            ("format", {"dataset": "x", "format": "zarr" if last else None}, ValueError)):
        expect_same_error(p, f"save with another {what}", lambda: mt.save(
            dt, path, **kwargs), exc, "")
    check_dtensor(p, mt.load(path, mesh, [Shard(1)], dataset="x"), g, "the job goes on")
    assert p == []
