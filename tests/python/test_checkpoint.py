"""Sharded checkpoints: DTensors saved as .npy files that numpy.load reads, loaded
back onto any mesh and placements, state_dict directories, pickling, and bad
input that raises the same exception on every rank.

"Saved by N ranks, loaded by M ranks": the `written` fixture runs a separate
4-rank job (checkpoint_files.py) whose files every run of this suite, at 1..4
ranks, loads; other tests save and load within one run with different meshes.
"""

from __future__ import annotations

import glob
import io
import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, init_device_mesh
from mpi_helpers import Problems, all_ranks, bits_equal, gather_global, raised, ref_index
import checkpoint_files as cf

COMM = MPI.COMM_WORLD
N = COMM.Get_size()
RANK = COMM.Get_rank()
NUMERIC = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
           "uint64", "float16", "float32", "float64", "complex64", "complex128"]



@pytest.fixture(scope="module")
def written(tmp):
    """The files of checkpoint_files.WRITTEN, saved by a separate 4-rank job."""
    directory = os.path.join(tmp, "by4")
    if RANK == 0:
        os.makedirs(directory)
    failure = cf.run_writer(COMM, directory)
    assert failure is None, failure
    return directory


def meshes():
    """Every mesh shape this run can make, 1-D and 2-D, the uneven ones included."""
    out = [(N,)]
    for a in range(1, N + 1):
        if N % a == 0:
            out.append((a, N // a))
    return out


def layouts(ndim: int):
    """(mesh shape, placements) pairs to load into, over the meshes of this run."""
    out = []
    for shape in meshes():
        if ndim == 0:
            out.append((shape, [Replicate()] * len(shape)))
        elif len(shape) == 1:
            out += [(shape, [Replicate()])] + [(shape, [Shard(d)]) for d in range(ndim)]
        else:
            out += [(shape, [Shard(0), Shard(ndim - 1)]), (shape, [Replicate(), Shard(0)]),
                    (shape, [Shard(0), Shard(0)])]
    return out


def check_dtensor(p: Problems, dt, expect: np.ndarray, what: str) -> None:
    """Collective. dt holds exactly `expect`, each rank its own reference box."""
    got, problems = gather_global(dt)
    p.expect(problems == [], f"{what}: {problems}")
    # long double has padding bytes that no copy preserves: compare its values.
    same = (np.array_equal(got, expect) and got.dtype == expect.dtype
            if expect.dtype == np.longdouble else bits_equal(got, expect))
    p.expect(same, f"{what}: values differ")


# -- saved by 4 ranks, loaded here ------------------------------------------------------

def test_files_of_four_ranks_are_numpy_files(written):
    p = Problems()
    for name, (shape, dtype, _, _) in cf.WRITTEN.items():
        a = np.load(os.path.join(written, name + ".npy"))
        p.expect(bits_equal(a, cf.global_array(shape, dtype)), f"{name}: numpy.load differs")
    assert p == []


@pytest.mark.parametrize("name", list(cf.WRITTEN))
def test_load_files_of_four_ranks_in_every_layout(written, name):
    shape, dtype, _, _ = cf.WRITTEN[name]
    expect = cf.global_array(shape, dtype)
    p = Problems()
    for mesh_shape, pl in layouts(len(shape)):
        mesh = init_device_mesh("cpu", mesh_shape)
        dt = mt.load(os.path.join(written, name + ".npy"), mesh, pl)
        p.expect(dt.placements == tuple(pl) and dt.dtype == expect.dtype, f"{pl}: spec")
        check_dtensor(p, dt, expect, f"{name} on {mesh_shape} {pl}")
    assert p == []


def test_load_state_dict_of_four_ranks(written):
    path = os.path.join(written, "state")
    mesh = init_device_mesh("cpu", (N,))
    expect = cf.state_dict(init_device_mesh("cpu", (1, N), mesh_dim_names=("dp", "tp")))
    sd = mt.load(path, mesh, {"embed.weight": [Shard(1)]})
    p = Problems()
    p.expect(sorted(sd) == sorted(expect), f"keys {sorted(sd)}")
    for name, value in expect.items():
        if isinstance(value, np.ndarray):
            p.expect(isinstance(sd[name], np.ndarray) and bits_equal(sd[name], value), name)
            continue
        want = [Shard(1)] if name == "embed.weight" else [Replicate()]
        p.expect(list(sd[name].placements) == want, f"{name}: {sd[name].placements}")
        check_dtensor(p, sd[name], value.full_tensor(), name)
    assert p == []


# -- saved and loaded in this run -------------------------------------------------------

def test_save_grid_matches_numpy_save_byte_for_byte(tmp):
    """Two sharded dims with uneven shards: [Shard(0), Shard(1)] on a (2, 2) mesh
    at np 4 (here the largest 2-D mesh this run has)."""
    mesh_shape = max(meshes()[1:], key=lambda s: min(s))
    mesh = init_device_mesh("cpu", mesh_shape)
    g = cf.global_array((7, 5), "float32", 9)
    path = os.path.join(tmp, "grid.npy")
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0), Shard(1)]), path)
    ref = io.BytesIO()
    np.save(ref, g)
    with open(path, "rb") as f:
        same = f.read() == ref.getvalue()
    assert all_ranks(same and bits_equal(np.load(path), g))


