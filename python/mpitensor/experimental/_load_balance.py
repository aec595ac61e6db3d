"""The load-balanced sequence order of context parallelism.

A sequence of length L on N ranks is cut into 2N chunks (sizes as
``np.array_split``: they differ by at most one, so any L works); rank r keeps
chunk r (the head) and chunk 2N-1-r (the tail), as torch's round-robin load
balancer does. Under a causal mask a query attends to every key before it, so
head chunks have little work and tail chunks much: pairing them gives every rank
the same share. With N = 1 the order is the identity.
"""

from __future__ import annotations


def chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """``[(start, stop)]`` of the 2n chunks of a sequence of ``length``."""
    parts = 2 * n
    base, extra = divmod(length, parts)
    bounds, start = [], 0
    for c in range(parts):
        stop = start + base + (1 if c < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def rank_segments(length: int, n: int, rank: int) -> list[tuple[int, int]]:
    """The global ``(start, stop)`` of the head and tail chunks ``rank`` holds, in
    the order they are stored locally."""
    bounds = chunk_bounds(length, n)
    return [bounds[rank], bounds[2 * n - 1 - rank]]


def local_length(length: int, n: int, rank: int) -> int:
    """How many positions of a sequence of ``length`` ``rank`` holds."""
    return sum(stop - start for start, stop in rank_segments(length, n, rank))
