"""Every member's bytes on every member of a mesh dim, through the C comm library:
for the few small messages the Python floors exchange (a collective check's call
texts, an assertion's verdicts), which must go through it (:mod:`._comm`) like
every other collective so that the collective watchdog sees them, and which CommDebugMode must
not count as the program's own communication.
"""

from __future__ import annotations

import numpy as np

from . import _comm

# The most int64 values ``_comm.ring_allgather_int64`` takes from each rank per call.
_WORDS_PER_CALL = 64


def allgather_bytes(mesh, dim: int, data: bytes) -> list[bytes]:
    """Every member's ``data`` along mesh dim ``dim`` of ``mesh`` (a ``_comm.Mesh``),
    in coordinate order. Collective on the dim; not counted in the comm counters.

    The lengths travel first, then the bytes as int64 words, 64 a call, every rank
    sending as many words as the longest needs (each call takes the same number of
    values from every rank).

    Example (every rank of a 2-rank mesh)::

        >>> allgather_bytes(mesh, 0, f"rank {mesh.get_rank()}".encode())
        [b'rank 0', b'rank 1']
    """
    lengths = _comm.ring_allgather_int64(mesh, dim, [len(data)])
    words = -(-max(lengths) // 8)
    mine = np.zeros(words, dtype="<i8")
    mine.view(np.uint8)[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    parts = []
    for start in range(0, words, _WORDS_PER_CALL):
        chunk = mine[start:start + _WORDS_PER_CALL]
        got = _comm.ring_allgather_int64(mesh, dim, chunk.tolist())
        parts.append(np.array(got, dtype="<i8").reshape(len(lengths), chunk.size))
    rows = np.concatenate(parts, axis=1) if parts else np.zeros((len(lengths), 0), "<i8")
    return [row.view(np.uint8)[:n].tobytes() for row, n in zip(rows, lengths)]
