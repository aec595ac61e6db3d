"""examples/train_gpt.py, the end-to-end proof: a GPT trained with tensor and
sequence parallelism on ``tp`` and fully_shard on ``dp`` follows, in float64, the
one-process loss curve to rtol 1e-9 at every step; a run saved on one mesh and
resumed on another continues the same curve; and with torch installed, one step's
per-parameter gradients equal those of the same model written in torch, and a
step communicates no more than torch's with the same plan.

The one-process reference runs on every rank over MPI_COMM_SELF (a tiny model), so
each rank compares against it without communication."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor.debug import CommDebugMode
from mpitensor.testing import init_torch_gloo

COMM = MPI.COMM_WORLD
W, RANK = COMM.Get_size(), COMM.Get_rank()
HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "train_gpt.py")

_spec = importlib.util.spec_from_file_location("train_gpt", EXAMPLE)
G = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(G)

DATA = G.CharData()
# 12 heads of 2 split whole over 1..4 ranks; a sequence of 10 splits unevenly over
# 3 and 4, the vocabulary (57) over 2..4.
CFG = dict(vocab=DATA.vocab, dim=24, heads=12, layers=2, seq=10, batch=4, lr=1e-2,
           dtype=np.float64)
STEPS, SAVE_AT = 4, 2


def meshes():
    """The meshes over all ranks that the example offers at this size."""
    out = [(W,)]
    if W % 2 == 0:
        out.append((2, W // 2))
    return out


def one_rank_mesh():
    return G.make_mesh((1,), MPI.COMM_SELF)


def run(dims_or_mesh, steps=STEPS, start=0, model=None, opt=None, **kw):
    cfg = G.Config(**{**CFG, **kw})
    mesh = dims_or_mesh if isinstance(dims_or_mesh, mt.DeviceMesh) else G.make_mesh(
        dims_or_mesh, COMM)
    if model is None:
        model = G.build(cfg, mesh)
        opt = G.make_optimizer(model, cfg)
    losses = G.train_steps(model, opt, DATA, cfg, mesh, start, steps)
    return losses, model, opt, mesh


@pytest.fixture(scope="module")
def reference():
    """The loss curve of one process (mesh (1,) over MPI_COMM_SELF)."""
    return run(one_rank_mesh())[0]



# -- the data and the forward -------------------------------------------------------

def test_batches_depend_on_seed_and_step_only():
    a = DATA.batch(0, 7, 4, 10)
    b = DATA.batch(0, 7, 4, 10)
    c = DATA.batch(0, 8, 4, 10)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])
    tokens, targets = a
    assert np.array_equal(tokens[:, 1:], targets[:, :-1])  # targets are the next character


def test_unigram_baseline_is_the_entropy_of_character_frequencies():
    counts = np.bincount(DATA.ids)
    p = counts[counts > 0] / DATA.ids.size
    assert np.isclose(DATA.unigram_loss(), -(p * np.log(p)).sum(), rtol=1e-12)
    assert DATA.unigram_loss() < np.log(DATA.vocab)


@pytest.mark.parametrize("dims", meshes())
def test_forward_loss_equals_one_rank(dims):
    cfg = G.Config(**CFG)
    ref_mesh = one_rank_mesh()
    ref = G.loss_of(G.build(cfg, ref_mesh), *G.local_batch(DATA, cfg, 0, ref_mesh))
    mesh = G.make_mesh(dims, COMM)
    with mt.no_grad():
        got = G.global_loss(G.loss_of(G.build(cfg, mesh), *G.local_batch(DATA, cfg, 0, mesh)),
                            mesh)
    np.testing.assert_allclose(got, G.global_loss(ref, ref_mesh), rtol=1e-12)


# -- training -----------------------------------------------------------------------

@pytest.mark.parametrize("dims", meshes())
def test_loss_curve_equals_one_rank(dims, reference):
    losses = run(dims)[0]
    np.testing.assert_allclose(losses, reference, rtol=1e-9)
    assert reference[-1] < reference[0]


def test_resume_on_other_meshes_continues_the_curve(reference, tmp):
    """Saved at step SAVE_AT on the largest mesh, loaded on every other mesh the
    ranks allow and on one process: the remaining steps equal the uninterrupted run."""
    dims = meshes()[-1]
    _, model, opt, mesh = run(dims, steps=SAVE_AT)
    path = os.path.join(tmp, "ckpt")
    G.save(path, model, opt, SAVE_AT, mesh)
    targets = [d for d in meshes() if d != dims] + [one_rank_mesh()]
    for target in targets:
        cfg = G.Config(**CFG)
        mesh = target if isinstance(target, mt.DeviceMesh) else G.make_mesh(target, COMM)
        model = G.build(cfg, mesh)
        opt = G.make_optimizer(model, cfg)
        start = G.load(path, model, opt, mesh)
        assert start == SAVE_AT
        losses = run(mesh, start=start, model=model, opt=opt)[0]
        np.testing.assert_allclose(losses, reference[SAVE_AT:], rtol=1e-9)


def test_resume_with_dropout_draws_the_same_masks(tmp):
    """With dropout the checkpoint's generator state gives the resumed run the masks
    the uninterrupted run drew (a fresh generator would draw the first steps' again)."""
    whole = run((W,), dropout=0.2)[0]
    _, model, opt, mesh = run((W,), steps=SAVE_AT, dropout=0.2)
    path = os.path.join(tmp, "dropout")
    G.save(path, model, opt, SAVE_AT, mesh)
    cfg = G.Config(**{**CFG, "dropout": 0.2})
    model = G.build(cfg, mesh)
    opt = G.make_optimizer(model, cfg)
    start = G.load(path, model, opt, mesh)
    losses = G.train_steps(model, opt, DATA, cfg, mesh, start, STEPS)
    np.testing.assert_allclose(losses, whole[SAVE_AT:], rtol=1e-12)


def test_command_line_saves_and_resumes(tmp, capsys):
    """--save-at and --resume through main(): the resumed run prints the steps the
    uninterrupted run took after the checkpoint, on a mesh of another shape."""
    path = os.path.join(tmp, "cli")
    args = ["--dim", "24", "--heads", "12", "--layers", "1", "--seq", "8", "--batch", "4",
            "--dtype", "float64", "--steps", "3", "--print-every", "1"]
    whole = G.main(args + ["--mesh", f"2x{W // 2}" if W % 2 == 0 else str(W)])
    saved = G.main(args + ["--save-at", "1", "--ckpt", path])
    resumed = G.main(args + ["--resume", path])
    np.testing.assert_allclose(saved, whole, rtol=1e-9)
    np.testing.assert_allclose(resumed, whole[1:], rtol=1e-9)
    with pytest.raises(SystemExit, match="--save-at 1 must lie after the first step"):
        G.main(args + ["--resume", path, "--save-at", "1"])
    if RANK == 0:
        out = capsys.readouterr().out
        assert "unigram baseline" in out and "resumed at step 1" in out


@pytest.mark.parametrize("dims", meshes(), ids=str)
def test_checkpointing_and_accumulation_follow_the_curve(dims, reference):
    """--checkpoint (each block recomputed in backward) and --accumulate 2 (two
    micro-batches, one reduction) train the same curve as the plain run."""
    for kw in (dict(checkpoint=True), dict(accumulate=2), dict(checkpoint=True,
                                                                accumulate=2)):
        np.testing.assert_allclose(run(dims, **kw)[0], reference, rtol=1e-9, err_msg=str(kw))


def test_cosine_schedule_resumes_where_it_stopped(tmp):
    """--schedule cosine --warmup 2: the rates follow a linear warmup and a cosine
    decay, and a resumed run (the scheduler in the checkpoint) continues them."""
    path = os.path.join(tmp, "sched")
    args = ["--dim", "24", "--heads", "12", "--layers", "1", "--seq", "8", "--batch", "4",
            "--dtype", "float64", "--steps", "4", "--print-every", "1",
            "--schedule", "cosine", "--warmup", "2"]
    whole = G.main(args)
    saved = G.main(args + ["--save-at", "2", "--ckpt", path])
    resumed = G.main(args + ["--resume", path])
    np.testing.assert_allclose(saved, whole, rtol=1e-9)
    np.testing.assert_allclose(resumed, whole[2:], rtol=1e-9)
    cfg = G.Config(**{**CFG, "schedule": "cosine", "warmup": 2})
    opt = G.make_optimizer(G.build(cfg, G.make_mesh((W,), COMM)), cfg)
    sched, rates = G.make_scheduler(opt, cfg, 6), []
    for _ in range(6):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    lr = CFG["lr"]
    np.testing.assert_allclose(rates[:3], [lr / 2, 3 * lr / 4, lr], rtol=1e-12)
    assert rates[3] < rates[2] and rates[-1] >= lr / 10


# -- against torch ------------------------------------------------------------------

def torch_gpt(torch, model, cfg):
    """The same GPT in torch, with ``model``'s (one-rank) parameters."""
    tnn, tF = torch.nn, torch.nn.functional

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            d = cfg.dim
            self.attention_norm, self.ffn_norm = tnn.LayerNorm(d), tnn.LayerNorm(d)
            self.q_proj, self.k_proj = tnn.Linear(d, d), tnn.Linear(d, d)
            self.v_proj, self.out_proj = tnn.Linear(d, d), tnn.Linear(d, d)
            self.w1, self.w2 = tnn.Linear(d, 4 * d), tnn.Linear(4 * d, d)

        def forward(self, x):
            b, s, d = x.shape
            h = self.attention_norm(x)
            q, k, v = (p(h).view(b, s, cfg.heads, -1).transpose(1, 2)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
            o = tF.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out_proj(o.transpose(1, 2).reshape(b, s, d))
            return x + self.w2(tF.gelu(self.w1(self.ffn_norm(x))))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = tnn.Embedding(cfg.vocab, cfg.dim), tnn.Embedding(cfg.seq,
                                                                               cfg.dim)
            self.blocks = tnn.ModuleList([Block() for _ in range(cfg.layers)])
            self.norm = tnn.LayerNorm(cfg.dim)
            self.output = tnn.Linear(cfg.dim, cfg.vocab, bias=False)

        def forward(self, tokens):
            h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))[None]
            for blk in self.blocks:
                h = blk(h)
            return self.output(self.norm(h))

    tmodel = GPT().double()
    for name, p in tmodel.named_parameters():
        with torch.no_grad():
            p.copy_(torch.from_numpy(full(model_param(model, torch_to_mt(name)))))
    return tmodel


