"""Type stubs of the mpitensor._C extension (internal: use the mpitensor package).

Placements cross the boundary as (kind, dim, reduce_op) int triples: kind 0
Replicate, 1 Shard(dim), 2 Partial(reduce_op) with reduce ops 0 sum, 1 avg,
2 product, 3 max, 4 min (the core's constants, read in mpitensor._clib.CORE).
"""

from typing import Any, Sequence

import numpy as np

Codes = Sequence[tuple[int, int, int]]
# (alpha_shm, beta_shm, alpha_net, beta_net, call, copy, reduce, ranks_per_node):
# seconds per message and per byte on each link, per communicating step, per byte
# copied and reduced locally; ranks per node (0: one node).
TimeModel = tuple[float, float, float, float, float, float, float, int]

def empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """A new C-contiguous array, from the block pool when it is large. Local."""

def data_address(array: np.ndarray) -> int:
    """The address of an ndarray's data (its ``.ctypes.data``). Local."""
def adopt(pointer: Any, kind: str, keep: Any = None) -> Any:
    """A capsule that owns what a filled ctypes.c_void_p points to: 'plan' or
    'pending' (completed before it is freed, then ``keep`` let go). Local."""

# Capsules ("mpitensor._C.comm_counters", "mpitensor._C.io_counters") of the
# module's communication and I/O counters, which mpitensor._comm and
# mpitensor.checkpoint._io pass back to C (mpitensor._clib.exported reads each
# capsule as the extension's table of exports says).
COMM_COUNTERS: Any
IO_COUNTERS: Any
# ((status, exception class), ...), most specific first: the one table by which
# the extension raises a status and maps an exception back (csrc/ext/ext_args.c).
STATUS_EXCEPTIONS: tuple[tuple[int, type], ...]
# {C struct name: (size, ((field, element type, offset, size, extents), ...))} of
# every struct Python reads, and {capsule name: (element type, size, extents)} of
# what each exported capsule points to (csrc/ext/ext_structs.c; mpitensor._clib).
STRUCTS: dict[str, tuple[int, tuple[tuple[str, str, int, int, tuple[int, ...]], ...]]]
EXPORTS: dict[str, tuple[str, int, tuple[int, ...]]]

class DTensorBase:
    """The C base of mpitensor.DTensor: its fields and the executor's doors
    (operators, __array_ufunc__, reduction methods,
    redistribute); see csrc/ext/ext_dtensor.c. Local."""

    _local_tensor: Any
    _spec: Any
    _requires_grad: bool
    _grad_fn: Any
    _fresh: bool
    def __init__(self, local_tensor: Any, spec: Any) -> None: ...
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any: ...
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
    """The C base of every mesh: its communicators (an mt_mesh, which it owns) and
    the decision memo and layout table of the operations on the mesh. Local."""

    _as_parameter_: int  # the mt_mesh, for ctypes calls of the comm library
    _tables: tuple[Any, Any]  # capsules of its memo and layout table
    def _adopt(self, pointer: Any) -> None: ...
    def _time_model_changed(self) -> None: ...
    def _set_cache_limits(self, decisions: int, plans: int, layouts: int) -> None: ...
    _local: bool  # mpitensor's local mesh
    _equal_key: int  # equal meshes, equal keys
    _ranks_key: int  # meshes of the same ranks of one communicator, equal keys
    _call_agreements: int  # a program's calls agreed on over this mesh
    def _agree_call(self, fingerprint: int, message: bytes) -> None: ...
    def _any_bits(self, bits: int) -> int: ...

# A capsule ("mpitensor._C.modes") of the modes in force (mpitensor._modes._State
# maps it).
MODES: Any

def dispatch_init(dtensor_type: type, spec_type: type, node_type: type, request_type: type,
                  replicate: Any, shards: tuple, partials: tuple, strided: Any) -> None: ...
def register_ufunc(ufunc: Any, family: int, kind: int) -> None: ...
def register_reduction(func: Any, method: str | None, reduce_op: int, partial_rule: int,
                       partial_ops: int, even_only: bool, local: Any = None) -> None: ...
def register_grad(func: Any, name: str, backward: Any) -> None: ...
def set_cache_limits(decisions: int, plans: int, layouts: int) -> None: ...
def execute(key: Any, operands: tuple, build: Any, local: Any, extra: tuple,
            kwnames: tuple | None, box: bool, axis: Any, keepdims: bool) -> Any: ...
def decide(key: Any, operands: tuple, build: Any) -> tuple[tuple, tuple | None, int]: ...
def call_flags(args: tuple, kwargs: dict) -> int: ...
def one_mesh(args: tuple, kwargs: dict) -> tuple[tuple, dict]: ...
def call_fingerprint(name: str, args: tuple, kwargs: dict) -> int: ...
def agree_call(name: str, args: tuple, kwargs: dict, caller: Any) -> int: ...
def whole_view(func: Any, args: tuple, kwargs: dict) -> Any: ...
def set_user_rule(func: Any, has_rule: bool) -> None: ...
def move(dtensor: DTensorBase, placements: Sequence[Any], what: str) -> Any: ...
def record(name: str, out: Any, inputs: Sequence[Any], backward_fn: Any,
           always: bool = False, saved: Any = None, aux: Any = None) -> Any: ...
def set_hook(name: str, fn: Any) -> None:
    """Hooks: the events 'decision', 'move', 'unmoved'; 'placements', 'door', 'error'."""
def watch_errstate(var: Any, fn: Any) -> None:
    """NumPy's error state is the ContextVar ``var``; ``fn()`` says whether it raises."""
def errstate_raises() -> bool:
    """Whether NumPy's error state here raises (or calls a function), as ``fn`` says."""
# A capsule ("mpitensor._C.hook_calls") of the counts of calls from C into Python
# by hook kind, then of the operations the executor ran (mpitensor._trace.hook_stats
# reads them).
HOOK_CALLS: Any
HOOK_COUNT: int