@pytest.mark.parametrize("dtype", NUMERIC)
def test_every_numeric_dtype_round_trips(tmp, dtype):
    mesh = init_device_mesh("cpu", (N,))
    g = cf.global_array((5, 3), dtype)
    path = os.path.join(tmp, f"dtype-{dtype}.npy")
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path)
    p = Problems()
    p.expect(bits_equal(np.load(path), g), "numpy.load differs")
    check_dtensor(p, mt.load(path, mesh, [Shard(1)]), g, f"{dtype} as Shard(1)")
    assert p == []


@pytest.mark.parametrize("shape", [(), (0, 3), (2, 3), (1, 1, 9)], ids=str)
def test_small_empty_and_0d_arrays(tmp, shape):
    """Shards that are empty on some ranks (more ranks than rows), a 0-d array."""
    mesh = init_device_mesh("cpu", (N,))
    g = cf.global_array(shape, "float64")
    path = os.path.join(tmp, f"small-{len(shape)}-{np.prod(shape)}.npy")
    pl = [Shard(0)] if shape else [Replicate()]
    mt.save(mt.distribute_tensor(g, mesh, pl), path)
    p = Problems()
    p.expect(bits_equal(np.load(path), g), "numpy.load differs")
    for lp in layouts(len(shape)):
        dt = mt.load(path, init_device_mesh("cpu", lp[0]), lp[1])
        check_dtensor(p, dt, g, f"{shape} as {lp}")
    assert p == []


def test_numpy_files_fortran_and_byte_swapped(tmp):
    """Files written by numpy.save itself, in Fortran order and big-endian."""
    g = cf.global_array((6, 4, 3), "float64", 5)
    variants = {"f": np.asfortranarray(g), "be": g.astype(">f8"),
                "fbe": np.asfortranarray(g.astype(">i4"))}
    if RANK == 0:
        for k, a in variants.items():
            np.save(os.path.join(tmp, f"np-{k}.npy"), a)
    COMM.Barrier()
    p = Problems()
    for k, a in variants.items():
        expect = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("="))
        for mesh_shape, pl in layouts(3):
            dt = mt.load(os.path.join(tmp, f"np-{k}.npy"), init_device_mesh("cpu", mesh_shape), pl)
            p.expect(dt.to_local().flags.c_contiguous, f"{k}: local not C-contiguous")
            check_dtensor(p, dt, expect, f"{k} as {mesh_shape} {pl}")
    assert p == []


def test_a_float128_file_is_refused_at_the_door(tmp):
    """A DTensor holds no float128: the load says so on every
    rank, rather than giving a tensor that most operations refuse later."""
    path = os.path.join(tmp, "np-ld.npy")
    if RANK == 0:
        np.save(path, np.ones((4, 2), np.longdouble))
    COMM.Barrier()
    with pytest.raises(TypeError, match="native byte order"):
        mt.load(path, init_device_mesh("cpu", (N,)), [Shard(0)])


