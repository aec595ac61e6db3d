"""examples/fsdp_tp_example.py, torch's 2-D example ported (TP + SP over tp,
fully_shard over dp): its training losses on the (dp, tp) mesh of every world size
equal the one-process run's, and they fall."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from mpi4py import MPI

import mpitensor as mt

W = MPI.COMM_WORLD.Get_size()
PATH = Path(__file__).resolve().parents[2] / "examples" / "fsdp_tp_example.py"
spec = importlib.util.spec_from_file_location("fsdp_tp_example", PATH)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


def test_losses_equal_one_process():
    tp = 2 if W % 2 == 0 else 1
    mesh = mt.init_device_mesh("cpu", (W // tp, tp), mesh_dim_names=("dp", "tp"))
    alone = mt.init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"),
                                comm=MPI.COMM_SELF)
    got = example.train(mesh, steps=3)
    want = example.train(alone, steps=3)
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert want[-1] < want[0] - 0.3
