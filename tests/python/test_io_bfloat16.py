"""bfloat16 and float16 saved and loaded back in every format: numpy.save
describes bfloat16 as raw bytes ('<V2'), which used to make a saved bfloat16 DTensor
impossible to load again. The .npy header now names it 'bfloat16' (numpy.load
gives ml_dtypes' bfloat16 back), HDF5 holds it as a float type of its own, Zarr
as its data type "bfloat16"; state_dict directories record it in their index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, init_device_mesh
from mpi_helpers import Problems, bits_equal, fresh_job_env
from io_helpers import BF16, N, RANK, array, check_dtensor, layouts

COMM = MPI.COMM_WORLD



@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("suffix", [".npy", ".h5", ".zarr"])
def test_a_half_precision_tensor_loads_back_in_every_layout(tmp, dtype, suffix):
    g = array((2 * N + 1, 3), dtype, 1)
    g.reshape(-1)[:3] = np.array([np.nan, -np.inf, -0.0], np.float32).astype(g.dtype)
    path = os.path.join(tmp, f"half_{dtype}{suffix}")
    extra = {"dataset": "x"} if suffix == ".h5" else {}
    mesh = init_device_mesh("cpu", (N,))
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path, **extra)
    p = Problems()
    for mesh_shape, pl in layouts(2):
        back = mt.load(path, init_device_mesh("cpu", mesh_shape), pl)
        p.expect(back.dtype == g.dtype, f"{suffix} {pl}: dtype {back.dtype}")
        check_dtensor(p, back, g, f"{dtype} {suffix} as {pl}")
    like = mt.distribute_tensor(np.zeros_like(g), mesh, [Shard(1)])
    check_dtensor(p, mt.load(path, like=like), g, "like=")
    assert p == []


def test_numpy_reads_the_npy_file_as_bfloat16(tmp):
    path = os.path.join(tmp, "np.npy")
    g = array((N + 2, 4), "bfloat16")
    mt.save(mt.distribute_tensor(g, init_device_mesh("cpu", (N,)), [Shard(1)]), path)
    got = COMM.bcast(np.load(path) if RANK == 0 else None)
    head = COMM.bcast(open(path, "rb").read(128) if RANK == 0 else None)
    assert got.dtype == BF16 and bits_equal(got, g), got.dtype
    assert b"'descr': 'bfloat16'" in head, head


def test_a_state_dict_of_bfloat16_round_trips(tmp):
    path = os.path.join(tmp, "sd")
    mesh = init_device_mesh("cpu", (N,))
    w, b = array((2 * N, 3), "bfloat16"), array((5,), "bfloat16", 2)
    mt.save({"w": mt.distribute_tensor(w, mesh, [Shard(0)]), "b": b}, path)
    index = COMM.bcast(json.load(open(os.path.join(path, "index.json")))
                       if RANK == 0 else None)
    p = Problems()
    p.expect(index["entries"]["w"]["dtype"] == "bfloat16", f"index {index['entries']['w']}")
    back = mt.load(path, mesh)
    check_dtensor(p, back["w"], w, "w")
    p.expect(isinstance(back["b"], np.ndarray) and bits_equal(back["b"], b), "b")
    like = {"w": mt.distribute_tensor(np.zeros_like(w), mesh, [Replicate()]),
            "b": np.zeros_like(b)}
    again = mt.load(path, like=like)
    check_dtensor(p, again["w"], w, "w like=")
    assert p == []


# A process that imports mpitensor and never ml_dtypes: mpitensor imports it only
# when bfloat16 is asked for, by name (no argument) or by the file it reads (the
# argument), each in a process of its own, where nothing else imported it first.
_FRESH = r"""
import sys
import numpy as np
import mpitensor as mt
assert "ml_dtypes" not in sys.modules, "import mpitensor imported ml_dtypes"
mesh = mt.init_device_mesh("cpu", (1,))
x = mt.distribute_tensor(np.arange(6.0).reshape(3, 2), mesh, [mt.Shard(0)])
assert np.sum(x * 2.0, axis=1).shape == (3,) and x.astype(np.float16).dtype == np.float16
assert "ml_dtypes" not in sys.modules, "a float computation imported ml_dtypes"
if len(sys.argv) > 1:
    path = sys.argv[1]
    back = mt.load(path, mesh, [mt.Shard(0)], **({"dataset": "x"} if path.endswith(".h5") else {}))
else:
    back = x.astype("bfloat16")
assert back.dtype == mt.bfloat16 and back.dtype.name == "bfloat16", back.dtype
assert np.array_equal(back.full_tensor().astype(np.float32), np.arange(6.0).reshape(3, 2))
print("fresh process: ok")
"""


@pytest.mark.np(1)
@pytest.mark.parametrize("suffix", ["", ".npy", ".h5", ".zarr"])
def test_a_process_that_never_imports_ml_dtypes_reads_and_makes_bfloat16(tmp, suffix):
    args = []
    if suffix:
        g = np.arange(6.0, dtype=np.float32).reshape(3, 2).astype(BF16)
        path = os.path.join(tmp, f"fresh{suffix}")
        mt.save(mt.distribute_tensor(g, init_device_mesh("cpu", (1,)), [Replicate()]), path,
                **({"dataset": "x"} if suffix == ".h5" else {}))
        args = [path]
    out = subprocess.run([sys.executable, "-c", _FRESH, *args], env=fresh_job_env(),
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0 and "fresh process: ok" in out.stdout, out.stderr[-2000:]