def test_replicas_write_nothing_twice_and_partial_is_reduced(tmp, monkeypatch):
    written = []
    real = mt.checkpoint._io.io_save

    def spy(mesh, path, header, shape, itemsize, offset, box_offset, box_shape, buf, **kw):
        written.append(buf.nbytes)
        return real(mesh, path, header, shape, itemsize, offset, box_offset, box_shape, buf, **kw)

    monkeypatch.setattr(mt.checkpoint._io, "io_save", spy)
    g = cf.global_array((5, 4), "float64", 3)
    p = Problems()
    for mesh_shape in meshes():
        mesh = init_device_mesh("cpu", mesh_shape)
        # Partial on the first mesh dim: the values sum to g over its ranks.
        k = mesh.get_coordinate()[0]
        local = g * (k + 1) / (mesh_shape[0] * (mesh_shape[0] + 1) / 2)
        pl = [Partial()] + [Replicate()] * (len(mesh_shape) - 1)
        written.clear()
        path = os.path.join(tmp, f"partial-{len(mesh_shape)}.npy")
        mt.save(DTensor.from_local(local, mesh, pl), path)
        total = COMM.allreduce(sum(written))
        p.expect(total == g.nbytes, f"{mesh_shape}: {total} bytes written, not {g.nbytes}")
        p.expect(np.allclose(np.load(path), g), f"{mesh_shape}: the Partial was not summed")
    assert p == []


def test_state_dict_round_trip_keeps_placements(tmp):
    mesh = init_device_mesh("cpu", (1, N) if N % 2 else (2, N // 2),
                            mesh_dim_names=("dp", "tp"))
    sd = cf.state_dict(mesh)
    path = os.path.join(tmp, "sd")
    mt.save(sd, path)
    with open(os.path.join(path, "index.json")) as f:
        index = json.load(f)
    back = mt.load(path, like=sd)
    same_mesh = mt.load(path, mesh)
    p = Problems()
    p.expect(sorted(index["entries"]) == sorted(sd), "index keys")
    for name, value in sd.items():
        for got in (back[name], same_mesh[name]):
            if isinstance(value, np.ndarray):
                p.expect(isinstance(got, np.ndarray) and bits_equal(got, value), name)
                continue
            p.expect(got.placements == value.placements and got.device_mesh == mesh,
                     f"{name}: {got.placements}")
            p.expect(bits_equal(got.to_local(), value.to_local()), f"{name}: local differs")
            p.expect(bits_equal(np.load(os.path.join(path, index["entries"][name]["file"])),
                                value.full_tensor()), f"{name}: file differs")
    assert p == []


def test_overwrite_is_whole_and_leaves_no_temporary_files(tmp):
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "over.npy")
    for salt in (1, 2):
        g = cf.global_array((9, 2), "int32", salt)
        mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path)
        assert all_ranks(bits_equal(np.load(path), g))
    assert all_ranks(glob.glob(os.path.join(tmp, "*.tmp")) == [])


def test_a_save_without_syncs_replaces_whole_and_spares_open_readers(tmp):
    """The old file is put aside and removed, never cut or overwritten: a reader
    that opened it before the save still reads the old array to its end."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "quick.npy")
    old, new = cf.global_array((13, 5), "float64", 1), cf.global_array((13, 5), "float64", 2)
    mt.save(mt.distribute_tensor(old, mesh, [Shard(0)]), path, durable=False)
    with open(path, "rb") as f:
        COMM.Barrier()  # every rank holds the old file open
        mt.save(mt.distribute_tensor(new, mesh, [Shard(0)]), path, durable=False)
        assert all_ranks(bits_equal(np.load(f), old))
    assert all_ranks(bits_equal(np.load(path), new))
    assert all_ranks(glob.glob(os.path.join(tmp, "*.tmp")) == [])


def test_a_file_never_replaces_a_directory_that_took_its_place(tmp):
    """save() refuses a directory at the path before it writes; one that appears
    after that check still fails the save, and stays where it is."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "raced.npy")
    if RANK == 0:
        os.mkdir(path)
        open(os.path.join(path, "inside"), "w").close()
    COMM.Barrier()
    dt = mt.distribute_tensor(cf.global_array((6, 2), "int32", 1), mesh, [Shard(0)])
    save = mt.checkpoint._tensor.save_dtensor  # past the check, as in a race
    outcome = raised(lambda: save(dt, path, durable=False), OSError, "Is a directory")
    assert all_ranks(outcome is True), outcome
    assert all_ranks(os.listdir(path) == ["inside"])
    assert all_ranks(glob.glob(os.path.join(tmp, "*.tmp")) == [])


