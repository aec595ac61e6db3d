"""fully_shard (torch's FSDP2 on DTensors): parameters Shard(0) over dp (uneven dim 0
too), one all-gather per module group before its forward and again before its
backward when the forward freed it, one reduce-scatter per group of the gradients;
gradients and a few SGD steps equal the one-rank model's in float64; with TP on a
2-D (dp, tp) mesh, parallelize_module over mesh["tp"] then fully_shard over
mesh["dp"] trains as the one-rank model; reshard_after_forward=2 at 4 ranks gathers
the backward over pairs of ranks with the same gradients; a call that cannot shard
raises."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Replicate, Shard, nn
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import local_mesh
from mpitensor.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard
from mpitensor.parallel import (
    ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module)
from tp_models import MLP

W = MPI.COMM_WORLD.Get_size()
AG, RS = "all_gather_into_tensor", "reduce_scatter_tensor"


X = np.random.default_rng(0).standard_normal((12, 5))
T = np.random.default_rng(1).standard_normal((12, 3))


@pytest.fixture(scope="module")
def mesh():
    return mt.init_device_mesh("cpu", (W,), mesh_dim_names=("dp",))


def sharded_mlp(mesh, **kw):
    m = MLP()
    fully_shard(m.w1, mesh=mesh, **kw)
    fully_shard(m.w2, mesh=mesh, **kw)
    return fully_shard(m, mesh=mesh, **kw)


def loss_of(model, x, t):
    return ((model(x) - t) ** 2).mean()


def reference(steps=0, lr=0.1):
    """The one-rank model on the whole batch (on this rank's local mesh): its
    parameters after ``steps`` SGD steps and the gradients of the next loss."""
    m = MLP()
    lm = local_mesh()
    for _, mod in m.named_modules():
        for name, p in list(mod._parameters.items()):
            mod._parameters[name] = DTensor.from_local(
                np.array(p), lm, [Replicate()]).requires_grad_()
    x = DTensor.from_local(X, lm, [Replicate()])
    t = DTensor.from_local(T, lm, [Replicate()])
    for _ in range(steps + 1):
        for p in m.parameters():
            p.grad = None
        loss_of(m, x, t).backward()
        if _ < steps:
            with mt.no_grad():
                for p in m.parameters():
                    p.to_local()[...] -= lr * p.grad.to_local()
    return {n: (p.detach().to_local(), p.grad.to_local()) for n, p in m.named_parameters()}


def batch(mesh):
    return (mt.distribute_tensor(X, mesh, [Shard(0)]),
            mt.distribute_tensor(T, mesh, [Shard(0)]))


def test_parameters_shard_dim0_unevenly(mesh):
    m = sharded_mlp(mesh)
    assert isinstance(m, FSDPModule) and isinstance(m.w1, nn.Linear)
    plain = MLP()
    for (name, p), (_, q) in zip(m.named_parameters(), plain.named_parameters()):
        assert p.placements == (Shard(0),) and p.requires_grad and p.is_leaf, name
        np.testing.assert_array_equal(p.detach().full_tensor(), q)
        rows = -(-q.shape[0] // W)
        r = mesh.get_local_rank()
        assert p.to_local().shape[0] == max(0, min(q.shape[0] - r * rows, rows))


def test_cpu_offload_runs_alike(mesh):
    """Every array is in host memory already: torch's CPUOffloadPolicy changes
    neither the gradients nor the collectives."""
    runs = {}
    for policy in (OffloadPolicy(), CPUOffloadPolicy(), CPUOffloadPolicy(pin_memory=False)):
        m = sharded_mlp(mesh, offload_policy=policy)
        with CommDebugMode() as comm:
            loss_of(m, *batch(mesh)).backward()
        runs[policy] = ({n: p.grad.to_local() for n, p in m.named_parameters()},
                        comm.get_comm_counts())
    (grads, counts), *others = runs.values()
    for g, c in others:
        assert c == counts
        for name in grads:
            np.testing.assert_array_equal(g[name], grads[name], err_msg=name)


def test_offload_policy_of_another_type_raises_everywhere(mesh):
    policy = "cpu" if mesh.get_local_rank() == 0 else CPUOffloadPolicy()
    with pytest.raises(TypeError, match="offload_policy must be an OffloadPolicy"):
        fully_shard(MLP(), mesh=mesh, offload_policy=policy)


def test_gradients_equal_one_rank(mesh):
    m = sharded_mlp(mesh)
    loss_of(m, *batch(mesh)).backward()
    ref = reference()
    for name, p in m.named_parameters():
        assert p.grad.placements == (Shard(0),), name
        np.testing.assert_allclose(p.grad.detach().full_tensor(), ref[name][1], rtol=1e-10,
                                   atol=1e-14, err_msg=name)


def test_one_collective_per_group(mesh):
    m = sharded_mlp(mesh)
    x, t = batch(mesh)
    with CommDebugMode() as fwd:
        loss = loss_of(m, x, t)
    with CommDebugMode() as bwd:
        loss.backward()
    # Two groups (w1, w2; the root owns none): one all-gather each per forward, each
    # again in backward (the forward freed them), one reduce-scatter each.
    if W > 1:
        assert fwd.get_comm_counts()[AG] == 2
        assert bwd.get_comm_counts()[AG] == 2 and bwd.get_comm_counts()[RS] == 2
        assert bwd.get_total_counts() == 4
    else:
        assert fwd.get_total_counts() == 0 and bwd.get_total_counts() == 0


def test_no_reshard_gathers_once(mesh):
    m = sharded_mlp(mesh, reshard_after_forward=False)
    x, t = batch(mesh)
    loss = loss_of(m, x, t)
    with CommDebugMode() as bwd:
        loss.backward()
    assert bwd.get_comm_counts()[AG] == 0
    assert bwd.get_comm_counts()[RS] == (2 if W > 1 else 0)
    # resharded after the backward: the next forward gathers again
    with CommDebugMode() as fwd:
        loss_of(m, x, t)
    assert fwd.get_comm_counts()[AG] == (2 if W > 1 else 0)


def freed(module) -> bool:
    """Every unsharded parameter of the module's own group holds no memory."""
    return all(p.unsharded._data().strides == (0,) * p.unsharded.ndim
               for p in module.__dict__["_fsdp_state"].params)


def test_forward_frees_unsharded(mesh):
    m = sharded_mlp(mesh)
    shard_shapes = [p.to_local().shape for p in m.parameters()]
    gathered = []
    m.w1.register_forward_pre_hook(  # runs after fully_shard's, on the gathered weight
        lambda mod, args: gathered.append(weakref.ref(mod.weight._data())))
    x, t = batch(mesh)
    loss = loss_of(m, x, t)
    assert m.w1.weight.placements == (Shard(0),)
    assert [p.to_local().shape for p in m.parameters()] == shard_shapes
    assert freed(m.w1) and freed(m.w2)
    gc.collect()
    assert gathered[0]() is None  # nothing (the graph included) holds the gathered array
    loss.backward()
    assert freed(m.w1) and freed(m.w2)
    with mt.no_grad():
        m(x)
    assert freed(m.w1) and freed(m.w2)


class Pair(nn.Module):
    """Returns its outputs in a dict: fully_shard hooks DTensors inside containers."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP()

    def forward(self, x):
        return {"y": (self.mlp(x), None)}


def test_outputs_in_containers(mesh):
    p = Pair()
    fully_shard(p.mlp.w1, mesh=mesh)
    fully_shard(p.mlp.w2, mesh=mesh)
    fully_shard(p.mlp, mesh=mesh)
    fully_shard(p, mesh=mesh)
    x, t = batch(mesh)
    ((p(x)["y"][0] - t) ** 2).mean().backward()
    ref = reference()
    for name, q in p.mlp.named_parameters():
        np.testing.assert_allclose(q.grad.detach().full_tensor(), ref[name][1], rtol=1e-10,
                                   atol=1e-14, err_msg=name)


def test_forward_without_backward_then_update(mesh):
    """The root keeps its group gathered after a forward in grad mode; when no
    backward came and the shards changed, the next forward gathers again."""
    m = fully_shard(MLP(), mesh=mesh)  # one group, owned by the root
    x, _ = batch(mesh)
    m(x)
    with mt.no_grad():
        for p in m.parameters():
            p.to_local()[...] *= 2
        y = m(x).full_tensor()
    plain = MLP()
    for p in plain.parameters():
        p *= 2
    np.testing.assert_allclose(y, plain(X), rtol=1e-12)


def test_sgd_steps_equal_one_rank(mesh):
    m = sharded_mlp(mesh)
    x, t = batch(mesh)
    steps, lr = 3, 0.1
    for _ in range(steps + 1):
        for p in m.parameters():
            p.grad = None
        loss_of(m, x, t).backward()
        if _ < steps:
            with mt.no_grad():
                for p in m.parameters():
                    p.to_local()[...] -= lr * p.grad.to_local()
    ref = reference(steps, lr)
    for name, p in m.named_parameters():
        np.testing.assert_allclose(p.detach().full_tensor(), ref[name][0], rtol=1e-10, err_msg=name)
        np.testing.assert_allclose(p.grad.detach().full_tensor(), ref[name][1], rtol=1e-10,
                                   atol=1e-14, err_msg=name)


def test_default_mesh_is_the_current_one(mesh):
    with mesh:
        m = fully_shard(MLP())
    assert m.w1.weight.device_mesh is mesh and m.w1.weight.placements == (Shard(0),)


def test_gradients_accumulate(mesh):
    m = sharded_mlp(mesh)
    x, t = batch(mesh)
    loss_of(m, x, t).backward()
    loss_of(m, x, t).backward()
    ref = reference()
    for name, p in m.named_parameters():
        np.testing.assert_allclose(p.grad.detach().full_tensor(), 2 * ref[name][1], rtol=1e-10,
                                   atol=1e-14, err_msg=name)


def test_frozen_parameter_gets_no_gradient(mesh):
    m = sharded_mlp(mesh)
    m.w1.bias.requires_grad_(False)
    loss_of(m, *batch(mesh)).backward()
    ref = reference()
    assert m.w1.bias.grad is None
    for name, p in m.named_parameters():
        if name != "w1.bias":
            np.testing.assert_allclose(p.grad.detach().full_tensor(), ref[name][1],
                                       rtol=1e-10, atol=1e-14, err_msg=name)


def test_cannot_shard_raises(mesh):
    m = MLP()
    fully_shard(m, mesh=mesh)
    with pytest.raises(ValueError, match="fully_sharded already"):
        fully_shard(m, mesh=mesh)
    with pytest.raises(ValueError, match="fully_sharded by an ancestor"):
        fully_shard(m.w1, mesh=mesh)  # children first, then the parent
    with pytest.raises(ValueError, match="expects a 1D or 2D DeviceMesh"):
        fully_shard(MLP(), mesh=mt.init_device_mesh("cpu", (W, 1, 1)))
    other = mt.init_device_mesh("cpu", (W,))
    m2 = MLP()
    m2.w1.weight = nn.Parameter(mt.distribute_tensor(np.ones((7, 5)), other, [Replicate()]))
    with pytest.raises(ValueError, match="takes arrays"):
        fully_shard(m2, mesh=mesh)
    with pytest.raises(TypeError, match="nn.Module"):
        fully_shard(np.ones(3), mesh=mesh)
    tied = MLP((5, 5, 5))
    tied.w2.weight = nn.Parameter(tied.w1.weight)
    fully_shard(tied.w1, mesh=mesh)
    with pytest.raises(ValueError, match="shared .tied. parameter must be in one group"):
        fully_shard(tied, mesh=mesh)


def test_forwards_before_their_backwards(mesh):
    """Each forward's backward reduce-scatters its own gradients, whatever the
    order: two losses, then their backwards; and a module called twice in one
    forward (the group stays gathered until both calls' backwards are done)."""
    m = sharded_mlp(mesh)
    x, t = batch(mesh)
    first, second = loss_of(m, x, t), loss_of(m, x, t)
    first.backward()
    second.backward()
    twice = sharded_mlp(mesh)
    (loss_of(twice, x, t) + loss_of(twice, x, t)).backward()
    ref = reference()
    for model in (m, twice):
        for name, p in model.named_parameters():
            np.testing.assert_allclose(p.grad.detach().full_tensor(), 2 * ref[name][1],
                                       rtol=1e-10, atol=1e-14, err_msg=name)
        assert freed(model.w1) and freed(model.w2)


# -- 2-D: TP over tp, FSDP over dp --------------------------------------------------------

DP = 2 if W == 4 else 1
TP = W // DP
needs_4 = pytest.mark.world(4, reason="a (2, 2) mesh needs 4 ranks")


@pytest.fixture(scope="module")
def mesh2d():
    return mt.init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))


