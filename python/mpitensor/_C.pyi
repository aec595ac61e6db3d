"""Type stubs of the mpitensor._C extension (internal: use the mpitensor package).

Placements cross the boundary as (kind, dim, reduce_op) int triples: kind 0
Replicate, 1 Shard(dim), 2 Partial(reduce_op) with reduce ops 0 sum, 1 avg,
2 product, 3 max, 4 min.
"""

from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

MAX_NDIM: int
MAX_MESH_NDIM: int

Codes = Sequence[tuple[int, int, int]]
# (alpha_shm, beta_shm, alpha_net, beta_net, call, copy, reduce, ranks_per_node):
# seconds per message and per byte on each link, per communicating step, per byte
# copied and reduced locally; ranks per node (0: one node).
TimeModel = tuple[float, float, float, float, float, float, float, int]

class Mesh:
    """The communicators of a device mesh. Collective on `comm` to create."""

    def __init__(self, comm: MPI.Comm, shape: Sequence[int], ranks: np.ndarray,
                 fingerprint: int = 0, failure: BaseException | None = None) -> None: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    def slice(self, dims: Sequence[int]) -> "Mesh": ...
    def coordinate(self) -> tuple[int, ...] | None: ...
    def time_model(self) -> TimeModel: ...
    def nodes(self) -> tuple[str, int, int, int]: ...
    def set_time_model(self, model: TimeModel) -> None: ...
    def groups(self) -> tuple[MPI.Comm, ...]: ...
    def bcast(self, array: np.ndarray, dim: int) -> None: ...
    def any(self, flag: object) -> bool: ...
    def exscan(self, array: np.ndarray, dim: int, op: int) -> None: ...
    def alltoallv(self, array: np.ndarray, counts: Sequence[int], dim: int
                  ) -> tuple[np.ndarray, tuple[int, ...]]: ...

