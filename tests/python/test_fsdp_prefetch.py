"""fully_shard's prefetching, as torch FSDP2's: ``unshard(async_op=True)`` and its
handle, ``set_modules_to_forward_prefetch``, ``set_modules_to_backward_prefetch`` and
the default backward prefetch of the group whose forward came before. A prefetched
group's all-gather starts before the previous group's compute (the collective
counters read inside each block's forward and backward show it), the step makes
the same collectives as without prefetching and gives the same losses, gradients
and parameters; an all-gather nothing used is waited on before the step ends; bad
lists raise on every rank, as torch's."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard, _comm, nn
from mpitensor.debug import CommDebugMode
from mpitensor.fsdp import FSDPModule, MixedPrecisionPolicy, UnshardHandle, fully_shard
from mpitensor.fsdp import _fully_shard as fs

from fsdp_torch import rank_rows, torch_counts, torch_stack
from mpi_helpers import outcome, same_everywhere

W = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
AG, RS = "all_gather_into_tensor", "reduce_scatter_tensor"
DIMS = (5, 6, 7, 6, 4)
X = np.random.default_rng(0).standard_normal((12, DIMS[0]))
T = np.random.default_rng(1).standard_normal((12, 3))

# (block, "forward" or "backward", all-gathers started so far): read where each
# block computes, so a prefetch shows as a count ahead of the no-prefetch run.
LOG: list = []
FAIL: set = set()  # the blocks whose forward raises


def gathers() -> int:
    return _comm.comm_counters()[AG][0]


class Block(nn.Module):
    def __init__(self, tag, din, dout):
        super().__init__()
        self.tag = tag
        self.lin = nn.Linear(din, dout)

    def forward(self, x):
        LOG.append((self.tag, "forward", gathers()))
        if self.tag in FAIL:
            raise RuntimeError(f"block {self.tag} failed")
        h = self.lin(x)
        if h.requires_grad:
            tag = self.tag
            h.register_hook(lambda g: LOG.append((tag, "backward", gathers())))
        return np.tanh(h)


class Stack(nn.Module):
    def __init__(self, seed=4):
        super().__init__()
        mt.manual_seed(seed)
        self.layers = nn.ModuleList([Block(i, DIMS[i], DIMS[i + 1])
                                     for i in range(len(DIMS) - 1)])
        self.head = nn.Linear(DIMS[-1], 3)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture(scope="module")
def mesh():
    return mt.init_device_mesh("cpu", (W,), mesh_dim_names=("dp",))


def sharded(mesh, forward=False, backward=None):
    """The stack with every block and the root fully_sharded; ``forward`` sets each
    block to prefetch the next; ``backward`` (a list of offsets) each block's
    explicit backward list."""
    m = Stack()
    for block in m.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    n = len(m.layers)
    if forward:
        for i in range(n - 1):
            m.layers[i].set_modules_to_forward_prefetch([m.layers[i + 1]])
    if backward is not None:
        for i in range(n):
            m.layers[i].set_modules_to_backward_prefetch(
                [m.layers[i + k] for k in backward if 0 <= i + k < n])
    return m


def batch(mesh):
    """The global batch, sharded over every mesh dim (HSDP's too)."""
    pl = [Shard(0)] * mesh.ndim
    return mt.distribute_tensor(X, mesh, pl), mt.distribute_tensor(T, mesh, pl)


def loss_of(model, x, t):
    return ((model(x) - t) ** 2).mean()


def train(model, mesh, steps=3, lr=0.1):
    """Losses, per-step collective counts, final gradients and parameters."""
    x, t = batch(mesh)
    losses, counts = [], []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        with CommDebugMode() as mode:
            loss = loss_of(model, x, t)
            loss.backward()
        counts.append({k: n for k, n in mode.get_comm_counts().items() if n})
        losses.append(float(loss.full_tensor()))
        with mt.no_grad():
            for p in model.parameters():
                p.to_local()[...] -= lr * p.grad.to_local()
    grads = {n: p.grad.detach().full_tensor() for n, p in model.named_parameters()}
    params = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    return np.array(losses), counts, grads, params


def in_flight() -> int:
    return len(fs._in_flight)


@pytest.fixture
def no_implicit(monkeypatch):
    monkeypatch.setattr(fs, "_implicit_backward_prefetch", False)


def assert_same(a, b):
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12)
    assert a[1] == b[1]  # the same collectives, step by step
    for k in (2, 3):
        for name in a[k]:
            np.testing.assert_allclose(a[k][name], b[k][name], rtol=1e-12, atol=1e-15,
                                       err_msg=name)