def test_failed_save_leaves_the_existing_file(tmp, monkeypatch):
    """One rank passes a box outside the array: every rank raises, the old file
    stays whole, and no temporary file is left."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "kept.npy")
    old = cf.global_array((8, 3), "float32", 1)
    mt.save(mt.distribute_tensor(old, mesh, [Shard(0)]), path)
    real = mt.checkpoint._io.io_save

    def bad_last_rank(mesh_, path_, header, shape, itemsize, offset, box_offset, box_shape,
                      buf, **kw):
        if RANK == N - 1:
            box_offset = (shape[0],) + tuple(box_offset[1:])
            box_shape = (1,) + tuple(box_shape[1:])
            buf = np.zeros(int(np.prod(box_shape)) * itemsize, np.uint8)
        return real(mesh_, path_, header, shape, itemsize, offset, box_offset, box_shape, buf, **kw)

    monkeypatch.setattr(mt.checkpoint._io, "io_save", bad_last_rank)
    new = mt.distribute_tensor(old + 1, mesh, [Shard(0)])
    outcome = raised(lambda: mt.save(new, path), IndexError, "outside")
    assert all_ranks(outcome is True), outcome
    assert all_ranks(bits_equal(np.load(path), old))
    assert all_ranks(glob.glob(os.path.join(tmp, "*.tmp")) == [])


# -- bad input --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad_files(tmp):
    g = cf.global_array((6, 4), "float32")
    paths = {k: os.path.join(tmp, f"bad-{k}") for k in
             ("good.npy", "truncated.npy", "header_cut.npy", "text.npy", "object.npy",
              "a_file", "empty_dir")}
    if RANK == 0:
        np.save(paths["good.npy"], g)
        data = open(paths["good.npy"], "rb").read()
        open(paths["truncated.npy"], "wb").write(data[:-10])
        open(paths["header_cut.npy"], "wb").write(data[:30])
        open(paths["text.npy"], "w").write("not an array\n")
        np.save(paths["object.npy"], np.array([object(), 1], dtype=object))
        open(paths["a_file"], "w").write("x")
        os.makedirs(paths["empty_dir"])
    COMM.Barrier()
    return paths


def _bad_cases(p, mesh):
    dt = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    like = mt.distribute_tensor(np.ones((6, 4), np.float32), mesh, [Shard(0)])
    return [
        ("missing file", lambda: mt.load(p["good.npy"] + ".nope", mesh), FileNotFoundError,
         "no such file"),
        ("truncated data", lambda: mt.load(p["truncated.npy"], mesh, [Shard(0)]), OSError,
         "truncated"),
        ("truncated header", lambda: mt.load(p["header_cut.npy"], mesh), ValueError,
         "not a valid .npy"),
        ("not a .npy file", lambda: mt.load(p["text.npy"], mesh), ValueError, "not a .npy"),
        ("object dtype", lambda: mt.load(p["object.npy"], mesh), TypeError, "numeric"),
        ("shape mismatch",
         lambda: mt.load(p["good.npy"], like=mt.distribute_tensor(np.ones((6, 5), np.float32),
                                                                  mesh)),
         ValueError, "shape"),
        ("dtype mismatch", lambda: mt.load(p["good.npy"], like=like.astype(np.float64)),
         TypeError, "dtype"),
        ("Partial target", lambda: mt.load(p["good.npy"], mesh, [Partial()]), ValueError,
         "Partial"),
        ("directory without index", lambda: mt.load(p["empty_dir"], mesh), FileNotFoundError,
         "index.json"),
        ("like keys differ", lambda: mt.load(os.path.dirname(p["good.npy"]) + "/sd",
                                             like={"nope": like}), KeyError, "missing"),
        ("missing directory", lambda: mt.save(dt, p["good.npy"] + ".d/x.npy"),
         FileNotFoundError, "does not exist"),
        ("parent is a file", lambda: mt.save(dt, p["a_file"] + "/x.npy"), FileNotFoundError,
         "does not exist"),
        ("path is a directory", lambda: mt.save(dt, p["empty_dir"]), IsADirectoryError,
         "directory"),
        ("state_dict onto a file", lambda: mt.save({"w": dt}, p["a_file"]),
         NotADirectoryError, "file"),
        # Nested dicts, lists and plain values are saved (test_resume.py); an
        # arbitrary object is not.
        ("state_dict of an object", lambda: mt.save({"w": [object()]}, p["empty_dir"]),
         TypeError, "'w.0' is of type object"),
        ("save a list", lambda: mt.save([dt], p["empty_dir"] + "/x.npy"), TypeError, "list"),
    ]


def test_bad_input_raises_on_every_rank(tmp, bad_files):
    mesh = init_device_mesh("cpu", (N,))
    if not os.path.isdir(os.path.join(tmp, "sd")):
        mt.save({"w": mt.zeros(3, device_mesh=mesh)}, os.path.join(tmp, "sd"))
    p = Problems()
    for what, call, exc, match in _bad_cases(bad_files, mesh):
        outcome = raised(call, exc, match)
        p.expect(outcome is True, f"{what}: {outcome}")
    assert p == []
    assert all_ranks(glob.glob(os.path.join(tmp, "*.tmp")) == [])


def test_a_header_whose_shape_is_an_expression_gives_one_message(tmp):
    """NumPy's header parser names an expression by its AST node's address, which
    differs by rank: the error every rank raises must be the same words."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "expression-shape.npy")
    if RANK == 0:
        header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1 + 2,), }"
        header = header + " " * (118 - len(header)) + "\n"
        with open(path, "wb") as f:
            f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
                    + header.encode() + b"\x00" * 24)
    COMM.Barrier()
    with pytest.raises(ValueError, match="not a valid .npy") as err:
        mt.load(path, mesh)
    messages = COMM.allgather(str(err.value))
    assert messages == [messages[0]] * N and " at 0x" not in messages[0], messages