def model_2d(mesh2d):
    m = MLP((5, 6, 5))
    m = parallelize_module(m, mesh2d["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    fully_shard(m.w1, mesh=mesh2d["dp"])
    fully_shard(m.w2, mesh=mesh2d["dp"])
    return fully_shard(m, mesh=mesh2d["dp"])


def replica_batch(mesh2d):
    """Each data-parallel replica its own rows of the batch, on its tp mesh; the
    targets on the local mesh, where RowwiseParallel's output lands (torch's
    use_local_output)."""
    x = np.random.default_rng(5).standard_normal((4, 5))
    t = np.random.default_rng(6).standard_normal((4, 5))
    d = mesh2d.get_local_rank("dp")
    rows = slice(d * 4 // DP, (d + 1) * 4 // DP)
    tp = mesh2d["tp"]
    # RowwiseParallel hands back the local output, as torch's use_local_output
    return (DTensor.from_local(x[rows], tp, [Replicate()]),
            DTensor.from_local(t[rows], local_mesh(), [Replicate()]), x, t)


@needs_4
def test_2d_placements(mesh2d):
    m = model_2d(mesh2d)
    plain = MLP((5, 6, 5))
    # TP shards w1 on dim 0 as well: dp shards each TP shard, on the mesh whose dims
    # run (tp, dp); the others sit on the (dp, tp) mesh itself.
    assert m.w1.weight.placements == (Shard(0), Shard(0))
    assert m.w1.weight.device_mesh.mesh_dim_names == ("tp", "dp")
    assert m.w2.weight.placements == (Shard(0), Shard(1))
    assert m.w2.weight.device_mesh is mesh2d
    assert m.w2.bias.placements == (Shard(0), Replicate())
    for (name, p), (_, q) in zip(m.named_parameters(), plain.named_parameters()):
        np.testing.assert_array_equal(p.detach().full_tensor(), q, err_msg=name)


@needs_4
def test_2d_trains_as_one_rank(mesh2d):
    m = model_2d(mesh2d)
    xl, tl, x, t = replica_batch(mesh2d)
    with CommDebugMode() as fwd:
        loss = loss_of(m, xl, tl)
    with CommDebugMode() as bwd:
        loss.backward()
    # per group one all-gather over dp; the Rowwise output's all-reduce over tp
    assert fwd.get_comm_counts()[AG] == 2 and fwd.get_comm_counts()[RS] == 0
    assert bwd.get_comm_counts()[AG] == 2 and bwd.get_comm_counts()[RS] == 2
    ref = MLP((5, 6, 5))
    lm = local_mesh()
    for mod in ref.modules():
        for name, p in list(mod._parameters.items()):
            mod._parameters[name] = DTensor.from_local(np.array(p), lm,
                                                       [Replicate()]).requires_grad_()
    loss_of(ref, DTensor.from_local(x, lm, [Replicate()]),
            DTensor.from_local(t, lm, [Replicate()])).backward()
    want = {n: p.grad.to_local() for n, p in ref.named_parameters()}
    for name, p in m.named_parameters():
        assert p.grad.placements == p.placements, name
        np.testing.assert_allclose(p.grad.detach().full_tensor(), want[name], rtol=1e-10,
                                   atol=1e-14, err_msg=name)


VOCAB, HEADS = 32, 2 * TP
DIM = 4 * HEADS


class GPT(nn.Module):
    """docs/tensor_parallel.md's transformer: embedding, two blocks, norm, output."""

    def __init__(self):
        super().__init__()
        mt.manual_seed(0)
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([nn.TransformerBlock(DIM, HEADS) for _ in range(2)])
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


GPT_PLAN = {
    "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
    "layers.*.attention.q_proj": ColwiseParallel(),
    "layers.*.attention.k_proj": ColwiseParallel(),
    "layers.*.attention.v_proj": ColwiseParallel(),
    "layers.*.attention.out_proj": RowwiseParallel(),
    "layers.*.feed_forward.w1": ColwiseParallel(),
    "layers.*.feed_forward.w2": RowwiseParallel(),
    "output": ColwiseParallel(output_layouts=Replicate()),
}


@needs_4
def test_2d_transformer_forward_gathers_per_block(mesh2d):
    """torch's fsdp_tp_example structure: the TP plan over mesh["tp"], fully_shard
    of every block then of the root over mesh["dp"]. The norms, which the plan
    leaves alone, are sharded over dp too and reach the forward as local arrays."""
    tokens = np.random.default_rng(1).integers(0, VOCAB, size=(2, 4))
    mine = tokens + mesh2d.get_local_rank("dp")  # each replica its own batch
    expected = GPT()(mine % VOCAB)
    model = parallelize_module(GPT(), mesh2d["tp"], GPT_PLAN)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh2d["dp"])
    fully_shard(model, mesh=mesh2d["dp"])
    assert model.norm.weight.placements == (Shard(0),)
    tied = parallelize_module(GPT(), mesh2d["tp"], GPT_PLAN)
    tied.output.weight = nn.Parameter(tied.layers[0].feed_forward.w1.weight)
    fully_shard(tied.layers[0], mesh=mesh2d["dp"])
    with pytest.raises(ValueError, match="shared .tied. parameter"):
        fully_shard(tied, mesh=mesh2d["dp"])
    assert model.layers[0].feed_forward.w2.weight.placements == (Shard(0), Shard(1))
    with mt.no_grad(), CommDebugMode() as comm:
        logits = model(mine % VOCAB)
    np.testing.assert_allclose(logits, expected, rtol=1e-10, atol=1e-10)
    # one all-gather over dp per group (two blocks, the root) beside TP's own: an
    # all-reduce per row-wise layer and the logits' all-gather
    assert dict(comm.get_comm_counts()) == {"all_gather_into_tensor": 3 + 1,
                                            "all_reduce": 5}
    for layer in model.layers:
        assert freed(layer)


@needs_4
def test_2d_sequence_parallel_forward(mesh2d):
    """The fsdp_tp_example plan's kind: sequence parallelism on tp (the norms are
    DTensors Replicate over tp), fully_shard per block over dp."""
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.attention": gather,
        "layers.*.attention.q_proj": ColwiseParallel(),
        "layers.*.attention.k_proj": ColwiseParallel(),
        "layers.*.attention.v_proj": ColwiseParallel(),
        "layers.*.attention.out_proj": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": gather,
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    tokens = np.random.default_rng(2).integers(0, VOCAB, size=(2, 4))
    mine = (tokens + 3 * mesh2d.get_local_rank("dp")) % VOCAB
    expected = GPT()(mine)
    model = parallelize_module(GPT(), mesh2d["tp"], plan)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh2d["dp"])
    fully_shard(model, mesh=mesh2d["dp"])
    assert model.layers[1].ffn_norm.weight.placements == (Shard(0), Replicate())
    assert model.layers[1].ffn_norm.weight.device_mesh is mesh2d
    with mt.no_grad(), CommDebugMode() as comm:
        logits = model(mine)
    np.testing.assert_allclose(logits, expected, rtol=1e-10, atol=1e-10)
    assert comm.get_comm_counts()["reduce_scatter_tensor"] == 5  # SP's, none of FSDP's


@needs_4
def test_2d_transformer_gradients_equal_one_rank(mesh2d):
    """The transformer with the TP plan over tp and fully_shard per block over dp,
    each replica on its half of the batch: every parameter's gradient equals the
    one-rank model's on the whole batch; backward gathers the two resharded blocks
    (not the root) and reduce-scatters each of the three groups once."""
    tokens = np.random.default_rng(1).integers(0, VOCAB, size=(4, 4))
    d = mesh2d.get_local_rank("dp")
    model = parallelize_module(GPT(), mesh2d["tp"], GPT_PLAN)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh2d["dp"])
    fully_shard(model, mesh=mesh2d["dp"])
    y = model(tokens[2 * d:2 * d + 2])
    with CommDebugMode() as bwd:
        (y * y).mean().backward()
    counts = bwd.get_comm_counts()
    assert counts[AG] == 2 and counts[RS] == 3
    ref = GPT()
    lm = local_mesh()
    for mod in ref.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = DTensor.from_local(np.array(p), lm,
                                                           [Replicate()]).requires_grad_()
    yr = ref(DTensor.from_local(tokens, lm, [Replicate()]))
    (yr * yr).mean().backward()
    want = {n: p.grad.to_local() for n, p in ref.named_parameters()}
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.detach().full_tensor(), want[name], rtol=1e-10,
                                   atol=1e-13, err_msg=name)


