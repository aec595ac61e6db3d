"""Embedding: a lookup table of ``num_embeddings`` rows of ``embedding_dim``."""

from __future__ import annotations

import numpy as np

from . import _init
from . import functional as F
from .module import Module, Parameter

__all__ = ["Embedding"]


class Embedding(Module):
    """torch.nn.Embedding for NumPy: weight ``(num_embeddings, embedding_dim)``
    drawn from N(0, 1) (mpitensor's generator, reproducible with ``manual_seed``).

    ColwiseParallel shards the weight on the embedding dim (``Shard(1)``);
    RowwiseParallel on the vocabulary (``Shard(0)``): each rank looks up the
    indices in its rows and the partial results are summed.

    Construction is local. The forward is local on ndarrays and on DTensors that
    need no communication; collective on the mesh otherwise (as laid out by
    :func:`~mpitensor.parallel.parallelize_module`).

    Example::

        >>> Embedding(10, 4)(np.array([[1, 2]])).shape
        (1, 2, 4)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype=np.float64):
        super().__init__()
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.weight = Parameter(_init.normal((num_embeddings, embedding_dim), 1.0, dtype))

    def forward(self, input):
        return F.embedding(input, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
