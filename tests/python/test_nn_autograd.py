"""Backward of mpitensor.nn: autograd.Function, and every layer's gradients against
central finite differences in float64 on even and uneven shapes and several
placements at every world size; models through the tensor-parallel styles give
the gradients of the replicated model; the Colwise -> Rowwise pair communicates
as Megatron's f and g; parameters require grad as torch's; torch when present."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.parallel as mp
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, nn
from mpitensor.debug import CommDebugMode
from mpitensor.nn import _ckernels, _kernels, functional as F
from ops_helpers import W, make, mesh_of, mesh_shapes

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")
MESHES = mesh_shapes()


def fill(pls, mesh):
    """One placement per mesh dim: the given ones, Replicate on the rest."""
    pls = tuple(pls)
    return pls + (R,) * (mesh.ndim - len(pls))


def weighted(y, seed=7):
    """A scalar weighing every element of y differently (Replicate weights)."""
    c = np.random.default_rng(seed).uniform(0.5, 1.5, size=y.shape)
    mesh = y.device_mesh
    return (y * distribute_tensor(c, mesh, [R] * mesh.ndim, src_data_rank=None)).sum()


def check(prog, arrays, mesh, pls, seed=None, rtol=1e-6, atol=1e-8, eps=1e-6):
    """prog(*leaves) (a scalar DTensor) differentiated by backward equals central
    differences along random directions (two per array, every element weighted
    differently, so a wrong element shows); each leaf's .grad has the leaf's
    placements (a Partial's: Replicate). ``seed`` reseeds before every evaluation,
    so that dropout draws the same mask each time."""
    pls = [fill(p, mesh) for p in pls]

    def run(arrs, grad):
        if seed is not None:
            mt.manual_seed(seed)
        dts = [make(a, mesh, p) for a, p in zip(arrs, pls)]
        if grad:
            for d in dts:
                d.requires_grad_()
        return prog(*dts), dts

    out, dts = run(arrays, True)
    assert out.shape == () and out.requires_grad
    out.backward()
    directions = np.random.default_rng(99)
    with mt.no_grad():
        for i, (dt, p) in enumerate(zip(dts, pls)):
            assert dt.grad is not None, f"input {i} got no gradient"
            g = dt.grad.full_tensor()
            for _ in range(2):
                d = directions.uniform(-1, 1, arrays[i].shape)
                vals = []
                for step in (eps, -eps):
                    moved = list(arrays)
                    moved[i] = arrays[i] + step * d
                    vals.append(float(run(moved, False)[0].full_tensor()))
                np.testing.assert_allclose(np.sum(g * d), (vals[0] - vals[1]) / (2 * eps),
                                           rtol=rtol, atol=atol, err_msg=f"input {i}")


def rng(seed, *shapes):
    g = np.random.default_rng(seed)
    return [g.standard_normal(s) for s in shapes]


# -- autograd.Function -----------------------------------------------------------------------

class Cube(mt.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        assert isinstance(x.to_local(), np.ndarray)  # grad mode is off in forward
        return x * x * x * k

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        assert ctx.needs_input_grad == (True, False)
        return g * 3 * ctx.k * x * x, None


def test_function_records_forward_and_backward():
    mesh = mesh_of((W,))
    (a,) = rng(1, (5, 3))
    x = distribute_tensor(a, mesh, [S0], requires_grad=True)
    y = Cube.apply(x, 2.0)
    assert y.grad_fn.name == "Cube" and not y.is_leaf
    y.sum().backward()
    assert x.grad.placements == (S0,)
    np.testing.assert_allclose(x.grad.full_tensor(), 6 * a * a, rtol=1e-12)
    with mt.no_grad():
        assert not Cube.apply(x, 2.0).requires_grad
    assert not Cube.apply(x.detach(), 2.0).requires_grad


def test_function_returning_its_input_keeps_the_input_a_leaf():
    mesh = mesh_of((W,))
    x = distribute_tensor(np.ones((4, 2)), mesh, [S0], requires_grad=True)

    class Same(mt.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    y = Same.apply(x)
    assert y is not x and x.is_leaf and not y.is_leaf
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.full_tensor(), 2.0)


def test_function_refuses_bad_gradients():
    mesh = mesh_of((W,))
    x = distribute_tensor(np.ones((4, 2)), mesh, [S0], requires_grad=True)

    class TooFew(mt.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return (g,)

    class Plain(mt.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return np.ones((4, 2))

    class Two(mt.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, x * 3

    with pytest.raises(RuntimeError, match="expected one per positional input"):
        TooFew.apply(x, 1.0).sum().backward()
    with pytest.raises(TypeError, match="gradients are DTensors"):
        Plain.apply(x).sum().backward()
    with pytest.raises(NotImplementedError, match="several DTensors"):
        Two.apply(x)


# -- layers against finite differences --------------------------------------------------------

LINEAR = [
    # (input, weight, bias) placements on the first mesh dim: replicated, Colwise,
    # Rowwise, batch-sharded, a Partial input
    (R, R, R), (R, S0, S0), (Shard(2), S1, R), (S0, R, R), (PS, R, R),
]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("dims", [(2, 2, 4, 4), (3, 1, 5, 3)], ids=str)
@pytest.mark.parametrize("pls", LINEAR, ids=str)
def test_linear(mesh_shape, dims, pls):
    mesh = mesh_of(mesh_shape)
    b, s, i, o = dims
    arrays = rng(2, (b, s, i), (o, i), (o,))
    check(lambda x, w, bias: weighted(F.linear(x, w, bias)), arrays, mesh,
          [(p,) for p in pls])


def test_linear_1d_input_and_no_bias():
    mesh = mesh_of((W,))
    check(lambda x, w: weighted(F.linear(x, w)), rng(3, (5,), (3, 5)), mesh, [(R,), (S0,)])


@pytest.mark.parametrize("pls", LINEAR, ids=str)
def test_linear_gradients_are_c_ordered_and_keep_float32(pls):
    """linear's backward gives the weight's and the input's gradients C-ordered (the
    stored .grad and the optimizer read them by rows; a transposed view makes each
    of those passes a strided walk) and in float32 for float32 operands."""
    mesh = mesh_of((W,))
    arrays = [a.astype(np.float32) for a in rng(2, (2, 3, 4), (6, 4), (6,))]
    seen = {}
    x, w, b = (Seen.apply(make(a, mesh, (p,)).requires_grad_(), name, seen)
               for a, p, name in zip(arrays, pls, "xwb"))
    weighted(F.linear(x, w, b)).backward()
    assert sorted(seen) == ["b", "w", "x"]
    for name, g in seen.items():
        assert g.dtype == np.float32 and g.to_local().dtype == np.float32, name
        assert g.to_local().flags.c_contiguous, name


class Seen(mt.autograd.Function):
    """The identity, keeping the gradient it is given as it came (``.grad`` and
    autograd.grad hand back copies)."""

    @staticmethod
    def forward(ctx, x, name, seen):
        ctx.name, ctx.seen = name, seen
        return x.copy()

    @staticmethod
    def backward(ctx, g):
        ctx.seen[ctx.name] = g
        return g, None, None


POINTWISE = {
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "softmax0": lambda x: F.softmax(x, 0),
    "softmax": F.softmax, "log_softmax": F.log_softmax,
    "log_softmax0": lambda x: F.log_softmax(x, axis=0),
}


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", [(4, 4), (5, 3)], ids=str)
@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_and_softmax(mesh_shape, shape, name):
    mesh = mesh_of(mesh_shape)
    (a,) = rng(4, shape)
    a[np.abs(a) < 1e-3] += 0.01  # away from relu's kink
    for p in (S0, S1, PS):
        check(lambda x: weighted(POINTWISE[name](x)), [a], mesh, [(p,)])


def test_pointwise_on_ndarrays_stays_plain():
    x = np.array([-1.0, 0.0, 2.0])
    np.testing.assert_allclose(F.silu(x), x / (1 + np.exp(-x)), rtol=1e-12)
    np.testing.assert_allclose(nn.SiLU()(x), F.silu(x))


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", [(4, 2, 4), (3, 3, 5)], ids=str)
def test_norms(mesh_shape, shape):
    mesh = mesh_of(mesh_shape)
    x, w, b = rng(5, shape, shape[-1:], shape[-1:])
    # rows sharded (the local kernels), the normalized dim sharded (NumPy operations)
    for p in (S0, S1, Shard(2)):
        check(lambda x, w, b: weighted(F.layer_norm(x, shape[-1:], w, b)), [x, w, b], mesh,
              [(p,), (R,), (R,)])
        check(lambda x, w: weighted(F.rms_norm(x, shape[-1:], w, eps=1e-6)), [x, w], mesh,
              [(p,), (R,)])
    check(lambda x: weighted(F.layer_norm(x, shape[-2:])), [x], mesh, [(S0,)])


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_dropout_uses_the_forward_mask(mesh_shape):
    mesh = mesh_of(mesh_shape)
    (a,) = rng(6, (5, 4))
    for p in (S0, S1, R):
        check(lambda x: weighted(F.dropout(x, 0.4)), [a], mesh, [(p,)], seed=3)
    mt.manual_seed(3)
    x = distribute_tensor(a, mesh, [S0] * mesh.ndim, requires_grad=True)
    y = F.dropout(x, 0.4)
    y.sum().backward()
    kept = y.detach().full_tensor() != 0
    np.testing.assert_allclose(x.grad.full_tensor(), kept / 0.6, rtol=1e-12)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("vocab", [8, 7])
def test_embedding(mesh_shape, vocab):
    mesh = mesh_of(mesh_shape)
    (w,) = rng(7, (vocab, 3))
    idx = np.array([[1, 0, vocab - 1], [1, 2, 1], [vocab - 2, 3, 0], [5, 5, 4]])
    for wp, ip in ((R, R), (R, S0), (S0, R), (S1, R), (S0, S1)):
        def prog(weight):
            ids = distribute_tensor(idx, mesh, fill((ip,), mesh))
            return weighted(F.embedding(ids, weight))
        check(prog, [w], mesh, [(wp,)])


def test_embedding_gradient_rows_add_as_np_add_at():
    # The embedding's backward adds the rows of repeated indices in np.add.at's
    # order, so its sums round the same to the last bit.
    gen = np.random.default_rng(5)
    for n, vocab in ((0, 3), (1, 3), (9, 1), (200, 7), (64, 500)):
        idx = gen.integers(0, vocab, n)
        rows = gen.standard_normal((n, 5)).astype(np.float32)
        want, got = np.zeros((vocab, 5), np.float32), np.zeros((vocab, 5), np.float32)
        np.add.at(want, idx, rows)
        F._add_rows_at(got, idx, rows)
        assert np.array_equal(got, want)


CE = [("mean", None, -100), ("sum", None, 1), ("none", "w", -100), ("mean", "w", 2)]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("classes", [4, 5])
@pytest.mark.parametrize("case", CE, ids=str)
def test_cross_entropy_and_loss_parallel(mesh_shape, classes, case):
    mesh = mesh_of(mesh_shape)
    reduction, weight, ignore = case
    (a,) = rng(8, (4, classes))
    target = np.array([1, 0, classes - 1, 2])
    cw = np.linspace(0.5, 2.0, classes) if weight else None

    def loss(x):
        out = F.cross_entropy(x, target, cw, ignore_index=ignore, reduction=reduction)
        return weighted(out) if reduction == "none" else out

    for p in (R, S0, S1):
        check(loss, [a], mesh, [(p,)])

    def sharded(x):
        with mp.loss_parallel():
            return loss(x)
    check(sharded, [a], mesh, [(S1,)])


def test_loss_parallel_backward_communicates_nothing():
    mesh = mesh_of((W,))
    (a,) = rng(9, (4, 6))
    x = distribute_tensor(a, mesh, [S1], requires_grad=True)
    with mp.loss_parallel():
        loss = F.cross_entropy(x, np.array([0, 5, 3, 1]))
    with CommDebugMode() as comm:
        loss.backward()
    assert comm.get_total_counts() == 0
    assert x.grad.placements == (S1,)


SDPA = [dict(), dict(is_causal=True), dict(scale=0.3), dict(mask="bool"), dict(mask="float"),
        dict(dropout_p=0.3), dict(dropout_p=0.3, is_causal=True)]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("kwargs", SDPA, ids=str)
def test_scaled_dot_product_attention(mesh_shape, kwargs):
    mesh = mesh_of(mesh_shape)
    kwargs = dict(kwargs)
    L = 3
    q, k, v = rng(10, (3, 2, L, 2), (3, 2, L, 2), (3, 2, L, 3))
    mask = kwargs.pop("mask", None)
    if mask == "bool":
        kwargs["attn_mask"] = np.array([[True, False, True], [True, True, False],
                                        [False, True, True]])
    elif mask == "float":
        kwargs["attn_mask"] = np.linspace(-1, 1, L * L).reshape(L, L)
    seed = 5 if kwargs.get("dropout_p") else None
    for p in (S0, S1, Shard(2)):
        check(lambda q, k, v: weighted(F.scaled_dot_product_attention(q, k, v, **kwargs)),
              [q, k, v], mesh, [(p,), (p,), (p,)], seed=seed)


# -- models through the tensor-parallel styles ------------------------------------------------

def grads(model):
    return {n: p.grad.full_tensor() for n, p in model.named_parameters()
            if isinstance(p, DTensor)}


def block_plan(sequence_parallel):
    out = Shard(1) if sequence_parallel else None
    plan = {f"attention.{n}": mp.ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
    plan["attention.out_proj"] = mp.RowwiseParallel(output_layouts=out)
    plan["feed_forward.w1"] = mp.ColwiseParallel()
    plan["feed_forward.w2"] = mp.RowwiseParallel(output_layouts=out)
    if sequence_parallel:
        gather = mp.PrepareModuleInput(input_layouts=(Shard(1),),
                                       desired_input_layouts=(R,))
        plan.update({"attention_norm": mp.SequenceParallel(), "attention": gather,
                     "ffn_norm": mp.SequenceParallel(), "feed_forward": gather})
    return plan


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_transformer_block_gradients_equal_the_replicated_ones(sequence_parallel, norm):
    mesh = mesh_of((W,))

    def build():
        mt.manual_seed(0)
        return nn.TransformerBlock(4 * W, 2 * W, hidden_dim=8 * W, norm=norm)

    ref = mt.distribute_module(build(), mesh)  # every parameter Replicate
    model = mp.parallelize_module(build(), mesh, block_plan(sequence_parallel))
    x = np.random.default_rng(1).standard_normal((2, 4 * W, 4 * W))
    y = ref(distribute_tensor(x, mesh, [R]))
    (y * y).sum().backward()
    if sequence_parallel:
        ym = model(distribute_tensor(x, mesh, [Shard(1)]).to_local())
    else:
        ym = model(x)
    layout = [Shard(1) if sequence_parallel else R]
    ym = ym if ym.device_mesh is mesh else DTensor.from_local(ym, mesh, layout)
    (ym * ym).sum().backward()
    got, want = grads(model), grads(ref)
    # Without SequenceParallel the norms keep ndarray parameters (no gradient).
    norms = (4 if norm == "layer" else 2) if sequence_parallel else 0
    assert len(got) == 12 + norms
    for name, g in got.items():
        np.testing.assert_allclose(g, want[name], rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("fused", [False, True])
def test_attention_output_of_local_projections_has_their_shape(fused):
    """In grad mode a Colwise projection's local output is a local DTensor; the
    attention of those has this rank's heads, and its shape says so (it claimed
    embed_dim, so RowwiseParallel's out_proj took the wrong width for its input)."""
    mesh = mesh_of((W,))
    mt.manual_seed(0)
    attn = nn.MultiheadAttention(4 * W, 2 * W, fused_qkv=fused)
    seen = []
    attn.out_proj.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    names = ["qkv_proj"] if fused else ["q_proj", "k_proj", "v_proj"]
    plan = {n: mp.ColwiseParallel() for n in names}
    plan["out_proj"] = mp.RowwiseParallel()
    mp.parallelize_module(attn, mesh, plan)
    attn(np.random.default_rng(1).standard_normal((2, 3, 4 * W))).sum().backward()
    (x,) = seen
    assert x.shape == x.to_local().shape == (2, 3, 4), (x.shape, x.to_local().shape)


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        mt.manual_seed(3)
        self.w1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(self.act(self.w1(x)))