class Plan:
    """A redistribution plan made by the C planner for elements of ``dtype``, the
    move checked first (RuntimeError: a Partial created; TypeError: a reduction the
    dtype lacks). Local."""

    def __init__(self, shape: Sequence[int], mesh_shape: Sequence[int], src: Codes,
                 dst: Codes, dtype: Any, model: TimeModel | None = None) -> None: ...
    @property
    def nsteps(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def messages(self) -> int: ...
    @property
    def time(self) -> float: ...
    @property
    def net_bytes(self) -> int: ...
    def predict(self, model: TimeModel) -> float: ...
    # (kind, mesh_dim, src_codes, dst_codes, bytes, messages, seconds, copy_bytes,
    #  reduce_bytes, net_bytes)
    def steps(self) -> list[tuple[str, int, tuple, tuple, int, int, float, int, int,
                                  int]]: ...
    def torch(self) -> "Plan | None": ...
    def torch_bytes(self) -> tuple[int, int]: ...

class Request:
    """An exchange in flight: an async redistribute or a ring exchange. Safe to
    wait on from several threads at once."""

    @property
    def done(self) -> bool: ...
    def wait(self) -> Any: ...
    def test(self) -> bool: ...

def default_time_model() -> TimeModel: ...
def mpi_library_version() -> str: ...
def comm_live_count() -> int: ...
def comm_counters() -> dict[str, tuple[int, int]]: ...
def set_collective_timeout(seconds: float | None) -> None:
    """Local. A process that waits in one of mpitensor's blocking collectives this
    long, with no other call entered, prints where it waits and aborts the job; 0
    turns the watchdog off; None sets the default (1800 s)."""


def collective_timeout() -> float:
    """The watchdog's timeout in seconds, 0.0 when off."""


def watchdog_listen(mesh: Mesh) -> bool:
    """Collective on the mesh when it holds every rank of MPI_COMM_WORLD, else
    Local: starts listening for ranks that leave the job; whether this process
    listens (not alone, MPI_THREAD_MULTIPLE)."""


def watchdog_work(tag: int) -> None:
    """Local: the tag of the work (an engine's cell) this process runs now."""


def watchdog_tell(reason: str, tag: int) -> None:
    """Tells every other process that this one failed in work `tag`, without
    leaving."""


def watchdog_failed(tag: int) -> int:
    """Local: how many other processes said they failed in work `tag`."""


def watchdog_leave(reason: str | None) -> None:
    """This process leaves the job for `reason` (None: only stop listening): waits
    up to a second for the others to leave too, else tells them and waits."""


def agree(mesh: Mesh, ok: bool, fingerprint: int, message: str,
          error: type[Exception] = ValueError) -> None:
    """Collective on the mesh. Raises on every member when some member passed
    ok=False (the first such member's `error`, as ValueError, TypeError,
    IndexError, MemoryError, NotImplementedError, OverflowError, OSError or else
    RuntimeError, with its message), or when the fingerprints (mod 2**64) differ
    (ValueError with the first member's message). Outsiders raise only their own."""
    ...
def plan_check(src: Codes, dst: Codes, dtype: Any) -> None:
    """Local. Raises what redistributing `src` to `dst` placements of `dtype` refuses:
    RuntimeError for a new Partial, TypeError for a reduction the dtype lacks."""
    ...
def redistribute(mesh: Mesh, plan: Plan, local: np.ndarray) -> np.ndarray: ...
def distribute(mesh: Mesh, placements: Codes, full: np.ndarray, src: int = 0
               ) -> np.ndarray: ...
def cumulate(x: np.ndarray, axis: int, op: int, init: np.ndarray | None, scan: bool
             ) -> tuple[np.ndarray | None, np.ndarray]:
    """Running sums (REDUCE_SUM) or products of C-contiguous x along axis, each lane
    from init (None: its first element); (out or None unless scan, each lane's last)."""
def arg_extreme(x: np.ndarray, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """numpy.argmax (largest) or argmin of C-contiguous x along axis (int64) and the
    extremes, both without the axis."""
def select_exchange(mesh: Mesh, shape: Sequence[int], src_codes: Codes, dst_codes: Codes,
                    starts: Sequence[int], steps: Sequence[int], counts: Sequence[int],
                    piece: np.ndarray) -> np.ndarray: ...

class DimMap:
    """An operation's dim map for the sharding-propagation engine, checked once.
    Local. Label kinds LABEL_*, partial rules PARTIAL_*, reduce ops REDUCE_* (see
    csrc/include/mpitensor/core/prop.h)."""

    def __init__(self, in_labels: Sequence[Sequence[int]], in_bcast: Sequence[int],
                 out_labels: Sequence[int], label_kind: Sequence[int],
                 label_reduce_op: Sequence[int], even_only: int, partial_rule: int,
                 partial_inputs: int, partial_ops: int, sized_labels: int,
                 label_size: Sequence[int], out_size: Sequence[int] = ...) -> None: ...
    @property
    def ninputs(self) -> int: ...

def dimmap_elementwise(kind: int, noperands: int, tensors: int,
                       shapes: Sequence[Sequence[int]]) -> DimMap: ...
def dimmap_matmul(a_shape: Sequence[int], b_shape: Sequence[int],
                  transpose_b: bool) -> DimMap: ...

# The core's enums (prop.h, layout.h, plan.h).
LABEL_KEEP: int
LABEL_CONTRACT: int
LABEL_REDUCE: int
LABEL_REPLICATE: int
PARTIAL_NONE: int
PARTIAL_LINEAR_ALL: int
PARTIAL_LINEAR_ONE: int
PARTIAL_SAME_OP: int
PARTIAL_ADDITIVE: int
REDUCE_SUM: int
REDUCE_AVG: int
REDUCE_PRODUCT: int
REDUCE_MAX: int
REDUCE_MIN: int
REDUCE_COUNT: int
REDUCE_OPS: tuple[str, ...]
PLACEMENT_REPLICATE: int
PLACEMENT_SHARD: int
PLACEMENT_PARTIAL: int
ELEMENTWISE_NONE: int
ELEMENTWISE_ADD: int
ELEMENTWISE_MUL: int
ELEMENTWISE_DIV: int
ELEMENTWISE_MAX: int
ELEMENTWISE_MIN: int
ELEMENTWISE_NEG: int
ELEMENTWISE_INCREASING: int
FAMILY_ELEMENTWISE: int
FAMILY_MATMUL: int
PROP_MAX_INPUTS: int
PROP_MAX_LABELS: int
STEP_KINDS: tuple[str, ...]

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

def io_counters() -> tuple[int, int]:
    """Local. (data bytes read, data bytes written) by this process through io_save
    and io_load since the module was loaded."""
    ...

def io_pipeline(chunk_bytes: int, io_thread: bool) -> tuple[int, bool]:
    """Local. Sets how the following io_save and io_load calls move boxes of many
    short runs (row slabs in chunks of about chunk_bytes per rank, written or read
    by an I/O thread while the next chunk is exchanged); returns the previous
    setting."""
    ...

def io_gather(mode: int) -> int:
    """Local. Whether a save of interleaved boxes whose ranks share one node is
    written by two writers that read the other ranks' boxes straight from their
    memory (two threads of the first rank, or the first two ranks when each is
    bound to its own CPU): 0 never, 1 where it pays (the default), 2 always by the
    first rank's threads where it works. The first rank's setting decides; returns
    the previous mode.

    Example: ``old = _C.io_gather(0)`` makes every rank write its row slab.
    """
    ...

class DTensorBase:
    """The C base of mpitensor.DTensor: its fields and the executor's doors
    (operators, __array_ufunc__, __array_function__, reduction methods,
    redistribute); see csrc/ext/ext_dtensor.c. Local."""

    _local_tensor: Any
    _spec: Any
    _requires_grad: bool
    _grad_fn: Any
    _fresh: bool
    def __init__(self, local_tensor: Any, spec: Any) -> None: ...
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any: ...
    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any: ...
    def redistribute(self, device_mesh: Any = None, placements: Any = None, *,
                     async_op: bool = False, forward_dtype: Any = None,
                     backward_dtype: Any = None) -> Any: ...
    def sum(self, *args: Any, **kwargs: Any) -> Any: ...
    def mean(self, *args: Any, **kwargs: Any) -> Any: ...
    def prod(self, *args: Any, **kwargs: Any) -> Any: ...
    def max(self, *args: Any, **kwargs: Any) -> Any: ...
    def min(self, *args: Any, **kwargs: Any) -> Any: ...
    def all(self, *args: Any, **kwargs: Any) -> Any: ...
    def any(self, *args: Any, **kwargs: Any) -> Any: ...
    def std(self, *args: Any, **kwargs: Any) -> Any: ...
    def var(self, *args: Any, **kwargs: Any) -> Any: ...
    def argmax(self, *args: Any, **kwargs: Any) -> Any: ...
    def argmin(self, *args: Any, **kwargs: Any) -> Any: ...

class MeshBase:
    """The C base of mpitensor.DeviceMesh: the communicators' handle and the
    decision memo and layout table of the operations on the mesh. Local."""

    _handle: Mesh
    def _dispatch_stats(self) -> dict[str, int]: ...
    def _dispatch_clear(self) -> None: ...
    def _set_cache_limits(self, decisions: int, plans: int, layouts: int) -> None: ...

class Modes:
    """The modes in force, held once (mpitensor._modes sets them). Local."""

    grad_enabled: bool
    backward: bool
    checks: bool
    log_debug: bool
    log_info: bool
    gather_warning: bool
    implicit_replication: int
    listeners: int
    @property
    def tracing(self) -> bool: ...
    @property
    def gather_report(self) -> bool: ...

modes: Modes

def dispatch_init(dtensor_type: type, spec_type: type, replicate: Any, shards: tuple,
                  partials: tuple, functions: dict, rules: dict, backwards: dict) -> None: ...
def register_ufunc(ufunc: Any, family: int, kind: int) -> None: ...
def register_reduction(func: Any, method: str | None, reduce_op: int, partial_rule: int,
                       partial_ops: int, even_only: bool) -> None: ...
def register_grad(func: Any, name: str, backward: Any) -> None: ...
def set_cache_limits(decisions: int, plans: int, layouts: int) -> None: ...
def op_id(key: Any) -> int: ...
def execute(key: Any, operands: tuple, build: Any, local: Any, extra: tuple,
            kwargs: dict | None, box: bool, axis: Any, keepdims: bool) -> Any: ...
def decide(key: Any, operands: tuple, build: Any) -> tuple[tuple, tuple | None, int]: ...
def call(func: Any, args: tuple, kwargs: dict | None) -> Any: ...
def move(dtensor: DTensorBase, placements: Sequence[Any], what: str) -> Any: ...
def record(name: str, out: Any, inputs: Sequence[Any], backward_fn: Any) -> Any: ...
def set_hook(name: str, fn: Any) -> None: ...
def hook_stats() -> dict[str, int]: ...
def count_backward() -> None: ...

def ring_shift_start(mesh: Mesh, dim: int, sends: Sequence[np.ndarray],
                     recvs: Sequence[np.ndarray]) -> Request: ...
def ring_allgatherv_start(mesh: Mesh, dim: int, send: np.ndarray, recv: np.ndarray,
                          byte_counts: Sequence[int]) -> Request: ...
def ring_allgather_int64(mesh: Mesh, dim: int, values: Sequence[int]) -> tuple[int, ...]: ...