@pytest.fixture(scope="module")
def plain(mesh):
    """The run without any prefetching."""
    mp = pytest.MonkeyPatch()
    mp.setattr(fs, "_implicit_backward_prefetch", False)
    try:
        LOG.clear()
        out = train(sharded(mesh), mesh)
        return out, list(LOG)
    finally:
        mp.undo()


@pytest.mark.parametrize("forward, backward", [(False, None), (True, None), (True, [-1]),
                                               (False, [-1, -2])])
def test_same_step_as_without_prefetch(mesh, plain, forward, backward):
    """Default backward prefetch, forward prefetch of the next block, explicit
    backward lists of one and two blocks: the same numbers and collectives."""
    got = train(sharded(mesh, forward, backward), mesh)
    assert_same(got, plain[0])
    assert in_flight() == 0
    if W > 1:
        assert got[1][0] == {AG: 9, RS: 5}  # 5 groups gathered, 4 blocks again; 5 groups


def run_once(mesh, model):
    """{(block, side): all-gathers started in the step when it computed}."""
    x, t = batch(mesh)
    LOG.clear()
    before = gathers()
    loss_of(model, x, t).backward()
    assert in_flight() == 0
    return {(tag, kind): n - before for tag, kind, n in LOG}


def test_forward_prefetch_starts_before_the_previous_compute(mesh, no_implicit):
    base = run_once(mesh, sharded(mesh))
    ahead = run_once(mesh, sharded(mesh, forward=True))
    if W == 1:
        return
    for i in range(3):
        # block i computes after the root's and its own all-gathers and,
        # prefetched, block i+1's
        assert base[(i, "forward")] == i + 2
        assert ahead[(i, "forward")] == i + 3
    assert ahead[(3, "forward")] == base[(3, "forward")] == 5


def test_forward_prefetch_after_a_forward_that_raised(mesh, no_implicit):
    """A forward that raised inside a block leaves no trace: the next step
    prefetches as a fresh model's does, and nothing stays in flight."""
    want = run_once(mesh, sharded(mesh, forward=True))
    model = sharded(mesh, forward=True)
    x, t = batch(mesh)
    FAIL.add(2)
    try:
        with pytest.raises(RuntimeError, match="block 2 failed"):
            loss_of(model, x, t)
    finally:
        FAIL.discard(2)
    assert in_flight() == 0
    assert run_once(mesh, model) == want


def test_a_pre_hook_registered_first_runs_after_fully_shards(mesh):
    """fully_shard's pre-forward hook is put first, as torch's: a user's hook
    registered before fully_shard sees the gathered weight and the cast input."""
    seen = []
    block = Block(0, DIMS[0], DIMS[1])
    block.register_forward_pre_hook(
        lambda mod, args: seen.append((mod.lin.weight.dtype, args[0].dtype)))
    fully_shard(block, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=np.float32))
    block(batch(mesh)[0])
    assert seen == [(np.float32, np.float32)]


