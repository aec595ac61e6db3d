"""Each parallel style on Linear(16, 16) and Embedding at any number of ranks: the
parameter placements, the local output shapes and the forward collectives that
torch gives, reprs like torch's, and the errors of wrong arguments."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, nn
from mpitensor.debug import CommDebugMode
from mpitensor.parallel import (
    ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput, PrepareModuleOutput,
    RowwiseParallel, SequenceParallel, parallelize_module)

from mpi_helpers import outcome, same_everywhere

W = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
ONE = 1 if W > 1 else 0  # a mesh of one rank runs no collective


def chunk(n, i=RANK):
    size = -(-n // W)
    return max(0, min(size, n - i * size))


# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")


def linear(seed=0, i=16, o=16):
    mt.manual_seed(seed)
    return nn.Linear(i, o)


def embedding():
    mt.manual_seed(3)
    return nn.Embedding(13, 16)


X = np.random.default_rng(5).standard_normal((4, 16))
IDX = np.array([[0, 12, 5, 7], [3, 3, 11, 1]])


def run(module, x):
    with CommDebugMode() as comm:
        y = module(x)
    return y, dict(comm.get_comm_counts())


def test_colwise_linear(mesh):
    ref = linear()(X)
    m = parallelize_module(linear(), mesh, ColwiseParallel())
    assert m.weight.placements == (Shard(0),) and m.bias.placements == (Shard(0),)
    assert m.weight.to_local().shape == (chunk(16), 16)
    y, counts = run(m, X)
    assert counts == {}
    assert isinstance(y, np.ndarray) and y.shape == (4, chunk(16))
    start = RANK * -(-16 // W)
    np.testing.assert_allclose(y, ref[:, start:start + chunk(16)], rtol=1e-12)


def test_colwise_linear_sharded_input_gathers_once(mesh):
    """A local input is an even shard, as in torch: only the input and the output
    are gathered (no exchange of local sizes)."""
    xe = np.random.default_rng(6).standard_normal((2 * W, 16))
    ref = linear()(xe)
    m = parallelize_module(linear(), mesh, ColwiseParallel(
        input_layouts=Shard(0), output_layouts=Replicate()))
    x = distribute_tensor(xe, mesh, [Shard(0)])
    with CommDebugMode() as comm:
        y = m(x.to_local())
    counts = comm.get_comm_counts()
    assert dict(counts) == ({"all_gather_into_tensor": 2} if W > 1 else {})  # input, output
    m2 = parallelize_module(linear(), mesh, ColwiseParallel(input_layouts=Shard(0)))
    y2, counts2 = run(m2, x.to_local())
    assert counts2 == ({"all_gather_into_tensor": 1} if W > 1 else {})
    np.testing.assert_allclose(y, ref, rtol=1e-12)


def test_rowwise_linear_all_reduce(mesh):
    ref = linear()(X)
    m = parallelize_module(linear(), mesh, RowwiseParallel())
    assert m.weight.placements == (Shard(1),) and m.bias.placements == (Replicate(),)
    x = distribute_tensor(X, mesh, [Shard(1)]).to_local()
    y, counts = run(m, x)
    assert counts == ({"all_reduce": 1} if W > 1 else {})
    assert y.shape == (4, 16)
    np.testing.assert_allclose(y, ref, rtol=1e-12)


def test_rowwise_linear_uneven_input_width(mesh):
    """A local input of an uneven split feeds the right global width."""
    lin = linear(1, 11, 5)
    ref = lin(X[:, :11])
    m = parallelize_module(linear(1, 11, 5), mesh, RowwiseParallel())
    y, _ = run(m, distribute_tensor(X[:, :11], mesh, [Shard(1)]).to_local())
    np.testing.assert_allclose(y, ref, rtol=1e-12)


def test_rowwise_linear_of_six_features_is_one_all_reduce(mesh):
    """6 input features over 4 ranks are 2, 2, 2, 0: the rank with none adds zeros
    to the Partial, so the forward is still one all-reduce and no gather."""
    ref = linear(2, 6, 5)(X[:, :6])
    m = parallelize_module(linear(2, 6, 5), mesh, RowwiseParallel())
    y, counts = run(m, distribute_tensor(X[:, :6], mesh, [Shard(1)]).to_local())
    assert counts == ({"all_reduce": 1} if W > 1 else {})
    np.testing.assert_allclose(y, ref, rtol=1e-12)


def test_rowwise_linear_reduce_scatter(mesh):
    ref = linear()(X)
    m = parallelize_module(linear(), mesh, RowwiseParallel(output_layouts=Shard(0),
                                                           use_local_output=False))
    y, counts = run(m, distribute_tensor(X, mesh, [Shard(1)]).to_local())
    assert counts == ({"reduce_scatter_tensor": 1} if W > 1 else {})
    assert isinstance(y, DTensor) and y.placements == (Shard(0),)
    assert y.to_local().shape == (chunk(4), 16)
    np.testing.assert_allclose(y.full_tensor(), ref, rtol=1e-12)


def test_colwise_embedding(mesh):
    ref = embedding()(IDX)
    m = parallelize_module(embedding(), mesh, ColwiseParallel())
    assert m.weight.placements == (Shard(1),)
    y, counts = run(m, IDX)
    assert counts == {}
    assert y.shape == (2, 4, chunk(16))
    m2 = parallelize_module(embedding(), mesh, ColwiseParallel(output_layouts=Replicate()))
    y2, _ = run(m2, IDX)
    np.testing.assert_array_equal(y2, ref)


def test_rowwise_embedding_is_vocab_parallel(mesh):
    ref = embedding()(IDX)
    m = parallelize_module(embedding(), mesh, RowwiseParallel(input_layouts=Replicate()))
    assert m.weight.placements == (Shard(0),)
    assert m.weight.to_local().shape == (chunk(13), 16)
    y, counts = run(m, IDX)
    assert counts == ({"all_reduce": 1} if W > 1 else {})
    np.testing.assert_array_equal(y, ref)
    m2 = parallelize_module(embedding(), mesh, RowwiseParallel(
        input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False))
    y2, counts2 = run(m2, IDX)
    assert counts2 == ({"reduce_scatter_tensor": 1} if W > 1 else {})
    assert y2.placements == (Shard(1),)
    np.testing.assert_array_equal(y2.full_tensor(), ref)


def test_sequence_parallel_layer_norm(mesh):
    x = np.random.default_rng(2).standard_normal((2, 4 * W, 16))
    ref = nn.LayerNorm(16)(x)
    m = parallelize_module(nn.LayerNorm(16), mesh, SequenceParallel())
    assert m.weight.placements == (Replicate(),)
    local = distribute_tensor(x, mesh, [Shard(1)]).to_local()
    with CommDebugMode() as comm:
        y = m(local)
    # a local input is an even shard, as in torch: nothing travels
    assert dict(comm.get_comm_counts()) == {}
    assert isinstance(y, DTensor) and y.placements == (Shard(1),)
    assert y.to_local().shape == (2, 4, 16)
    np.testing.assert_allclose(y.full_tensor(), ref, rtol=1e-12)
    # A replicated DTensor input is resharded on the sequence dim (no communication).
    y2, counts2 = run(m, distribute_tensor(x, mesh, [Replicate()]))
    assert counts2 == {} and y2.placements == (Shard(1),)
    m3 = parallelize_module(nn.RMSNorm(16), mesh, SequenceParallel(sequence_dim=0,
                                                                   use_local_output=True))
    y3, _ = run(m3, distribute_tensor(x[0], mesh, [Shard(0)]).to_local())
    assert isinstance(y3, np.ndarray) and y3.shape == (4, 16)


def test_prepare_module_input_and_output(mesh):
    seen = {}

    class Probe(nn.Module):
        def forward(self, a, b, *, c=None):
            seen.update(a=a, b=b, c=c)
            return a

    x = np.random.default_rng(4).standard_normal((2 * W, 3))
    local = distribute_tensor(x, mesh, [Shard(0)]).to_local()
    p = parallelize_module(Probe(), mesh, PrepareModuleInput(
        input_layouts=(Shard(0), None), desired_input_layouts=(Replicate(), None)))
    with CommDebugMode() as comm:
        p(local, "untouched")
    assert comm.get_comm_counts()["all_gather_into_tensor"] == ONE  # the data only
    assert seen["a"].placements == (Replicate(),) and seen["b"] == "untouched"
    np.testing.assert_array_equal(seen["a"].to_local(), x)

    q = parallelize_module(Probe(), mesh, PrepareModuleInput(
        input_kwarg_layouts={"c": Shard(0)}, desired_input_kwarg_layouts={"c": Replicate()},
        use_local_output=True))
    q(1, 2, c=local)
    assert isinstance(seen["c"], np.ndarray)
    np.testing.assert_array_equal(seen["c"], x)

    o = parallelize_module(Probe(), mesh, PrepareModuleOutput(
        output_layouts=Replicate(), desired_output_layouts=Shard(0)))
    y = o(x, None)
    np.testing.assert_array_equal(y, distribute_tensor(x, mesh, [Shard(0)]).to_local())

    io = parallelize_module(Probe(), mesh, PrepareModuleInputOutput(
        input_layouts=(Shard(0), None), desired_input_layouts=(Replicate(), None),
        output_layouts=Replicate(), desired_output_layouts=Shard(0)))
    np.testing.assert_array_equal(io(local, None), local)
    with pytest.raises(ValueError, match="same length"):
        p(local)


def test_reprs_like_torch():
    assert repr(ColwiseParallel()) == ("ColwiseParallel(input_layouts=(Replicate(),), "
                                       "output_layouts=(Shard(dim=-1),), use_local_output=True)")
    assert repr(RowwiseParallel(output_layouts=Shard(1))) == (
        "RowwiseParallel(input_layouts=(Shard(dim=-1),), output_layouts=(Shard(dim=1),), "
        "use_local_output=True)")
    assert repr(SequenceParallel()) == "SequenceParallel(sequence_dim=1, use_local_output=False)"
    assert repr(PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=Replicate())) \
        == ("PrepareModuleInput(input_layouts=(Shard(dim=0),), desired_input_layouts="
            "(Replicate(),), input_kwarg_layouts={}, desired_input_kwarg_layouts={}, "
            "use_local_output=False)")
    assert repr(PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))) \
        == ("PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts="
            "(Shard(dim=0),), use_local_output=True)")
    assert repr(PrepareModuleInputOutput(output_layouts=Replicate(),
                                         desired_output_layouts=Shard(0))).startswith(
        "PrepareModuleInputOutput(input_layouts=None, desired_input_layouts=None, "
        "input_kwarg_layouts={}, desired_input_kwarg_layouts={}, use_local_input=False, "
        "output_layouts=(Replicate(),)")


def test_bad_arguments(mesh):
    with pytest.raises(TypeError):
        ColwiseParallel(Replicate())  # keyword-only
    with pytest.raises(TypeError, match="Placement"):
        RowwiseParallel(input_layouts="shard")
    with pytest.raises(ValueError, match="same length"):
        PrepareModuleInput(input_layouts=(Shard(0), None), desired_input_layouts=Replicate())
    with pytest.raises(ValueError, match="should not be None"):
        PrepareModuleInput(input_layouts=Shard(0))
    with pytest.raises(NotImplementedError, match="nn.Linear and nn.Embedding"):
        parallelize_module(nn.LayerNorm(4), mesh, ColwiseParallel())
    with pytest.raises(NotImplementedError, match="nn.Linear and nn.Embedding"):
        parallelize_module(nn.ReLU(), mesh, RowwiseParallel())
    m = parallelize_module(linear(), mesh, ColwiseParallel())
    with pytest.raises(RuntimeError, match="only be called once"):
        parallelize_module(m, mesh, RowwiseParallel())


def test_local_inputs_of_uneven_and_inconsistent_sizes(mesh):
    """Uneven shards pass as a DTensor; with collective checks on, local inputs of
    unequal sizes raise on every rank rather than hanging (torch assumes even)."""
    from mpitensor.debug import set_collective_checks
    x = np.random.default_rng(8).standard_normal((W + 1, 16))
    ref = linear()(x)
    m = parallelize_module(linear(), mesh, ColwiseParallel(input_layouts=Shard(0),
                                                           output_layouts=Replicate()))
    np.testing.assert_allclose(m(distribute_tensor(x, mesh, [Shard(0)])), ref, rtol=1e-12)
    if W > 1:
        bad = np.ones((1 if RANK == 0 else 2, 16))
        set_collective_checks(True)
        try:
            with pytest.raises(ValueError, match="taken as an even shard"):
                m(bad)
        finally:
            set_collective_checks(False)


@pytest.fixture
def short_watchdog():
    """Where ranks could disagree, a regression would leave some waiting in a
    collective: the watchdog then aborts the job in seconds, not at CI's timeout."""
    mt._comm.set_collective_timeout(20.0)
    yield
    text = os.environ.get("MPITENSOR_TIMEOUT", "").strip()
    mt._comm.set_collective_timeout(float(text) if text else None)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.attn = nn.ReLU()

    def forward(self, x):
        return self.attn(self.norm(x))


