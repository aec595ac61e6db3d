"""fully_shard on a 2-D (replicate, shard) mesh: torch FSDP2's HSDP. Every parameter
is (Replicate(), Shard(0)), unevenly on dim 0 as on a 1-D mesh; per group a forward
all-gathers over the shard dim once, a backward gathers again when the forward
resharded, reduce-scatters once over the shard dim and all-reduces once over the
replicate dim, never more calls or bytes than torch's design; losses, gradients
and parameters after AdamW steps equal the one-rank model's in float64 and, when
torch is installed, torch 2.13's HSDP on gloo (its division of the gradients
included); reshard_after_forward as a bool and an int and mp_policy work as
torch's; a mesh or module fully_shard cannot take raises torch's error on every
rank. Meshes: (2, 2), (1, 4), (4, 1) at 4 ranks, (1, W) and (W, 1) below."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Replicate, Shard, nn
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import local_mesh
from mpitensor.fsdp import MixedPrecisionPolicy, fully_shard
from tp_models import MLP

COMM = MPI.COMM_WORLD
W, RANK = COMM.Get_size(), COMM.Get_rank()
AG, RS, AR = "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"
NAMES = ("replicate", "shard")
# 12 rows: every rank's batch is the same size at 1..4 ranks, as torch's per-rank
# means need for their average to be the global mean.
X = np.random.default_rng(0).standard_normal((12, 5))
T = np.random.default_rng(1).standard_normal((12, 3))
SHAPES = [(2, 2), (1, 4), (4, 1)] if W == 4 else sorted({(1, W), (W, 1)})
LR, DECAY, STEPS = 0.05, 0.1, 3

_meshes: dict = {}


def hsdp_mesh(shape):
    if shape not in _meshes:
        _meshes[shape] = mt.init_device_mesh("cpu", shape, mesh_dim_names=NAMES)
    return _meshes[shape]


def sharded(mesh, **kw):
    m = MLP()
    fully_shard(m.w1, mesh=mesh, **kw)
    fully_shard(m.w2, mesh=mesh, **kw)
    return fully_shard(m, mesh=mesh, **kw)


def batch(mesh, placements=(Shard(0), Shard(0))):
    """The global batch; sharded over both dims it is rank r's rows r of W, as torch's
    per-rank batches below."""
    return (mt.distribute_tensor(X, mesh, list(placements)),
            mt.distribute_tensor(T, mesh, list(placements)))


def loss_of(model, x, t):
    return ((model(x) - t) ** 2).mean()


def train(model, x, t, steps=STEPS):
    """AdamW steps; the losses, and the gradients and parameters after them."""
    opt = mt.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(model, x, t)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().full_tensor()))
    grads = {n: p.grad.detach().full_tensor() for n, p in model.named_parameters()}
    params = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    return np.array(losses), grads, params


def one_rank():
    """The one-rank model on the whole batch (this rank's local mesh)."""
    m = MLP()
    lm = local_mesh()
    for mod in m.modules():
        for name, p in list(mod._parameters.items()):
            mod._parameters[name] = DTensor.from_local(np.array(p), lm,
                                                       [Replicate()]).requires_grad_()
    return train(m, DTensor.from_local(X, lm, [Replicate()]),
                 DTensor.from_local(T, lm, [Replicate()]))


@pytest.fixture(scope="module")
def reference():
    return one_rank()


def assert_same(got, want, rtol=1e-10, atol=1e-13):
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol, err_msg="losses")
    for which, g, w in (("grad", got[1], want[1]), ("param", got[2], want[2])):
        assert g.keys() == w.keys()
        for name in w:
            np.testing.assert_allclose(g[name], w[name], rtol=rtol, atol=atol,
                                       err_msg=f"{which} {name}")