def test_comm_debug_mode_counts_the_prefetch_in_the_previous_block(mesh):
    """CommDebugMode puts a prefetched all-gather under the module that started
    it: block i's forward counts its own and block i+1's, and block 3 none."""
    counts = []
    for forward in (False, True):
        m = sharded(mesh, forward=forward)
        x, t = batch(mesh)
        with CommDebugMode() as mode:
            loss_of(m, x, t)
        counts.append([mode.comm_module_counts.get(f"FSDPStack.layers.{i}", {})
                       .get("forward", {}).get(AG, 0) for i in range(4)])
        assert mode.get_comm_counts()[AG] == (5 if W > 1 else 0)
    if W > 1:
        assert counts == [[1, 1, 1, 1], [2, 1, 1, 0]]


def test_default_backward_prefetch_of_the_previous_block(mesh, no_implicit):
    base = run_once(mesh, sharded(mesh))
    fs._implicit_backward_prefetch = True
    ahead = run_once(mesh, sharded(mesh))
    if W == 1:
        return
    # backward runs blocks 3..0; each block's compute sees, prefetched, the
    # all-gather of the block before it already started
    for i in range(1, 4):
        assert ahead[(i, "backward")] == base[(i, "backward")] + 1, (ahead, base)
    assert ahead[(0, "backward")] == base[(0, "backward")]


def test_explicit_backward_prefetch_two_ahead(mesh, no_implicit):
    base = run_once(mesh, sharded(mesh))
    ahead = run_once(mesh, sharded(mesh, backward=[-1, -2]))
    if W == 1:
        return
    assert ahead[(3, "backward")] == base[(3, "backward")] + 2
    assert ahead[(0, "backward")] == base[(0, "backward")]


def test_unshard_async_returns_a_handle(mesh):
    m = sharded(mesh)
    block = m.layers[1]
    assert block.unshard() is None
    block.reshard()
    with CommDebugMode() as started:
        handle = block.unshard(async_op=True)
    assert isinstance(handle, UnshardHandle)
    assert in_flight() == 1
    handle.wait()
    handle.wait()  # a second wait does nothing
    assert in_flight() == 0 and block._fsdp_state.unsharded
    x, t = batch(mesh)
    # the forward gathers the root and the three other blocks: block 1 waits on nothing
    with CommDebugMode() as fwd:
        y = m(x)
    if W > 1:
        assert started.get_comm_counts()[AG] == 1 and fwd.get_comm_counts()[AG] == 4
    ((y - t) ** 2).mean().backward()
    ref = train(sharded(mesh), mesh, steps=1)
    for name, p in m.named_parameters():
        np.testing.assert_allclose(p.grad.detach().full_tensor(), ref[2][name], rtol=1e-12,
                                   atol=1e-15, err_msg=name)


def test_unshard_async_waited_by_the_forward(mesh):
    """Started before the forward (between steps) and never waited by hand: the
    block's pre-forward waits on it, with no all-gather more."""
    m = sharded(mesh)
    x, t = batch(mesh)
    with CommDebugMode() as mode:
        handles = [b.unshard(async_op=True) for b in m.layers]
        loss = loss_of(m, x, t)
        loss.backward()
    assert in_flight() == 0
    if W > 1:
        assert mode.get_comm_counts()[AG] == 9
    del handles
    ref = train(sharded(mesh), mesh, steps=1)
    for name, p in m.named_parameters():
        np.testing.assert_allclose(p.grad.detach().full_tensor(), ref[2][name], rtol=1e-12,
                                   atol=1e-15, err_msg=name)