def test_header_parse_matches_numpy_for_many_shapes():
    from mpitensor.checkpoint import _npy

    p = Problems()
    for shape in [(), (0,), (3,), (2, 3), (10**6, 7), tuple(range(1, 13)), (2**40, 2)]:
        for dtype in ("<f4", ">c16", "|b1", "<u8"):
            ref = io.BytesIO()
            np.lib.format.write_array_header_1_0(ref, {"descr": dtype, "fortran_order": False,
                                                       "shape": shape})
            mine = _npy.encode(shape, np.dtype(dtype))
            head = _npy.decode(mine, "x")
            p.expect(head.shape == shape and head.dtype == np.dtype(dtype)
                     and head.offset == len(mine) and len(mine) % 64 == 0,
                     f"{shape} {dtype}: {head}")
            p.expect(mine == ref.getvalue(), f"{shape} {dtype}: header differs from NumPy's")
    assert p == []


def test_load_into_a_sub_mesh_and_default_mesh(tmp):
    g = cf.global_array((6, 5), "int64", 4)
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "sub.npy")
    mt.save(mt.distribute_tensor(g, mesh, [Shard(1)]), path)
    grid = init_device_mesh("cpu", (1, N), mesh_dim_names=("dp", "tp"))
    p = Problems()
    check_dtensor(p, mt.load(path, grid["tp"], [Shard(0)]), g, "sub-mesh")
    with mesh:
        check_dtensor(p, mt.load(path), g, "current mesh, default Replicate")
    assert p == []


