"""Type stubs of the mpitensor._C extension (internal: use the mpitensor package).

Placements cross the boundary as (kind, dim, reduce_op) int triples: kind 0
Replicate, 1 Shard(dim), 2 Partial(reduce_op) with reduce ops 0 sum, 1 avg,
2 product, 3 max, 4 min.
"""

from typing import Sequence

import numpy as np
from mpi4py import MPI

MAX_NDIM: int
MAX_MESH_NDIM: int

Codes = Sequence[tuple[int, int, int]]

class Mesh:
    """The communicators of a device mesh. Collective on `comm` to create."""

    def __init__(self, comm: MPI.Comm, shape: Sequence[int], ranks: np.ndarray) -> None: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    def slice(self, dims: Sequence[int]) -> "Mesh": ...
    def coordinate(self) -> tuple[int, ...] | None: ...
    def groups(self) -> tuple[MPI.Comm, ...]: ...
    def bcast(self, array: np.ndarray, dim: int) -> None: ...
    def any(self, flag: object) -> bool: ...

class Plan:
    """A redistribution plan made by the C planner. Local."""

    def __init__(self, shape: Sequence[int], mesh_shape: Sequence[int], src: Codes,
                 dst: Codes, itemsize: int) -> None: ...
    @property
    def nsteps(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def messages(self) -> int: ...
    def steps(self) -> list[tuple[str, int, tuple, tuple, int, int]]: ...

class Request:
    """An asynchronous redistribute in flight."""

    @property
    def done(self) -> bool: ...
    def wait(self) -> np.ndarray: ...

def mpi_library_version() -> str: ...
def comm_live_count() -> int: ...
def comm_counters() -> dict[str, tuple[int, int]]: ...
def local_box(global_shape: Sequence[int], mesh_shape: Sequence[int],
              coordinate: Sequence[int], placements: Codes
              ) -> tuple[tuple[int, ...], tuple[int, ...]]: ...
def even_global_shape(local_shape: Sequence[int], mesh_shape: Sequence[int],
                      placements: Codes) -> tuple[int, ...]: ...
def rng_fill(out: np.ndarray, global_shape: Sequence[int], offset: Sequence[int],
             seed: int, stream: int, dist: int) -> None: ...
def redistribute(mesh: Mesh, plan: Plan, local: np.ndarray) -> np.ndarray: ...
def redistribute_start(mesh: Mesh, plan: Plan, local: np.ndarray) -> Request: ...
def distribute(mesh: Mesh, placements: Codes, full: np.ndarray) -> np.ndarray: ...
def select_exchange(mesh: Mesh, shape: Sequence[int], src_codes: Codes, dst_codes: Codes,
                    starts: Sequence[int], steps: Sequence[int], counts: Sequence[int],
                    piece: np.ndarray) -> np.ndarray: ...

class DimMap:
    """An operation's dim map for the sharding-propagation engine, checked once.
    Local. Kinds: 0 KEEP, 1 CONTRACT, 2 REDUCE, 3 REPLICATE; partial rules: 0 NONE,
    1 LINEAR_ALL, 2 LINEAR_ONE, 3 SAME_OP (see csrc/include/mpitensor/prop.h)."""

    def __init__(self, in_labels: Sequence[Sequence[int]], in_bcast: Sequence[int],
                 out_labels: Sequence[int], label_kind: Sequence[int],
                 label_reduce_op: Sequence[int], even_only: int, partial_rule: int,
                 partial_inputs: int, partial_ops: int, sized_labels: int,
                 label_size: Sequence[int], out_size: Sequence[int] = ...) -> None: ...
    @property
    def ninputs(self) -> int: ...

def propagate(dimmap: DimMap, mesh_shape: Sequence[int], shapes: Sequence[Sequence[int]],
              codes: Sequence[Codes], itemsizes: Sequence[int]
              ) -> tuple[tuple[tuple[tuple[int, int, int], ...], ...],
                         tuple[tuple[int, int, int], ...], tuple[int, ...]]: ...

def io_save(mesh: Mesh, path: str | bytes, header: bytes, shape: Sequence[int],
            itemsize: int, offset: int, box_offset: Sequence[int],
            box_shape: Sequence[int], buf: np.ndarray) -> None:
    """Collective. A new file: header, then the array at `offset`, this rank's box
    from `buf`; written under a temporary name and renamed when all ranks are done.
    OSError (the same on every rank) when any rank fails."""
    ...

def io_load(mesh: Mesh, path: str | bytes, shape: Sequence[int], itemsize: int,
            offset: int, box_offset: Sequence[int], box_shape: Sequence[int],
            out: np.ndarray) -> None:
    """Collective. Reads this rank's box of the array at `offset` into `out`."""
    ...