def test_unused_prefetch_is_waited_before_the_step_ends(mesh):
    """A forward prefetch of a block the forward skips is waited on at the root's
    post-forward, one of a backward prefetch at the end of the backward."""
    m = sharded(mesh)
    m.layers[0].set_modules_to_forward_prefetch([m.layers[3]])
    m.layers[3].set_modules_to_backward_prefetch([m.layers[0]])
    x, t = batch(mesh)
    h = m.layers[1](m.layers[0](x))  # block 3 prefetched but not run
    assert in_flight() == 1  # no root forward: still in flight
    m.layers[3]._fsdp_state.reshard()  # its next reshard waits on it
    assert in_flight() == 0
    loss_of(m, x, t)  # block 3 runs: its pre-forward waits on the prefetch
    assert in_flight() == 0
    with mt.no_grad():
        m.layers[0](x)  # prefetches block 3 again; the root never runs
    fs._settle_all()  # what exit does
    assert in_flight() == 0
    del h
    y = m.layers[3](m.layers[2](m.layers[1](m.layers[0](x))))
    m.layers[0].reshard()
    # block 3's backward prefetches block 0, whose forward ran in no backward's
    # graph... it does run: waited on by its pre-backward
    ((y ** 2).mean()).backward()
    assert in_flight() == 0
    z = m.layers[3](m.layers[2](m.layers[1](np.tanh(m.layers[0](x)).detach())))
    # block 0 is outside this backward's graph: its prefetch waited at the end
    with CommDebugMode() as mode:
        ((z ** 2).mean()).backward()
    if W > 1:  # blocks 3, 2, 1 gathered again, and block 0 for nothing, as torch's
        assert mode.get_comm_counts()[AG] == 4
    assert in_flight() == 0


def test_bad_module_raises_as_torch(mesh):
    m = sharded(mesh)
    for call in (m.layers[0].set_modules_to_forward_prefetch,
                 m.layers[0].set_modules_to_backward_prefetch):
        with pytest.raises(ValueError, match="Expects FSDPModule but got"):
            call([m.layers[1], nn.Linear(2, 2)])
    assert isinstance(m.layers[1], FSDPModule)


@pytest.mark.skipif(W < 2, reason="needs ranks that disagree")
def test_lists_that_differ_raise_on_every_rank(mesh):
    m = sharded(mesh)
    target = m.layers[1] if RANK == 0 else m.layers[2]
    got = outcome(lambda: m.layers[0].set_modules_to_forward_prefetch([target]))
    assert same_everywhere(got is not None)
    assert got[0] == "ValueError" and "different modules" in got[1]
    # one rank's non-FSDP module: every rank raises its message
    bad = [nn.Linear(2, 2)] if RANK == W - 1 else [m.layers[1]]
    got = outcome(lambda: m.layers[0].set_modules_to_backward_prefetch(bad))
    assert same_everywhere(got)[0] == "ValueError" and "Expects FSDPModule" in got[1]
    # the lists were not set: training still works, with nothing in flight after
    train(m, mesh, steps=1)
    assert in_flight() == 0


def test_empty_backward_list_restores_the_default(mesh):
    m = sharded(mesh, backward=[-1, -2])
    for block in m.layers:
        block.set_modules_to_backward_prefetch([])
    assert all(not b._fsdp_state.backward_prefetch for b in m.layers)


@pytest.mark.parametrize("kw", [
    {"reshard_after_forward": False},
    {"mp_policy": "float32"},
    pytest.param({"reshard_after_forward": 2}, marks=pytest.mark.world(
        4, reason="groups of 2 of 4 ranks")),
    pytest.param({"hsdp": True}, marks=pytest.mark.world(4, reason="a (2, 2) mesh")),
])
def test_same_step_with_fsdp_options(mesh, kw):
    """Prefetching changes nothing with the other options either: blocks kept
    gathered, mixed precision, the backward gathered over post-forward groups of
    2 ranks (the prefetch then starts that smaller all-gather), HSDP."""
    kw = dict(kw)
    if kw.pop("hsdp", False):
        mesh = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    if kw.get("mp_policy") == "float32":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=np.float32)

    def model(prefetch):
        m = Stack()
        for block in m.layers:
            fully_shard(block, mesh=mesh, **kw)
        fully_shard(m, mesh=mesh, **kw)
        if prefetch:
            for i in range(len(m.layers) - 1):
                m.layers[i].set_modules_to_forward_prefetch([m.layers[i + 1]])
        return m

    fs._implicit_backward_prefetch = False
    try:
        want = train(model(False), mesh)
    finally:
        fs._implicit_backward_prefetch = True
    assert_same(train(model(True), mesh), want)
    assert in_flight() == 0


