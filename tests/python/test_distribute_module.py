"""mpitensor.distribute_module: partition_fn per submodule by name, everything else
replicated (parameters and buffers), input_fn/output_fn as forward hooks (three-
and deprecated two-argument forms), and a second call refused."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor, nn
from mpitensor.debug import CommDebugMode

# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")


def model():
    mt.manual_seed(11)
    m = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 6))
    m[0].register_buffer("mask", np.arange(10.0))
    return m


def test_default_replicates_parameters_and_buffers(mesh):
    plain = model()
    x = np.random.default_rng(0).standard_normal((3, 6))
    ref = plain(x)
    dist = distribute_module(model(), mesh)
    for name, t in list(dist.named_parameters()) + list(dist.named_buffers()):
        assert isinstance(t, DTensor) and t.placements == (Replicate(),), name
    np.testing.assert_array_equal(dist[0].mask.full_tensor(), np.arange(10.0))
    y = dist(DTensor.from_local(x, mesh))
    np.testing.assert_allclose(y.full_tensor(), ref, rtol=1e-12)


def test_partition_fn_sees_every_submodule_by_name(mesh):
    seen = []

    def partition(name, module, device_mesh):
        seen.append((name, type(module).__name__))
        assert device_mesh is mesh
        if name == "0":
            module.register_parameter("weight", distribute_tensor(module.weight, mesh,
                                                                  [Shard(0)]))

    m = distribute_module(model(), mesh, partition)
    assert seen == [("", "Sequential"), ("0", "Linear"), ("1", "ReLU"), ("2", "Linear")]
    assert m[0].weight.placements == (Shard(0),)
    assert m[0].bias.placements == (Replicate(),)
    assert m[2].weight.placements == (Replicate(),)


def test_input_and_output_fn_become_hooks(mesh):
    calls = []

    def input_fn(module, inputs, device_mesh):
        calls.append("in")
        return DTensor.from_local(inputs[0], device_mesh, [Replicate()])

    def output_fn(module, outputs, device_mesh):
        calls.append("out")
        return outputs.to_local()

    plain = model()
    m = distribute_module(model(), mesh, input_fn=input_fn, output_fn=output_fn)
    x = np.ones((2, 6))
    with CommDebugMode() as comm:
        y = m(x)
    assert comm.get_total_counts() == 0
    assert calls == ["in", "out"] and isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, plain(x), rtol=1e-12)


def test_two_argument_functions_warn(mesh):
    with pytest.warns(FutureWarning, match="input_fn"):
        m = distribute_module(model(), mesh,
                              input_fn=lambda inputs, mesh_: DTensor.from_local(inputs[0], mesh_))
    with pytest.warns(FutureWarning, match="output_fn"):
        distribute_module(nn.Linear(2, 2), mesh,
                          output_fn=lambda outputs, mesh_: outputs.to_local())
    assert isinstance(m(np.ones((1, 6))), DTensor)
    with pytest.raises(ValueError, match="3 arguments"):
        distribute_module(nn.Linear(2, 2), mesh, input_fn=lambda a: a)


def test_second_call_and_bad_module_raise(mesh):
    m = distribute_module(model(), mesh)
    with pytest.raises(RuntimeError, match="only be called once"):
        distribute_module(m, mesh)
    with pytest.raises(TypeError, match="nn.Module"):
        distribute_module(object(), mesh)