def test_ranks_outside_the_mesh_take_no_part(tmp):
    """A mesh of all ranks but the last: the outsider writes and reads nothing, and
    its loaded DTensor has the global shape and an empty local array."""
    if N == 1:
        return
    mesh = mt.DeviceMesh("cpu", list(range(N - 1)))
    g = cf.global_array((5, 4), "float32", 6)
    path = os.path.join(tmp, "outsider.npy")
    local = g[RANK:RANK + 1] if RANK < N - 1 else np.empty((0, 4), np.float32)
    dt = DTensor.from_local(local, mesh, [Shard(0)], shape=(N - 1, 4), stride=(4, 1))
    mt.save(dt, path)
    COMM.Barrier()
    back = mt.load(path, mesh, [Shard(1)])
    p = Problems()
    p.expect(bits_equal(np.load(path), g[:N - 1]), "numpy.load differs")
    p.expect(back.shape == (N - 1, 4), f"shape {back.shape}")
    if RANK == N - 1:
        p.expect(back.to_local().size == 0, "the outsider holds data")
    else:
        idx = ref_index((N - 1, 4), (N - 1,), (RANK,), [Shard(1)])
        p.expect(bits_equal(back.to_local(), g[:N - 1][idx]), "local differs")
    assert p == []


# -- interleaved layouts go through row slabs ---------------------------------------

@pytest.fixture
def moved():
    """The data bytes this rank read and wrote, counted by the core, since the
    last clear(): a dict {"read": n, "written": n}."""

    class Moved(dict):
        def clear(self):
            self.start = mt.checkpoint._io.io_counters()

        def __getitem__(self, key):
            now = mt.checkpoint._io.io_counters()
            i = ("read", "written").index(key)
            return now[i] - self.start[i]

    m = Moved()
    m.clear()
    return m


def interleaved_layouts():
    """Layouts whose boxes are many short runs of the file, on this run's meshes."""
    out = [((N,), [Shard(1)])]
    for a, b in [s for s in meshes() if len(s) == 2]:
        out += [((a, b), [Shard(0), Shard(1)]), ((a, b), [Shard(1), Shard(0)])]
    return out


@pytest.mark.parametrize("shape", [(12, 10), (7, 5, 3)], ids=str)
def test_interleaved_layouts_move_one_share_per_rank(tmp, moved, shape):
    """Shard(1) and 2-D layouts: each rank reads its row slab of the file, every
    byte once, an equal share when the rows divide evenly; a save writes the same
    way."""
    g = cf.global_array(shape, "float32", 5)
    p = Problems()
    for mesh_shape, pl in interleaved_layouts():
        mesh = init_device_mesh("cpu", mesh_shape)
        path = os.path.join(tmp, f"inter-{len(shape)}-{len(mesh_shape)}.npy")
        dt = mt.distribute_tensor(g, mesh, pl)
        moved.clear()
        mt.save(dt, path)
        wrote = moved["written"]
        p.expect(bits_equal(np.load(path), g), f"{mesh_shape} {pl}: numpy.load differs")
        moved.clear()
        dt = mt.load(path, mesh, pl)
        read = moved["read"]
        check_dtensor(p, dt, g, f"{mesh_shape} {pl} loaded")
        for kind, mine in (("save", wrote), ("load", read)):
            p.expect(COMM.allreduce(mine) == g.nbytes, f"{kind}: not every byte once")
            if shape[0] % N == 0:
                p.expect(mine == g.nbytes // N, f"{kind}: {mine} bytes, not 1/{N}")
    assert p == []


def save_limited(dt, path, limited_rank):
    """Collective. mt.save(dt, path) while `limited_rank` may not grow a file past
    1000 bytes (SIGXFSZ ignored, so its write fails with EFBIG): what this rank
    raised, or None."""
    import resource
    import signal

    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        if RANK == limited_rank:
            resource.setrlimit(resource.RLIMIT_FSIZE, (1000, old[1]))
        mt.save(dt, path)
    except Exception as e:  # noqa: BLE001 - what each rank raised is the point
        return e
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, handler)
    return None


def expect_failed_everywhere(p, errors, path, g):
    """The same OSError on every rank, and the file at `path` still holds `g`."""
    p.expect(all_ranks(isinstance(errors, OSError)), f"not OSError everywhere: {errors!r}")
    p.expect(COMM.allgather(str(errors)) == [str(errors)] * N, "the messages differ")
    if RANK == 0:
        p.expect(bits_equal(np.load(path), g), "the existing file changed")