def torch_to_mt(name):
    """The mpitensor GPT's name of a torch GPT parameter."""
    parts = name.replace("tok.", "tok_embeddings.").replace("pos.", "pos_embeddings.")
    parts = parts.replace("blocks.", "layers.")
    for a, b in (("q_proj", "attention.q_proj"), ("k_proj", "attention.k_proj"),
                 ("v_proj", "attention.v_proj"), ("out_proj", "attention.out_proj"),
                 ("w1", "feed_forward.w1"), ("w2", "feed_forward.w2")):
        parts = parts.replace(f".{a}.", f".{b}.")
    return parts


def model_param(model, name):
    return dict(model.named_parameters())[name]


def full(x):
    with mt.no_grad():
        return np.array(x.full_tensor() if isinstance(x, mt.DTensor) else x)


@pytest.mark.parametrize("dims", meshes())
def test_gradients_equal_torch(dims):
    torch = pytest.importorskip("torch")
    cfg = G.Config(**CFG)
    mesh = G.make_mesh(dims, COMM)
    model = G.build(cfg, mesh)
    loss = G.loss_of(model, *G.local_batch(DATA, cfg, 0, mesh))
    loss.backward()
    # The torch model takes the whole batch; its gradient is that of the mean over
    # every row, which fully_shard's averaging over dp gives too.
    tmodel = torch_gpt(torch, model, cfg)
    tokens, targets = DATA.batch(cfg.seed, 0, cfg.batch, cfg.seq)
    logits = tmodel(torch.from_numpy(tokens))
    tloss = torch.nn.functional.cross_entropy(logits.transpose(1, 2),
                                              torch.from_numpy(targets))
    tloss.backward()
    np.testing.assert_allclose(G.global_loss(loss, mesh), tloss.item(), rtol=1e-12)
    grads = {n: p.grad for n, p in model.named_parameters()}
    for name, p in tmodel.named_parameters():
        np.testing.assert_allclose(full(grads[torch_to_mt(name)]), p.grad.numpy(),
                                   rtol=1e-10, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("dims", meshes())
def test_a_step_communicates_no_more_than_torch(dims):
    """One training step (forward, backward, AdamW) counted by CommDebugMode: no
    more collectives of any kind than torch's with the same plan, fully_shard and
    loss_parallel on gloo (benchmarks/train.py's torch twin of the example)."""
    torch = pytest.importorskip("torch")
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "bench_train", os.path.join(HERE, "..", "..", "benchmarks", "train.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    init_torch_gloo()
    cfg = G.Config(**{**CFG, "dtype": np.float32, "clip": 0.0})
    with mt.no_grad():
        one = G.build(cfg, one_rank_mesh())
        weights = {k: np.asarray(v.full_tensor()) for k, v in one.state_dict().items()}
    ours = bench.MtRun(cfg, G.make_mesh(dims, COMM), DATA)
    theirs = bench.TorchRun(torch, cfg, dims, DATA, weights)
    ours.step(), theirs.step()  # the optimizers' states exist from here on
    with CommDebugMode() as mode:
        ours.step()
    with TorchCommDebugMode() as tmode:
        theirs.step()
    names = {"_allgather_base_": "all_gather_into_tensor",
             "_reduce_scatter_base_": "reduce_scatter_tensor"}
    torch_counts = {}
    for op, n in tmode.get_comm_counts().items():
        name = str(op).split(".")[-1]
        name = names.get(name, name)
        torch_counts[name] = torch_counts.get(name, 0) + n
    counts = dict(mode.get_comm_counts())
    assert counts or W == 1, "a sharded step communicates"
    for name, n in counts.items():
        assert n <= torch_counts.get(name, 0), (name, counts, torch_counts)