# -- against torch ---------------------------------------------------------------------

def torch_run(steps=3, lr=0.1):
    """torch 2.13's FSDP2 of the same stack on gloo, each rank on its rows, with
    forward prefetch of the next block and the default backward prefetch."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    tmesh = init_device_mesh("cpu", (W,))
    model = torch_stack(DIMS, Stack())
    for block in model.layers:
        torch_fully_shard(block, mesh=tmesh)
    torch_fully_shard(model, mesh=tmesh)
    for i in range(len(model.layers) - 1):
        model.layers[i].set_modules_to_forward_prefetch([model.layers[i + 1]])
    x, t = rank_rows(RANK, W, X, T)
    losses, counts = [], []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        with TorchCommDebugMode() as mode:
            loss = ((model(x) - t) ** 2).mean()
            loss.backward()
        counts.append(torch_counts(mode))
        losses.append(MPI.COMM_WORLD.allreduce(loss.item()) / W)
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    grads = {n: p.grad.detach().full_tensor().numpy() for n, p in model.named_parameters()}
    params = {n: p.detach().full_tensor().numpy() for n, p in model.named_parameters()}
    return np.array(losses), counts, grads, params


def test_equals_torch_with_prefetch(mesh):
    """The same losses, gradients and parameters as torch's FSDP2 with the same
    prefetching, and no more collectives per step."""
    pytest.importorskip("torch")
    from mpitensor.testing import init_torch_gloo

    init_torch_gloo()
    theirs = torch_run()
    ours = train(sharded(mesh, forward=True), mesh)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-10, err_msg="losses")
    for k, which in ((2, "grad"), (3, "param")):
        # the same parameters in the same order (theirs without the blocks' "lin.")
        assert len(ours[k]) == len(theirs[k])
        for (name, a), b in zip(ours[k].items(), theirs[k].values()):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13, err_msg=f"{which} {name}")
    for mine, torchs in zip(ours[1], theirs[1]):
        assert all(n <= torchs.get(name, 0) for name, n in mine.items()), (mine, torchs)


@pytest.mark.world(4, reason="a (2, 2) (dp, tp) mesh")
def test_same_step_beside_tensor_parallelism():
    """FSDP over mesh["dp"] of a model parallelized over mesh["tp"]: block 1's
    forward prefetched by block 0, the default backward prefetch: the same
    gradients and collectives as without."""
    from mpitensor import DTensor, Replicate
    from mpitensor.device_mesh import local_mesh
    from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from tp_models import MLP

    mesh2d = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    d = mesh2d.get_local_rank("dp")
    x = DTensor.from_local(X[d * 6:(d + 1) * 6], mesh2d["tp"], [Replicate()])
    t = DTensor.from_local(np.resize(T, (12, 5))[d * 6:(d + 1) * 6], local_mesh(),
                           [Replicate()])

    def run(prefetch):
        m = MLP((5, 6, 5))
        m = parallelize_module(m, mesh2d["tp"],
                               {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(m.w1, mesh=mesh2d["dp"])
        fully_shard(m.w2, mesh=mesh2d["dp"])
        fully_shard(m, mesh=mesh2d["dp"])
        if prefetch:
            m.w1.set_modules_to_forward_prefetch([m.w2])
        fs._implicit_backward_prefetch = prefetch
        try:
            with CommDebugMode() as mode:
                loss_of(m, x, t).backward()
        finally:
            fs._implicit_backward_prefetch = True
        return mode.get_comm_counts(), {n: p.grad.detach().full_tensor()
                                        for n, p in m.named_parameters()}

    (c0, g0), (c1, g1) = run(False), run(True)
    assert dict(c0) == dict(c1) and in_flight() == 0
    for name in g0:
        np.testing.assert_allclose(g1[name], g0[name], rtol=1e-12, atol=1e-15, err_msg=name)