# -- the slab pipeline: chunks, threads, dtypes, orders ------------------------------

@pytest.fixture(params=[(1, True), (600, True), (600, False), (4096, True)],
                ids=lambda p: f"chunk{p[0]}-{'thread' if p[1] else 'inline'}")
def pipeline(request):
    """Every rank moves interleaved boxes in chunks of this many bytes (at least one
    row), with the I/O thread or inline; the defaults come back afterwards."""
    old = mt.checkpoint._io.io_pipeline(*request.param)
    yield request.param
    mt.checkpoint._io.io_pipeline(*old)


@pytest.mark.parametrize("shape,dtype", [((37, 23), "float16"), ((10, 9, 7), "complex64"),
                                         ((1, 40), "float64"), ((5, 3), "int8")], ids=str)
def test_slab_pipeline_round_trips_at_every_chunk_size(tmp, pipeline, shape, dtype):
    """Chunks of one row, of several rows that divide no slab, and larger than a
    slab; uneven shards; C and Fortran files; 1-D and 2-D meshes: numpy.load reads
    what was saved, and every layout loads back exactly."""
    g = cf.global_array(shape, dtype, 3)
    p = Problems()
    for mesh_shape, pl in interleaved_layouts() + [((N,), [Replicate()])]:
        mesh = init_device_mesh("cpu", mesh_shape)
        path = os.path.join(tmp, f"pipe-{len(shape)}-{len(mesh_shape)}.npy")
        mt.save(mt.distribute_tensor(g, mesh, pl), path)
        same = bits_equal(np.load(path), g) if RANK == 0 else True
        p.expect(COMM.bcast(same), f"{mesh_shape} {pl}: numpy.load differs")
        for mesh_shape2, pl2 in layouts(len(shape)):
            mesh2 = init_device_mesh("cpu", mesh_shape2)
            check_dtensor(p, mt.load(path, mesh2, pl2), g, f"{mesh_shape2} {pl2} from {pl}")
    fortran = os.path.join(tmp, "pipe-fortran.npy")
    if RANK == 0:
        np.save(fortran, np.asfortranarray(g))
    COMM.Barrier()
    for mesh_shape, pl in layouts(len(shape)):
        mesh = init_device_mesh("cpu", mesh_shape)
        check_dtensor(p, mt.load(fortran, mesh, pl), g, f"Fortran {mesh_shape} {pl}")
    assert p == []


def test_slab_save_failure_on_one_rank_leaves_no_file(tmp, pipeline):
    """A writer cannot write (its file size limit is below what it writes, so from
    2 ranks its first chunk fails inside the pipeline): the last rank. Every rank
    raises, the existing file stays whole and no temporary file is left."""
    g = cf.global_array((64, 24), "float32", 2)
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "pipe-fail.npy")
    mt.save(mt.distribute_tensor(g, mesh, [Shard(1)]), path)
    errors = save_limited(mt.distribute_tensor(g * 2, mesh, [Shard(1)]), path, N - 1)
    p = Problems()
    expect_failed_everywhere(p, errors, path, g)
    if RANK == 0:
        p.expect(glob.glob(os.path.join(tmp, "pipe-fail.npy.*")) == [], "a temporary is left")
    assert p == []


def test_slab_load_of_a_truncated_file_raises_everywhere(tmp, pipeline):
    """Five bytes short: OSError naming the truncation on every rank."""
    g = cf.global_array((40, 16), "float32", 4)
    path = os.path.join(tmp, "pipe-short.npy")
    if RANK == 0:
        np.save(path, g)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 5)
    COMM.Barrier()
    mesh = init_device_mesh("cpu", (N,))
    errors = None
    try:
        mt.load(path, mesh, [Shard(1)])
    except Exception as e:  # noqa: BLE001
        errors = e
    p = Problems()
    p.expect(all_ranks(isinstance(errors, OSError) and "truncated" in str(errors)),
             f"{errors!r}")
    assert p == []
