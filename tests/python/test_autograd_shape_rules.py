"""Optional (skipped without torch): the backward of the operations that
rearrange, select or pad elements equals torch autograd's on the gathered values:
np.take, np.repeat, np.delete, np.compress, np.extract, np.partition, np.pad
(constant, edge, reflect, symmetric, wrap), np.convolve and np.correlate (each
mode), the stack family (vstack, hstack, dstack, column_stack, append), the split
family (hsplit, vsplit, dsplit), np.tril, np.triu, np.diagonal, np.trace,
np.fliplr, np.flipud and np.ediff1d. Layouts and tolerances as
test_autograd_order_fft's: every leaf layout of a 1-D mesh (uneven 7 x 5 shards)
and, at np 4, of a 2 x 2 mesh; each leaf's gradient has the leaf's placements."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from mpitensor import Replicate, Shard  # noqa: E402
from test_autograd_order_fft import SHAPE, W, _values, check, layouts  # noqa: E402


def _idx(*values):
    return torch.tensor(values, dtype=torch.long)


X2 = _values(SHAPE, seed=7)
KEPT = [0, 2, 3, 6]
MASK = np.random.default_rng(4).random(SHAPE) > 0.4

ONE = {
    "take-axis1": (lambda x: np.take(x, [4, -1, 0, 4], axis=1), lambda x: x[:, _idx(4, 4, 0, 4)]),
    "take-flat": (lambda x: np.take(x, [[3, 34], [3, 0]]),
                  lambda x: x.reshape(-1)[_idx(3, 34, 3, 0)].reshape(2, 2)),
    "take-wrap": (lambda x: np.take(x, [9, -8], axis=0, mode="wrap"), lambda x: x[_idx(2, 6)]),
    "take-clip": (lambda x: np.take(x, [9, -8, 1], axis=1, mode="clip"),
                  lambda x: x[:, _idx(4, 0, 1)]),
    "repeat-axis0": (lambda x: np.repeat(x, 3, axis=0),
                     lambda x: torch.repeat_interleave(x, 3, 0)),
    "repeat-counts": (lambda x: np.repeat(x, [1, 0, 2, 3, 1], axis=1),
                      lambda x: torch.repeat_interleave(x, _idx(1, 0, 2, 3, 1), 1)),
    "repeat-flat": (lambda x: np.repeat(x, 2), lambda x: torch.repeat_interleave(x.reshape(-1), 2)),
    "delete-axis0": (lambda x: np.delete(x, [1, 4, 5], axis=0), lambda x: x[_idx(*KEPT)]),
    "delete-flat": (lambda x: np.delete(x, slice(3, 30, 4)),
                    lambda x: x.reshape(-1)[torch.from_numpy(
                        np.delete(np.arange(35), slice(3, 30, 4)))]),
    "compress-axis1": (lambda x: np.compress([True, False, True, True], x, axis=1),
                       lambda x: x[:, _idx(0, 2, 3)]),
    "compress-flat": (lambda x: np.compress(MASK.reshape(-1), x),
                      lambda x: x.reshape(-1)[torch.from_numpy(MASK.reshape(-1))]),
    "extract": (lambda x: np.extract(MASK, x), lambda x: x[torch.from_numpy(MASK)]),
    "pad-constant": (lambda x: np.pad(x, ((1, 2), (0, 3)), constant_values=4.0),
                     lambda x: F.pad(x, (0, 3, 1, 2), value=4.0)),
    "pad-edge": (lambda x: np.pad(x, ((2, 1), (3, 2)), mode="edge"),
                 lambda x: F.pad(x[None], (3, 2, 2, 1), mode="replicate")[0]),
    "pad-reflect": (lambda x: np.pad(x, ((2, 3), (1, 4)), mode="reflect"),
                    lambda x: F.pad(x[None], (1, 4, 2, 3), mode="reflect")[0]),
    "pad-wrap": (lambda x: np.pad(x, ((3, 0), (2, 5)), mode="wrap"),
                 lambda x: F.pad(x[None], (2, 5, 3, 0), mode="circular")[0]),
    "pad-symmetric": (lambda x: np.pad(x, 2, mode="symmetric"),
                      lambda x: x[_idx(1, 0, 0, 1, 2, 3, 4, 5, 6, 6, 5)][
                          :, _idx(1, 0, 0, 1, 2, 3, 4, 4, 3)]),
    "vstack": (lambda x: np.vstack([x, x[1]]), lambda x: torch.vstack([x, x[1]])),
    "hstack": (lambda x: np.hstack([x, x[:, :2]]), lambda x: torch.hstack([x, x[:, :2]])),
    "hstack-1d": (lambda x: np.hstack([x[0], x[3]]), lambda x: torch.hstack([x[0], x[3]])),
    "dstack": (lambda x: np.dstack([x, x * 2]), lambda x: torch.dstack([x, x * 2])),
    "column_stack": (lambda x: np.column_stack([x[:, 1], x]),
                     lambda x: torch.column_stack([x[:, 1], x])),
    "append-axis0": (lambda x: np.append(x, x[:2], axis=0), lambda x: torch.cat([x, x[:2]], 0)),
    "append-flat": (lambda x: np.append(x, x[1]),
                    lambda x: torch.cat([x.reshape(-1), x[1]])),
    "hsplit": (lambda x: np.hsplit(x, [2])[1], lambda x: torch.hsplit(x, [2])[1]),
    "vsplit": (lambda x: np.vsplit(x, [3, 5])[1], lambda x: torch.vsplit(x, [3, 5])[1]),
    "dsplit": (lambda x: np.dsplit(x.reshape(7, 1, 5), [2])[1],
               lambda x: torch.dsplit(x.reshape(7, 1, 5), [2])[1]),
    "tril": (lambda x: np.tril(x, -1), lambda x: torch.tril(x, -1)),
    "triu": (lambda x: np.triu(x, 2), lambda x: torch.triu(x, 2)),
    "diagonal": (np.diagonal, torch.diagonal),
    "diagonal-above": (lambda x: np.diagonal(x, 2), lambda x: torch.diagonal(x, 2)),
    "diagonal-below": (lambda x: np.diagonal(x, -3, 1, 0), lambda x: torch.diagonal(x, -3, 1, 0)),
    "trace": (np.trace, torch.trace),
    "trace-offset": (lambda x: np.trace(x, 1), lambda x: torch.diagonal(x, 1).sum()),
    "fliplr": (np.fliplr, torch.fliplr),
    "flipud": (np.flipud, torch.flipud),
    "ediff1d": (lambda x: np.ediff1d(x, to_begin=[2.0, 3.0], to_end=1.0),
                lambda x: torch.cat([torch.tensor([2.0, 3.0], dtype=x.dtype),
                                     torch.diff(x.reshape(-1)),
                                     torch.tensor([1.0], dtype=x.dtype)])),
}


@layouts
@pytest.mark.parametrize("name", list(ONE))
def test_one_input(mesh_shape, pls, name):
    check(*ONE[name], [_values(SHAPE)], mesh_shape, pls)


@layouts
@pytest.mark.parametrize("axis", [0, 1, None])
def test_partition(mesh_shape, pls, axis):
    """torch has no partition: its reference gathers each output place from the
    input element of the same value, the places our forward chose."""
    x = _values(SHAPE)
    seen = {}

    def ours(a):
        y = np.partition(a, 2, axis=axis)
        seen["y"] = y.detach().full_tensor()
        return y

    def theirs(a):
        flat = x.reshape(-1) if axis is None else x
        ax = 0 if axis is None else axis
        y = seen["y"]
        order = np.argsort(flat, axis=ax, kind="stable")
        rank = np.argsort(np.argsort(y, axis=ax, kind="stable"), axis=ax, kind="stable")
        perm = np.take_along_axis(order, rank, axis=ax)
        src = a.reshape(-1) if axis is None else a
        return torch.take_along_dim(src, torch.from_numpy(perm), ax)
    check(ours, theirs, [x], mesh_shape, pls)


STACKS = {
    "vstack": (lambda a, b: np.vstack([a, b]), lambda a, b: torch.vstack([a, b])),
    "column_stack": (lambda a, b: np.column_stack([a, b]),
                     lambda a, b: torch.column_stack([a, b])),
    "append-axis1": (lambda a, b: np.append(a, b, axis=1), lambda a, b: torch.cat([a, b], 1)),
}


@layouts
@pytest.mark.parametrize("name", list(STACKS))
def test_two_inputs(mesh_shape, pls, name):
    check(*STACKS[name], [_values(SHAPE), X2], mesh_shape, pls)


@layouts
def test_diagonal_of_three_dims(mesh_shape, pls):
    x = _values((3, 7, 5))
    check(lambda a: np.trace(a, -1, 2, 1), lambda a: torch.diagonal(a, -1, 2, 1).sum(-1),
          [x], mesh_shape, pls)
    check(lambda a: np.diagonal(a, 1, 0, 2), lambda a: torch.diagonal(a, 1, 0, 2),
          [x], mesh_shape, pls)


# -- convolve and correlate: 1-D -----------------------------------------------------------

LAYOUTS_1D = [((W,), [Replicate()]), ((W,), [Shard(0)])]
if W == 4:
    LAYOUTS_1D.append(((2, 2), [Shard(0), Replicate()]))


def _start(n, m, mode):
    return {"full": 0, "same": (min(n, m) - 1) // 2, "valid": min(n, m) - 1}[mode]


def _torch_conv(a, v, mode, flip):
    """Full convolution (flip) or correlation by conv1d, cut to NumPy's mode."""
    n, m = a.shape[0], v.shape[0]
    w = v.flip(0) if flip else v
    full = F.conv1d(a[None, None], w[None, None], padding=m - 1)[0, 0]
    length = {"full": n + m - 1, "same": max(n, m), "valid": max(n, m) - min(n, m) + 1}[mode]
    s = _start(n, m, mode)
    return full[s:s + length]


@pytest.mark.parametrize("mesh_shape,pls", LAYOUTS_1D, ids=lambda v: str(v))
@pytest.mark.parametrize("mode", ["full", "same", "valid"])
@pytest.mark.parametrize("lengths", [(9, 4), (4, 9)], ids=["long-a", "long-v"])
@pytest.mark.parametrize("func", ["convolve", "correlate"])
def test_convolve_correlate(mesh_shape, pls, mode, lengths, func):
    if func == "correlate" and lengths[1] > lengths[0]:
        pytest.skip("np.correlate with a kernel longer than the signal has no "
                    "distributed rule: it gathers, and refuses grad mode")
    a, v = _values((lengths[0],), seed=1), _values((lengths[1],), seed=2)
    ours = (lambda p, q: getattr(np, func)(p, q, mode))
    check(ours, lambda p, q: _torch_conv(p, q, mode, func == "convolve"), [a, v],
          mesh_shape, pls)