PRODUCERS = {
    "sequence_parallel": lambda: SequenceParallel(use_local_output=True),
    "prepare_input": lambda: PrepareModuleInput(
        input_layouts=Shard(1), desired_input_layouts=Shard(1), use_local_output=True),
}
CONSUMERS = {
    "prepare_input": lambda: PrepareModuleInput(input_layouts=Shard(1),
                                                desired_input_layouts=Replicate()),
    "sequence_parallel": lambda: SequenceParallel(),
    "colwise_of_shard_1": lambda: ColwiseParallel(input_layouts=Shard(1)),
}


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
@pytest.mark.parametrize("producer", sorted(PRODUCERS))
@pytest.mark.parametrize("seq", ["W + 1", "2 * W - 1", "2 * W"])
def test_uneven_sequences_handed_on_as_local_arrays(mesh, short_watchdog, producer,
                                                    consumer, seq):
    """A style's local output of an uneven sequence split (W + 1 leaves empty shards
    at np 3 and 4) taken by the next style as an even shard, as torch does: every
    rank raises the same ValueError, where the consumer's all-gather failed with
    MPI_ERR_TRUNCATE on some ranks and returned a wrong shape on others (or, with
    no collective, each rank kept its own global shape). Even splits still run."""
    n = eval(seq, {"W": W})  # noqa: S307 - the test's own parameter
    x = np.random.default_rng(2).standard_normal((2, n, 8))
    block = _Block()
    if consumer == "colwise_of_shard_1":
        block.attn = linear(i=8, o=8)
    ref = block(x)
    parallelize_module(block, mesh, {"norm": PRODUCERS[producer](),
                                     "attn": CONSUMERS[consumer]()})
    dx = distribute_tensor(x, mesh, [Shard(1)])
    got = same_everywhere(outcome(lambda: block(dx)))
    if n % W:
        assert got is not None and got[0] == "ValueError", got
        assert "differ in shape across the ranks" in got[1], got
        assert "use_local_output=False" in got[1], got
        y = distribute_tensor(np.ones(4 * W), mesh, [Shard(0)]).full_tensor()
        np.testing.assert_array_equal(y, np.ones(4 * W))
        return
    assert got is None, got
    y = block(dx)
    y = y.full_tensor() if isinstance(y, DTensor) else y
    if consumer == "colwise_of_shard_1":
        y = np.concatenate(MPI.COMM_WORLD.allgather(y), axis=-1)
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