@pytest.mark.parametrize("hidden", [8, 6])
def test_mlp_colwise_rowwise_is_megatron_f_and_g(hidden):
    """One all-reduce in the forward (Rowwise's output), one in the backward
    (Colwise's input gradient, a Partial sum over the hidden features); the
    weights' gradients keep their Shard placements and equal the replicated ones."""
    mesh = mesh_of((W,))
    a = np.random.default_rng(2).standard_normal((3, 4))
    ref = mt.distribute_module(MLP(4, hidden), mesh)
    xr = distribute_tensor(a, mesh, [R], requires_grad=True)
    weighted(ref(xr)).backward()
    model = mp.parallelize_module(MLP(4, hidden), mesh, {
        "w1": mp.ColwiseParallel(), "w2": mp.RowwiseParallel(use_local_output=False)})
    assert all(p.requires_grad for p in model.parameters())
    x = distribute_tensor(a, mesh, [R], requires_grad=True)
    with CommDebugMode() as comm:
        loss = weighted(model(x))
        loss.backward()
    sides = comm.comm_module_counts.get("Global", {"forward": {}, "backward": {}})
    one = {"all_reduce": 1} if W > 1 else {}
    # the Replicate input's gradient stays Partial in .grad, as torch's
    assert dict(sides["forward"]) == one and dict(sides["backward"]) == {}
    assert x.grad.placements == (PS,)
    assert model.w1.weight.grad.placements == (S0,) and model.w1.bias.grad.placements == (S0,)
    assert model.w2.weight.grad.placements == (S1,) and model.w2.bias.grad.placements == (R,)
    np.testing.assert_allclose(x.grad.full_tensor(), xr.grad.full_tensor(), rtol=1e-12)
    for name, g in grads(model).items():
        np.testing.assert_allclose(g, grads(ref)[name], rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_multihead_attention_backward_reads_heads_in_place(monkeypatch, fused, causal):
    """MultiheadAttention's backward hands the C kernel each head where its
    projection wrote it (strided, no transposing copy) and gets each gradient in its
    projection's layout; the gradients equal NumPy's."""
    if not _ckernels.have_blas():
        pytest.skip("no BLAS: attention runs in NumPy")
    mesh = mesh_of((W,))
    x = np.random.default_rng(4).standard_normal((2, 7, 12))

    def grads():
        mt.manual_seed(5)
        attn = mt.distribute_module(nn.MultiheadAttention(12, 3, fused_qkv=fused,
                                                          causal=causal), mesh)
        xd = distribute_tensor(x, mesh, [R], requires_grad=True)
        weighted(attn(xd)).backward()
        return [xd.grad.full_tensor()] + [p.grad.full_tensor() for p in attn.parameters()]

    calls = []
    real = _ckernels.attention_backward
    monkeypatch.setattr(_ckernels, "attention_backward",
                        lambda *a: calls.append(a) or real(*a))
    got = grads()
    assert len(calls) == 1 and not calls[0][0].flags.c_contiguous  # q read in place
    monkeypatch.setattr(_kernels, "enabled", False)
    want = grads()
    assert len(calls) == 1
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_embedding_styles_keep_the_weight_placement():
    mesh = mesh_of((W,))
    idx = np.array([[0, 3, 5], [6, 1, 1]])
    for style, pl in ((mp.RowwiseParallel(input_layouts=R), S0),
                      (mp.ColwiseParallel(output_layouts=R), S1)):
        mt.manual_seed(1)
        emb = mp.parallelize_module(nn.Embedding(7, 5), mesh, style)
        mt.manual_seed(1)
        ref = mt.distribute_module(nn.Embedding(7, 5), mesh)
        out = emb(idx)
        out = DTensor.from_local(out, mesh, [R])
        weighted(out).backward()
        weighted(ref(distribute_tensor(idx, mesh, [R]))).backward()
        assert emb.weight.grad.placements == (pl,)
        np.testing.assert_allclose(emb.weight.grad.full_tensor(),
                                   ref.weight.grad.full_tensor(), rtol=1e-12)


def test_colwise_output_already_in_place_is_not_moved_either_way(monkeypatch):
    # ColwiseParallel's default Shard(-1) is where the product already is: no
    # redistribute forward and none of its gradient in backward (each, though moving
    # nothing, would agree over the mesh: a collective torch does not make).
    mesh = mesh_of((W,))
    mt.manual_seed(2)
    lin = mp.parallelize_module(nn.Linear(3, 2 * W), mesh,
                                mp.ColwiseParallel(use_local_output=False))
    still = []  # the redistributes whose target is where the tensor is already
    real = DTensor.redistribute

    def spy(self, mesh=None, placements=None, **kw):
        norm = tuple(Shard(p.dim % self.ndim) if p.is_shard() else p for p in placements)
        if norm == self.placements:
            still.append(norm)
        return real(self, mesh, placements, **kw)

    monkeypatch.setattr(DTensor, "redistribute", spy)
    x = np.arange(12.0).reshape(4, 3)
    out = lin(x)
    assert out.placements == (Shard(1),)
    weighted(out).backward()
    assert still == []
    mt.manual_seed(2)
    ref = mt.distribute_module(nn.Linear(3, 2 * W), mesh)
    want = ref(distribute_tensor(x, mesh, [R]))
    weighted(want).backward()
    np.testing.assert_allclose(out.detach().full_tensor(), want.detach().full_tensor(),
                               rtol=1e-12)
    for p, q in ((lin.weight, ref.weight), (lin.bias, ref.bias)):
        np.testing.assert_allclose(p.grad.full_tensor(), q.grad.full_tensor(), rtol=1e-12)


# -- parameters -------------------------------------------------------------------------------

def test_parameters_require_grad_and_stay_leaves():
    mesh = mesh_of((W,))
    lin = mt.distribute_module(nn.Linear(3, 4), mesh)
    assert lin.weight.requires_grad and lin.weight.is_leaf
    frozen = nn.Module()
    frozen.w = nn.Parameter(distribute_tensor(np.ones(4), mesh, [R]), requires_grad=False)
    assert not frozen.w.requires_grad
    # A style putting a frozen parameter in new placements keeps it frozen.
    with mt.no_grad():
        frozen.w = frozen.w.redistribute(mesh, [S0])
    assert not frozen.w.requires_grad and frozen.w.placements == (S0,)
    # A computed DTensor becomes a leaf.
    y = lin.weight * 2
    frozen.register_parameter("v", y)
    assert frozen.v.is_leaf and frozen.v.requires_grad and frozen.v is not y
    # Loading writes the data without recording; the flags stay.
    lin.load_state_dict({"weight": np.zeros((4, 3)), "bias": np.ones(4)})
    assert lin.weight.requires_grad and lin.weight.is_leaf
    np.testing.assert_array_equal(lin.weight.detach().full_tensor(), 0)


def test_pickling_keeps_requires_grad():
    mesh = mesh_of((W,))
    x = distribute_tensor(np.ones((4, 2)), mesh, [S0], requires_grad=True)
    y = pickle.loads(pickle.dumps(x))
    assert y.requires_grad and y.is_leaf
    assert not pickle.loads(pickle.dumps(x.detach())).requires_grad


# -- torch ------------------------------------------------------------------------------------

def test_mlp_gradients_equal_torch():
    torch = pytest.importorskip("torch")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import parallel as tp

    from torch_helpers import init_gloo

    init_gloo()
    tmesh = init_device_mesh("cpu", (W,))
    mesh = mesh_of((W,))
    # An even hidden split: torch's RowwiseParallel takes a local input's global
    # width to be the local width times the ranks.
    h = 2 * W
    model = mp.parallelize_module(MLP(4, h), mesh, {
        "w1": mp.ColwiseParallel(), "w2": mp.RowwiseParallel()})
    ref = MLP(4, h)
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, h, dtype=torch.float64),
                                 torch.nn.GELU(approximate="tanh"),
                                 torch.nn.Linear(h, 4, dtype=torch.float64))
    with torch.no_grad():
        for i, lin in ((0, ref.w1), (2, ref.w2)):
            tmodel[i].weight.copy_(torch.from_numpy(lin.weight))
            tmodel[i].bias.copy_(torch.from_numpy(lin.bias))
    tmodel = tp.parallelize_module(tmodel, tmesh, {"0": tp.ColwiseParallel(),
                                                   "2": tp.RowwiseParallel()})
    a = np.random.default_rng(4).standard_normal((3, 4))
    c = np.random.default_rng(5).standard_normal((3, 4))
    out = DTensor.from_local(model(a), mesh, [R])
    (out * distribute_tensor(c, mesh, [R])).sum().backward()
    (tmodel(torch.from_numpy(a)) * torch.from_numpy(c)).sum().backward()
    for ours, theirs in ((model.w1, tmodel[0]), (model.w2, tmodel[2])):
        for name in ("weight", "bias"):
            g, tg = getattr(ours, name).grad, getattr(theirs, name).grad
            assert [p.is_shard() for p in g.placements] == [p.is_shard() for p in tg.placements]
            np.testing.assert_allclose(g.full_tensor(), tg.full_tensor().numpy(),
                                       rtol=1e-10, atol=1e-12)