# -- reshard_after_forward as an int: the post-forward mesh --------------------------

@pytest.mark.world(4, reason="a non-trivial divisor of dp: 2 of 4")
def test_reshard_to_groups_of_two(mesh):
    """After forward each pair of ranks keeps the parameters between them: the
    backward's all-gathers run over 2 ranks (fewer bytes sent than the forward's
    over 4), the gradients are those of reshard_after_forward=True, and the
    parameters are freed on every rank."""
    def run(raf):
        m = sharded_mlp(mesh, reshard_after_forward=raf)
        x, t = batch(mesh)
        return m, lambda: loss_of(m, x, t)

    for fwd, bwd in gathers_in_pairs(run):
        assert fwd.get_comm_counts()[AG] == 2 and bwd.get_comm_counts()[AG] == 2
        assert bwd.get_comm_counts()[RS] == 2


def gathers_in_pairs(run):
    """Forward and backward of ``run(raf)`` (the module and its loss function)
    for reshard_after_forward True and 2: the parameters are freed after each,
    the backward's all-gathers with 2 send 2/3 of the forward's bytes (True: the
    same), and both give the same gradients. The two steps' counters, True's first."""
    grads, modes = {}, []
    for raf in (True, 2):
        m, loss_fn = run(raf)
        with CommDebugMode() as fwd:
            loss = loss_fn()
        assert freed(m.w1) and freed(m.w2)
        with CommDebugMode() as bwd:
            loss.backward()
        sent = fwd.get_comm_bytes()[AG], bwd.get_comm_bytes()[AG]
        assert sent[1] == (sent[0] if raf is True else 2 * sent[0] // 3), sent
        grads[raf] = {n: p.grad.full_tensor() for n, p in m.named_parameters()}
        assert freed(m.w1) and freed(m.w2)
        modes.append((fwd, bwd))
    for name, g in grads[True].items():
        np.testing.assert_array_equal(grads[2][name], g, err_msg=name)
    return modes


def test_reshard_int_edge_values(mesh):
    """1 means False and the dp size True, as torch's; a non-divisor raises on
    every rank."""
    m = sharded_mlp(mesh, reshard_after_forward=1)
    x, t = batch(mesh)
    loss = loss_of(m, x, t)
    with CommDebugMode() as bwd:
        loss.backward()
    assert bwd.get_comm_counts()[AG] == 0  # kept, as reshard_after_forward=False
    if W > 1:
        m = sharded_mlp(mesh, reshard_after_forward=W)
        loss_of(m, x, t)
        assert freed(m.w1)
    for bad in (0, -1, W + 1):
        with pytest.raises(ValueError, match="must divide the data-parallel size"):
            fully_shard(MLP(), mesh=mesh, reshard_after_forward=bad)


@pytest.mark.world(4, reason="a dp of 4 sliced from a (4, 1) mesh")
def test_reshard_to_groups_of_two_beside_tp():
    """reshard_after_forward=2 on a dp mesh sliced from (dp, tp), with the module
    parallelized over tp: the backward gathers over pairs of dp ranks, and the
    gradients are those of reshard_after_forward=True."""
    mesh = mt.init_device_mesh("cpu", (4, 1), mesh_dim_names=("dp", "tp"))
    x = np.random.default_rng(5).standard_normal((4, 5))
    t = np.random.default_rng(6).standard_normal((4, 5))
    r = mesh.get_local_rank("dp")
    xs = DTensor.from_local(x[r:r + 1], mesh["tp"], [Replicate()])

    def run(raf):
        m = parallelize_module(MLP((5, 6, 5)), mesh["tp"],
                               {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        for sub in (m.w1, m.w2, m):
            fully_shard(sub, mesh=mesh["dp"], reshard_after_forward=raf)
        return m, lambda: ((m(xs) - t[r:r + 1]) ** 2).mean()

    gathers_in_pairs(run)