WRONG_INPUTS = {  # the last rank's local input of a Linear(11, 5) with a Shard(-1) input
    "width": (lambda x: np.ones((4, x.shape[1] + 1)), "in_features=11"),
    "batch": (lambda x: np.ones((3, x.shape[1])), "leading dims or dtype"),
    "dtype": (lambda x: x.astype(np.float32), "leading dims or dtype"),
}


@pytest.mark.skipif(W < 2, reason="an input that differs on one rank")
@pytest.mark.parametrize("style", ["rowwise", "colwise_of_shard_last"])
@pytest.mark.parametrize("bad", sorted(WRONG_INPUTS))
def test_linear_local_input_of_a_wrong_shape_on_one_rank(mesh, short_watchdog, style, bad):
    """in_features gives the global width, so each rank checks its own and the ranks
    agree: a wrong width, other leading dims or another dtype on the last rank
    raise the same ValueError on every rank. Before, a wrong width failed that
    rank's matmul while the others waited in the output's all-reduce (or, for
    Colwise, the input's all-gather), and other leading dims or dtype gave the
    ranks reductions of different counts or types."""
    make = (RowwiseParallel() if style == "rowwise" else
            ColwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate()))
    m = parallelize_module(linear(1, 11, 5), mesh, make)
    x = distribute_tensor(X[:, :11], mesh, [Shard(1)]).to_local()
    change, words = WRONG_INPUTS[bad]
    if RANK == W - 1:
        x = change(x)
    got = same_everywhere(outcome(lambda: m(x)))
    assert got is not None and got[0] == "ValueError", got
    assert words in got[1], got
    y = distribute_tensor(np.ones(4 * W), mesh, [Shard(0)]).full_tensor()
    np.testing.assert_array_equal(y, np.ones(4 * W))


def test_linear_local_input_costs_one_agreement(mesh, monkeypatch):
    """The check is one agreement (a 24-byte all-reduce) per forward next to the
    output's all-reduce, on a mesh of several ranks; a DTensor input, whose global
    width is known, costs none."""
    calls = []
    agree = mt._comm.agree
    monkeypatch.setattr(mt._comm, "agree", lambda *a: calls.append(a[1:3]) or agree(*a))
    m = parallelize_module(linear(1, 11, 5), mesh, RowwiseParallel())
    dx = distribute_tensor(X[:, :11], mesh, [Shard(1)])
    y, counts = run(m, dx.to_local())
    assert len(calls) == (1 if W > 1 else 0) and counts == ({"all_reduce": 1} if W > 1 else {})
    np.testing.assert_allclose(y, linear(1, 11, 5)(X[:, :11]), rtol=1e-12, atol=1e-12)
    calls.clear()
    run(m, dx)
    assert calls == []