# -- layout ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_parameters_replicate_shard(shape):
    mesh = hsdp_mesh(shape)
    m = sharded(mesh)
    plain = MLP()
    s = mesh.get_local_rank("shard")
    for (name, p), (_, q) in zip(m.named_parameters(), plain.named_parameters()):
        assert p.device_mesh is mesh and p.placements == (Replicate(), Shard(0)), name
        assert p.requires_grad and p.is_leaf, name
        np.testing.assert_array_equal(p.detach().full_tensor(), q, err_msg=name)
        rows = -(-q.shape[0] // shape[1])  # torch.chunk's, uneven and empty shards too
        np.testing.assert_array_equal(p.detach().to_local(), q[s * rows:(s + 1) * rows],
                                      err_msg=name)


# -- numbers --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_adamw_steps_equal_one_rank(shape, reference):
    mesh = hsdp_mesh(shape)
    m = sharded(mesh)
    got = train(m, *batch(mesh))
    for name, p in m.named_parameters():
        assert p.grad.placements == (Replicate(), Shard(0)), name
        assert p.grad.device_mesh is mesh, name
    assert_same(got, reference)


@pytest.mark.parametrize("placements", [(Replicate(), Shard(0)), (Replicate(), Replicate()),
                                        (Shard(0), Replicate())])
def test_replicated_batches_are_averaged(placements, reference):
    """A batch replicated over a dim gives each rank of it a replica's whole
    gradient, which the reduction averages, as torch's: the same step."""
    mesh = hsdp_mesh(SHAPES[0])
    assert_same(train(sharded(mesh), *batch(mesh, placements)), reference)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reshard", [False, True])
def test_collectives_per_step(shape, reshard):
    """Per group: forward one all-gather over the shard dim; backward one more when
    resharded (not the root's), one reduce-scatter over the shard dim and one
    all-reduce over the replicate dim, of the bytes torch's design moves (the same
    padded buffers); a dim of one rank moves nothing."""
    r, s = shape
    mesh = hsdp_mesh(shape)
    m = sharded(mesh, reshard_after_forward=reshard)
    x, t = batch(mesh)
    with CommDebugMode() as fwd:
        loss = loss_of(m, x, t)
    with CommDebugMode() as bwd:
        loss.backward()
    # each group's flat shard in float64, padded as torch's
    padded = [sum(-(-p.shape[0] // s) * int(np.prod(p.shape[1:])) * 8
                  for p in lin.parameters()) for lin in (m.w1, m.w2)]
    groups = len(padded)
    gathers = groups if s > 1 else 0
    want_fwd = {AG: (gathers, sum((s - 1) * n for n in padded))}
    want_bwd = {AG: (gathers if reshard else 0, sum((s - 1) * n for n in padded) if reshard
                     else 0),
                RS: (gathers, sum((s - 1) * n for n in padded)),  # (s-1)/s of s*n
                AR: (groups if r > 1 else 0, sum(2 * (r - 1) * n // r for n in padded))}
    for mode, want in ((fwd, want_fwd), (bwd, want_bwd)):
        counts, sent = mode.get_comm_counts(), mode.get_comm_bytes()
        assert mode.get_total_counts() == sum(c for c, _ in want.values())
        for name, (calls, nbytes) in want.items():
            assert counts[name] == calls, (name, dict(counts))
            assert sent[name] == nbytes, (name, dict(sent))


@pytest.mark.world(4, reason="a non-trivial divisor of the shard dim: 2 of 4")
def test_reshard_to_groups_of_two():
    """reshard_after_forward=2 on (1, 4): after forward each pair of ranks keeps the
    group between them, the backward gathers over 2 ranks (2/3 of the forward's
    bytes), and the step is reshard_after_forward=True's."""
    mesh = hsdp_mesh((1, 4))
    results = {}
    for raf in (True, 2):
        m = sharded(mesh, reshard_after_forward=raf)
        x, t = batch(mesh)
        with CommDebugMode() as fwd:
            loss = loss_of(m, x, t)
        with CommDebugMode() as bwd:
            loss.backward()
        assert fwd.get_comm_counts()[AG] == 2 and bwd.get_comm_counts()[AG] == 2
        sent = fwd.get_comm_bytes()[AG], bwd.get_comm_bytes()[AG]
        assert sent[1] == (sent[0] if raf is True else 2 * sent[0] // 3), sent
        results[raf] = {n: p.grad.detach().full_tensor() for n, p in m.named_parameters()}
    for name, g in results[True].items():
        np.testing.assert_array_equal(results[2][name], g, err_msg=name)


@pytest.mark.parametrize("shape", SHAPES)
def test_reshard_int_is_a_divisor_of_the_shard_dim(shape, reference):
    """1 is False and the shard dim's size True, as torch's; the step is the same."""
    mesh = hsdp_mesh(shape)
    for raf in (1, shape[1]):
        assert_same(train(sharded(mesh, reshard_after_forward=raf), *batch(mesh)), reference)
    with pytest.raises(ValueError, match="must divide the data-parallel size"):
        fully_shard(MLP(), mesh=mesh, reshard_after_forward=shape[1] + 1)


@pytest.mark.parametrize("shape", SHAPES)
def test_mixed_precision_moves_half(shape, reference):
    """float64 parameters gathered and reduced in float32: half the bytes of each
    collective, gradients and parameters float64 (Replicate, Shard(0)), the step
    within float32 of the float64 one."""
    mesh = hsdp_mesh(shape)
    mp = MixedPrecisionPolicy(param_dtype=np.float32, reduce_dtype=np.float32,
                              output_dtype=np.float64)
    sent = {}
    for policy in (MixedPrecisionPolicy(), mp):
        m = sharded(mesh, mp_policy=policy)
        x, t = batch(mesh)
        with CommDebugMode() as step:
            loss_of(m, x, t).backward()
        sent[policy] = step.get_comm_bytes()
        for name, p in m.named_parameters():
            assert p.grad.detach().to_local().dtype == np.float64, name
            assert p.grad.placements == (Replicate(), Shard(0)), name
    for name in (AG, RS, AR):
        assert sent[mp][name] * 2 == sent[MixedPrecisionPolicy()][name], name
    assert_same(train(sharded(mesh, mp_policy=mp), *batch(mesh)), reference, rtol=1e-4,
                atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_float16_reduce_is_divided_as_torchs(shape, reference):
    """reduce_dtype float16, which torch divides by a power of two before the sum
    and by the rest after: gradients of a replicated batch within float16 of the
    float64 ones."""
    mesh = hsdp_mesh(shape)
    m = sharded(mesh, mp_policy=MixedPrecisionPolicy(reduce_dtype=np.float16))
    loss_of(m, *batch(mesh, (Replicate(), Replicate()))).backward()
    want = one_rank_grads()
    for name, p in m.named_parameters():
        g = p.grad.detach().full_tensor()
        np.testing.assert_allclose(g, want[name], rtol=2e-3, atol=2e-3 * np.abs(g).max(),
                                   err_msg=name)


def one_rank_grads():
    m = MLP()
    lm = local_mesh()
    for mod in m.modules():
        for name, p in list(mod._parameters.items()):
            mod._parameters[name] = DTensor.from_local(np.array(p), lm,
                                                       [Replicate()]).requires_grad_()
    loss_of(m, DTensor.from_local(X, lm, [Replicate()]),
            DTensor.from_local(T, lm, [Replicate()])).backward()
    return {n: p.grad.detach().to_local() for n, p in m.named_parameters()}


# -- against torch ---------------------------------------------------------------------

_torch_meshes: dict = {}
# torch's c10d ops of FSDP2 by the names of mpitensor's counters
TORCH_NAMES = {"_allgather_base_": AG, "_reduce_scatter_base_": RS, "allreduce_": AR}


def torch_hsdp(shape, mp=None, steps=STEPS):
    """torch 2.13's HSDP of the same MLP on gloo, each rank on its rows of the batch:
    the global losses, and the gradients and parameters after AdamW steps."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    if shape not in _torch_meshes:
        _torch_meshes[shape] = init_device_mesh("cpu", shape, mesh_dim_names=NAMES)
    tmesh = _torch_meshes[shape]

    class TorchMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)

        def forward(self, x):
            return self.w2(torch.tanh(self.w1(x)))

    model = TorchMLP().double()
    with torch.no_grad():
        for (name, p), (_, q) in zip(model.named_parameters(), MLP().named_parameters()):
            p.copy_(torch.from_numpy(np.array(q)))
    kw = {} if mp is None else {"mp_policy": mp}
    torch_fully_shard(model.w1, mesh=tmesh, **kw)
    torch_fully_shard(model.w2, mesh=tmesh, **kw)
    torch_fully_shard(model, mesh=tmesh, **kw)
    rows = len(X) // W
    x = torch.from_numpy(X[RANK * rows:(RANK + 1) * rows])
    t = torch.from_numpy(T[RANK * rows:(RANK + 1) * rows])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)
    losses, counts = [], []
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode
    for _ in range(steps):
        opt.zero_grad()
        with TorchCommDebugMode() as mode:
            loss = ((model(x) - t) ** 2).mean()
            loss.backward()
        counts.append({TORCH_NAMES.get(getattr(k, "__name__", str(k)), str(k)): n
                       for k, n in mode.get_comm_counts().items()})
        opt.step()
        losses.append(COMM.allreduce(loss.item()) / W)
    grads = {n: p.grad.detach().full_tensor().numpy() for n, p in model.named_parameters()}
    params = {n: p.detach().full_tensor().numpy() for n, p in model.named_parameters()}
    return (np.array(losses), grads, params), counts


@pytest.mark.parametrize("shape", SHAPES)
def test_equals_torch_hsdp(shape):
    """The same losses, gradients and parameters as torch's HSDP after AdamW steps
    (float64), the same placements, and no more collective calls per step."""
    pytest.importorskip("torch")
    from mpitensor.testing import init_torch_gloo

    init_torch_gloo()
    theirs, torch_counts = torch_hsdp(shape)
    mesh = hsdp_mesh(shape)
    m = sharded(mesh)
    x, t = batch(mesh)
    with CommDebugMode() as step:
        loss_of(m, x, t).backward()
    ours = {k: n for k, n in step.get_comm_counts().items() if n}
    assert set(ours) <= set(torch_counts[0]), (ours, torch_counts[0])
    for name, n in ours.items():
        assert n <= torch_counts[0][name], (ours, torch_counts[0])
    assert_same(train(sharded(mesh), x, t), theirs)


@pytest.mark.parametrize("shape", SHAPES)
def test_mixed_precision_equals_torch(shape):
    """param_dtype and reduce_dtype float32 on float64 parameters, as torch's (its
    reductions then divide after the sum, ReduceOp.AVG)."""
    torch = pytest.importorskip("torch")
    from mpitensor.testing import init_torch_gloo
    from torch.distributed.fsdp import MixedPrecisionPolicy as TorchPolicy

    init_torch_gloo()
    theirs, _ = torch_hsdp(shape, TorchPolicy(param_dtype=torch.float32,
                                              reduce_dtype=torch.float32,
                                              output_dtype=torch.float64))
    mesh = hsdp_mesh(shape)
    mp = MixedPrecisionPolicy(param_dtype=np.float32, reduce_dtype=np.float32,
                              output_dtype=np.float64)
    assert_same(train(sharded(mesh, mp_policy=mp), *batch(mesh)), theirs, rtol=1e-5,
                atol=1e-6)


# -- errors, the same on every rank -----------------------------------------------------

def test_meshes_torch_refuses():
    with pytest.raises(ValueError, match="expects a 1D or 2D DeviceMesh"):
        fully_shard(MLP(), mesh=mt.init_device_mesh("cpu", (1, W, 1),
                                                    mesh_dim_names=("a", "b", "c")))
    with pytest.raises(AssertionError, match="mesh_dim_names specified"):
        fully_shard(MLP(), mesh=mt.init_device_mesh("cpu", (1, W)))


def test_any_dim_names_are_replicate_then_shard():
    mesh = mt.init_device_mesh("cpu", (1, W), mesh_dim_names=("dp", "tp"))
    m = fully_shard(MLP(), mesh=mesh)
    assert m.w1.weight.placements == (Replicate(), Shard(0))
    rows, s = -(-7 // W), mesh.get_local_rank(1)
    assert m.w1.weight.detach().to_local().shape[0] == max(0, min(7 - s * rows, rows))


def test_modules_hsdp_cannot_take():
    mesh = hsdp_mesh(SHAPES[0])
    m = MLP()
    fully_shard(m, mesh=mesh)
    with pytest.raises(ValueError, match="fully_sharded already"):
        fully_shard(m, mesh=mesh)
    with pytest.raises(ValueError, match="fully_sharded by an ancestor"):
        fully_shard(m.w1, mesh=mesh)
    m2 = MLP()
    m2.w1.weight = nn.Parameter(mt.distribute_tensor(np.ones((7, 5)), mesh["shard"],
                                                     [Replicate()]))
    with pytest.raises(ValueError, match="HSDP beside tensor parallelism"):
        fully_shard(m2, mesh=mesh)


class Extra(nn.Module):
    """An MLP with one more parameter of a shape given per rank."""

    def __init__(self, shape):
        super().__init__()
        self.mlp = MLP()
        self.extra = nn.Parameter(np.ones(shape))


@pytest.mark.skipif(W == 1, reason="needs two ranks")
@pytest.mark.parametrize("shape", SHAPES)
def test_ranks_that_differ_raise_everywhere(shape):
    """Parameters whose shapes differ between ranks, or a check only some ranks
    fail, would leave the others in the first all-gather: every rank raises."""
    mesh = hsdp_mesh(shape)
    with pytest.raises(ValueError, match="different mp_policy, reshard_after_forward or "
                                         "parameters"):
        fully_shard(Extra((4, 2) if RANK == 0 else (5, 2)), mesh=mesh)
    with pytest.raises(ValueError, match="is a scalar"):
        fully_shard(Extra(() if RANK == W - 1 else (3,)), mesh=mesh)
    with pytest.raises(ValueError, match="different mp_policy, reshard_after_forward"):
        fully_shard(MLP(), mesh=mesh, reshard_after_forward=RANK == 0)
    with pytest.raises(ValueError, match="must divide the data-parallel size"):
        fully_shard(MLP(), mesh=mesh,
                    reshard_after_forward=shape[1] + 1 if RANK == 0 else True)
