"""The programs whose leaf gradients' placements test_grad_placements.py holds
(without torch) and test_grad_placements_torch.py holds against torch 2.13 (with
it): each one forward over leaves of given placements, and the placements torch
leaves in each leaf's ``.grad`` on a mesh of more than one rank, written out."""

from __future__ import annotations

import numpy as np


def _matmul(x, w):
    return x @ w


def _scale(x, w):
    return x * w


def _mlp(x, w1, b1, w2):
    h = x @ w1 + b1
    return (np.tanh(h) if isinstance(h, np.lib.mixins.NDArrayOperatorsMixin)
            or type(h).__module__.startswith("mpitensor") else h.tanh()) @ w2


# (name, mesh shape (0: the world size), leaf shapes (each dim times the world
# size), the leaves' placements ('S0', 'R', 'Psum', one per mesh dim), the
# indices of the leaves that require grad, the program, and the placements torch
# 2.13 leaves in each such leaf's .grad; the loss is the sum of the program's
# output, squared first where the name says so).
CASES = [
    ("matmul-batch-sharded-squared", (0,), ((4, 2), (2, 3)), (("S0",), ("R",)), (1,), _matmul,
     (("Psum",),)),
    ("matmul-contraction-sharded", (0,), ((3, 2), (2, 3)), (("S1",), ("R",)), (1,),
     _matmul, (("S0",),)),
    ("matmul-replicate-squared", (0,), ((3, 2), (2, 3)), (("R",), ("R",)), (0, 1), _matmul,
     (("R",), ("R",))),
    ("broadcast-scale-squared", (0,), ((4, 3), (3,)), (("S0",), ("R",)), (1,), _scale,
     (("Psum",),)),
    ("tp-mlp", (0,), ((3, 8), (8, 4), (4,), (4, 5)), (("R",), ("S1",), ("S0",), ("S0",)),
     (1, 2, 3), _mlp, (("S1",), ("S0",), ("S0",))),
    ("dp-mlp-squared", (0,), ((4, 8), (8, 4), (4,), (4, 5)), (("S0",), ("R",), ("R",), ("R",)),
     (1, 2, 3), _mlp, (("Psum",), ("Psum",), ("Psum",))),
    ("2d-dp-tp-matmul-squared", (2, 2), ((4, 6), (6, 4)), (("S0", "R"), ("R", "S1")), (1,),
     _matmul, (("Psum", "S1"),)),
]


def mesh_shape(case, world: int):
    """The case's mesh shape at ``world`` ranks, or None where it does not fit."""
    shape = tuple(world if d == 0 else d for d in case[1])
    return shape if int(np.prod(shape)) == world else None


def loss(case, y):
    """The case's loss of the program's output ``y``."""
    return (y * y).sum() if case[0].endswith("-squared") else y.sum()


def shape_of(shape, n: int) -> tuple:
    """A leaf's global shape with every dim a multiple of ``n`` ranks."""
    return tuple(d * n for d in shape)
