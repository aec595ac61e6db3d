"""One all-gather that lets every rank of a context-parallel mesh agree on its
shards before any data moves: a bad input anywhere, inputs that differ between
ranks, or shard lengths that are not the load-balanced ones raise the same
ValueError, with the same message, on every rank instead of leaving the others in
a collective."""

from __future__ import annotations

from .. import _comm
from . import _load_balance as LB


def agree_on_shards(mesh, n: int, meta: list, problem, who: str, names: tuple,
                    differs: str) -> list:
    """``meta`` is ``[failed, len_0, ..., len_k, fingerprint...]`` on this rank, with
    one sequence length per entry of ``names``; collective over ``mesh``'s ring.
    Returns, per name, the lengths of every rank's shard.

    Example (every rank of a 2-rank mesh)::

        >>> agree_on_shards(h, 2, [0, 3, 42], None, "unshard", ("x",), "shape")
        [[3, 3]]
    """
    width, k = len(meta), len(names)
    got = _comm.ring_allgather_int64(mesh, 0, meta)
    rows = [got[i * width:(i + 1) * width] for i in range(n)]
    if any(row[0] for row in rows):
        # Every rank learnt that some rank failed; the first one's reason travels
        # through the agreement primitive, so every rank raises the same message.
        _comm.agree(mesh, not problem, 0, f"{who}: {problem}", ValueError)
    if any(row[1 + k:] != rows[0][1 + k:] for row in rows):
        raise ValueError(f"{who}: the ranks passed inputs that differ in {differs}")
    lengths = [[row[1 + j] for row in rows] for j in range(k)]
    for name, lens in zip(names, lengths):
        total = sum(lens)
        if any(lens[i] != LB.local_length(total, n, i) for i in range(n)):
            raise ValueError(f"{who}: the {name} shards have lengths {lens}, not the "
                             f"load-balanced shards of a sequence of {total} that "
                             f"context_parallel makes")
    return lengths
