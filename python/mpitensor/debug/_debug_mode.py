"""DebugMode: torch's hierarchical trace of what each DTensor operation did.

One line per operation on DTensors (its operands in torch's shorthand,
``dt: f64[8, 4]| S(0)``), then, nested under it, its output's placements, each
input the operation redistributed (``redistribute_input [implicit] (1, S(0) ->
R)``) with the states it went through and the collectives that moved it, and
the local call on this rank's arrays. Explicit redistributes, module calls
(``record_nn_module``), Python-level calls and Python's own collectives take
their lines where they ran. The events come from the executor and Python's
collectives (mpitensor._trace); nothing here communicates.
"""

from __future__ import annotations

import os
import traceback
import weakref

import numpy as np

from .. import _layout, _modes, _trace
from .._dtensor import DTensor
from ..device_mesh import is_local_mesh
from ..nn import register_module_forward_hook, register_module_forward_pre_hook
from ..placement_types import Partial, Shard, from_code
from ._module_tracker import ModuleTracker

__all__ = ["DebugMode", "get_active_debug_mode"]

REDISTRIBUTE_FUNC = "redistribute_input"

# NumPy's dtype names -> torch's abbreviations (torch.utils._dtype_abbrs).
_ABBRS = {"float16": "f16", "float32": "f32", "float64": "f64", "bfloat16": "bf16",
          "complex64": "c64", "complex128": "c128", "bool": "b8", "int8": "i8",
          "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
          "uint16": "u16", "uint32": "u32", "uint64": "u64"}
# Plan step kinds (mpitensor._plan.STEP_KINDS) -> torch's functional collective;
# a local chunk runs none.
_COLLECTIVES = {"all_gather": "all_gather_into_tensor", "all_to_all": "all_to_all_single",
                "all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter_tensor",
                "direct": "all_to_all_single", "all_reduce_nodes": "all_reduce"}
# A record's user line is the innermost frame outside these: mpitensor's, and
# NumPy's Python-level functions that hand DTensors on (np.mean -> x.mean).
_LIBRARIES = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                   for m in (_modes, np))


# -- torch's shorthand ------------------------------------------------------------------

def _dtype(dtype) -> str:
    name = np.dtype(dtype).name
    return _ABBRS.get(name, name)


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def placements_str(placements) -> str:
    """torch's ``DTensorSpec.format_shard_order_str`` for the default shard order:
    one entry per mesh dim, ``[i]`` after a Shard whose tensor dim more than one
    mesh dim shards (its place among them). Local.

    Example: ``placements_str([Shard(0), Shard(0)]) == "S(0)[0]S(0)[1]"``.
    """
    out = []
    for m, p in enumerate(placements):
        if type(p) is Shard:
            dims = [k for k, q in enumerate(placements) if type(q) is Shard and q.dim == p.dim]
            out.append(f"{p}[{dims.index(m)}]" if len(dims) > 1 else str(p))
        else:
            out.append(str(p))
    return "".join(out)


class _Ids:
    """torch's graph-style ids (``dt$0``): one per object while it lives."""

    def __init__(self):
        self._ids: dict = {}
        self._next = 0

    def __call__(self, obj) -> int:
        key = id(obj)
        got = self._ids.get(key)
        if got is not None:
            return got
        try:
            weakref.finalize(obj, self._ids.pop, key, None)
        except TypeError:
            pass  # not weakly referable: its id may be reused once it dies
        self._ids[key] = got = self._next
        self._next += 1
        return got


class _Style:
    """How arrays are written: with ids (``record_ids``) and the attributes
    ``record_tensor_attributes`` names."""

    __slots__ = ("ids", "attributes")

    def __init__(self, ids, attributes):
        self.ids, self.attributes = ids, attributes


def _arg(x, style) -> str:
    """An argument as torch's DebugMode writes it: a DTensor ``dt: f32[8, 4]| S(0)``
    (a rank's own array that autograd follows, as torch's plain tensor, ``t:``),
    an array ``t: f32[4, 4]``, a sequence of them, or the value."""
    if isinstance(x, (list, tuple)):
        return str(type(x)(_arg(y, style) for y in x))
    return _tensor(x, style) if isinstance(x, (DTensor, np.ndarray)) else x


def _attributes(x, attributes) -> str:
    pairs = [f"{a}={getattr(x, a)}" for a in attributes if hasattr(x, a)]
    return "{" + ", ".join(pairs) + "}" if pairs else ""


def _tensor(x, style) -> str:
    tag = f"${style.ids(x)}" if style.ids is not None else ""
    attrs = _attributes(x, style.attributes)
    if isinstance(x, np.ndarray):
        return f"t{tag}: {_dtype(x.dtype)}{_shape(x.shape)}{attrs}"
    spec = x._spec
    if is_local_mesh(spec.mesh):
        return f"t{tag}: {_dtype(spec.dtype)}{_shape(x._local_tensor.shape)}{attrs}"
    return (f"dt{tag}: {_dtype(spec.dtype)}{_shape(spec.shape)}{attrs}| "
            f"{placements_str(spec.placements)}")


def _spec_arg(spec) -> str:
    return f"dt: {_dtype(spec.dtype)}{_shape(spec.shape)}| {placements_str(spec.placements)}"


def _args(args, style, kwargs=None) -> str:
    text = ", ".join(str(_arg(a, style)) for a in args if a is not None)
    if kwargs:
        text += ", " + ", ".join(f"{k}={_arg(v, style)}" for k, v in kwargs.items())
    return text


def _local(shape, mesh, placements) -> tuple:
    return _layout.compute_local_shape_and_global_offset(shape, mesh, placements)[0]


def _user_frame() -> str | None:
    """The innermost frame outside mpitensor and NumPy, as torch's DebugMode
    summarises it."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        if not os.path.abspath(frame.filename).startswith(_LIBRARIES):
            return (f"File: {frame.filename}:{frame.lineno} in {frame.name}, "
                    f"code: {frame.line}")
    return None


# -- the records ------------------------------------------------------------------------

class _DebugCall:
    """One line of the trace at ``call_depth``, as torch's ``_DebugCall``."""

    stack_trace = None

    def __init__(self, call_depth: int):
        self.call_depth = call_depth
        self.output_str: str | None = None

    def render(self, attributes=()) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.render()


class _OpCall(_DebugCall):
    """An operation (``numpy.matmul(dt: ..., dt: ...)``) or a local call; ``plain``
    for one on a rank's own arrays (torch's plain tensors)."""

    plain = False

    def __init__(self, name: str, args_str: str, call_depth: int):
        super().__init__(call_depth)
        self.name, self.args_str = name, args_str

    def render(self, attributes=()) -> str:
        return f"{self.name}({self.args_str}){self.output_str or ''}"


class _RedistributeCall(_DebugCall):
    """``redistribute_input``: ``[implicit] (i, src -> dst)`` once per input an
    operation moves, then the move itself, ``(t: local, trace: S(0)->R)``
    (``[explicit]`` for DTensor.redistribute)."""

    def __init__(self, arg, placement_str: str, call_depth: int, is_explicit=False):
        super().__init__(call_depth)
        self.arg, self.placement_str, self.is_explicit = arg, placement_str, is_explicit
        self.is_outer_call = isinstance(arg, int)

    def render(self, attributes=()) -> str:
        note = " [implicit] " if self.is_outer_call else " [explicit] " if self.is_explicit else ""
        return f"{REDISTRIBUTE_FUNC}{note}({self.arg}, {self.placement_str})"


class _OutputPlacementCall(_DebugCall):
    def __init__(self, placements_str: str, call_depth: int):
        super().__init__(call_depth)
        self.placements_str = placements_str

    def render(self, attributes=()) -> str:
        return f"-> output: {self.placements_str}"


class _AnnotateCall(_DebugCall):
    """``[nn.Mod] MLP.net1``, ``[annotate] tag``, ``[collective] ...``."""

    def __init__(self, tag, header: str, call_depth: int):
        super().__init__(call_depth)
        self.tag, self.header = tag, header

    def render(self, attributes=()) -> str:
        return f"[{self.header}] {self.tag}"


class _Open:
    """An operation decided and not yet run: its line and the moves of its inputs."""

    __slots__ = ("call", "index", "specs", "moves")

    def __init__(self, call, index, specs):
        self.call, self.index, self.specs, self.moves = call, index, specs, []


# -- the mode -----------------------------------------------------------------------------

class DebugMode:
    """Context manager that records, on this rank, a hierarchical trace of every
    DTensor operation run inside it; :meth:`debug_string` prints it in torch's
    format (``torch.utils._debug_mode.DebugMode``). Local: each rank records its
    own trace (its local shapes), nothing communicates.

    Each operation is one line, its operands in torch's shorthand
    (``dt: f32[8, 4]| S(0)``; a rank's own array that autograd follows is torch's
    plain tensor, ``t: f32[4, 8]``), named as mpitensor's executor names it
    (``numpy.matmul`` where torch writes ``aten::mm``). Under it: ``-> output:``
    its output's placements (torch prints this line only when its dispatch takes
    its slow path; mpitensor prints it for every operation), one
    ``redistribute_input [implicit] (i, src -> dst)`` per operand ``i`` it moved,
    with the move (``redistribute_input(t: f32[2, 4], trace: S(0)->R)``) and the
    collectives it ran under torch's names (``all_gather_into_tensor(t: f32[2, 4],
    2, 0)``: local input, group size, mesh dim), then the local call on this
    rank's arrays. An explicit ``redistribute`` is ``redistribute_input
    [explicit]``; Python's own collectives (distribute_tensor, sample sorts) are
    ``[collective]`` lines.

    Arguments are torch's: ``record_nn_module`` adds ``[nn.Mod] MLP.net1`` lines
    and nests what each module runs under it; ``record_stack_trace`` keeps the
    user's line of each record (``debug_string`` prints it above each group);
    ``record_output`` (default True) the output lines and the local call's
    result; ``record_ids`` writes ``dt$3`` ids that follow each array;
    ``record_torchfunction`` keeps the line of each Python-level NumPy call
    (torch's ``torch.mm`` line) even when it is one operation;
    ``record_realtensor`` the operations on a rank's own arrays that autograd
    follows; ``record_tensor_attributes`` names attributes written after each
    array's shape (``dt: f32[8, 4]{requires_grad=True}| S(0)``). The rest (fake
    tensors, profiler contexts, compile) have no mpitensor counterpart and are
    accepted for porting.

    Example (``mpiexec -n 2``)::

        >>> x = distribute_tensor(np.ones((8, 4), np.float32), mesh, [Shard(0)])
        >>> w = distribute_tensor(np.ones((4, 4), np.float32), mesh, [Shard(0)])
        >>> with DebugMode() as debug_mode:
        ...     y = (x @ w).sum()
        >>> print(debug_mode.debug_string())
          numpy.matmul(dt: f32[8, 4]| S(0), dt: f32[4, 4]| S(0))
            -> output: S(0)
            redistribute_input [implicit] (1, S(0) -> R)
              redistribute_input(t: f32[2, 4], trace: S(0)->R)
                all_gather_into_tensor(t: f32[2, 4], 2, 0)  ->  t: f32[4, 4]
            numpy.matmul(t: f32[4, 4], t: f32[4, 4])  ->  t: f32[4, 4]
          numpy.sum(dt: f32[8, 4]| S(0))
            -> output: P(sum)
            numpy.sum(t: f32[4, 4])  ->  t: f32[]
    """

    def __init__(self, *, record_torchfunction=False, record_faketensor=False,
                 record_realtensor=True, record_tensor_attributes=None,
                 record_nn_module=False, store_original_args=False,
                 record_stack_trace=False, record_output=True, record_ids=False,
                 record_profiler_context=True, record_localtensor=True,
                 run_compile_with_interpreter=False):
        self.record_torchfunction = record_torchfunction
        self.record_faketensor = record_faketensor
        self.record_realtensor = record_realtensor
        self.record_tensor_attributes = record_tensor_attributes or []
        self.record_nn_module = record_nn_module
        self.store_original_args = store_original_args
        self.record_stack_trace = record_stack_trace
        self.record_output = record_output
        self.record_ids = record_ids
        self.record_profiler_context = record_profiler_context
        self.record_localtensor = record_localtensor
        self.run_compile_with_interpreter = run_compile_with_interpreter
        # Names modules as torch does (MLP, MLP.net1); entering and leaving are this
        # mode's global hooks, the leaving one running before the module's own
        # forward hooks, as torch's ModTracker (a parallel style's output
        # redistribute shows after the module).
        self.module_tracker = ModuleTracker(lambda: None) if record_nn_module else None
        self._handles: list = []
        self.reset()

    def reset(self) -> None:
        """Forgets what was recorded. Local.

        Example: ``debug_mode.reset(); debug_mode.logs == []``.
        """
        self.operators: list = []
        self.call_depth = 0
        self.current_nn_module_stack: list = []
        self._ids = _Ids()
        self._open: _Open | None = None

    @property
    def logs(self) -> list:
        """The records, in order: each has ``call_depth`` and ``render()``. Local.

        Example: ``[log.render() for log in debug_mode.logs]``.
        """
        return list(self.operators)

    # -- context ------------------------------------------------------------------------
    def __enter__(self) -> "DebugMode":
        _modes.add_recorder(self)
        _trace.record_runs(True)
        if self.module_tracker is not None:
            self._handles = [register_module_forward_pre_hook(self._enter_module),
                             register_module_forward_hook(self._exit_module)]
        return self

    def __exit__(self, *exc) -> None:
        _modes.remove_recorder(self)
        _trace.record_runs(bool(_modes.recorders))
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._open = None

    # -- recording ------------------------------------------------------------------------
    def _record(self, call) -> None:
        if self.record_stack_trace:
            call.stack_trace = _user_frame()
        self.operators.append(call)

    def _style(self) -> _Style:
        return _Style(self._ids if self.record_ids else None, self.record_tensor_attributes)

    def _decision(self, name, specs) -> None:
        plain = all(is_local_mesh(s.mesh) for s in specs)
        if plain and not self.record_realtensor:
            self._open = None
            return
        depth = self.call_depth + 1 if plain else self.call_depth
        call = _OpCall(name, ", ".join(_spec_arg(s) for s in specs), depth)
        call.plain = plain
        self._record(call)
        self._open = _Open(call, len(self.operators), specs)

    def _ran(self, op_key, operands, targets, local_args, out) -> None:
        op, self._open = self._open, None
        if op is None:
            return
        call, style = op.call, self._style()
        call.args_str = _args(operands, style)
        outs = tuple(o for o in (out if isinstance(out, tuple) else (out,))
                     if isinstance(o, DTensor))
        if not outs:
            return
        if call.plain:
            if self.record_output:
                call.output_str = "  ->  " + str(_arg(out, style))
            return
        depth, lines = call.call_depth, []
        if self.record_output:
            pls = [placements_str(o._spec.placements) for o in outs]
            lines.append(_OutputPlacementCall(pls[0] if len(pls) == 1 else str(tuple(pls)),
                                              depth + 1))
        lines += self._implicit(op, operands, targets or (), depth)
        local = _OpCall(call.name, _args(local_args, style), depth + 1)
        if self.record_output:
            locals_ = tuple(o._local_tensor for o in outs)
            local.output_str = "  ->  " + str(_arg(locals_ if isinstance(out, tuple)
                                                   else locals_[0], style))
        lines.append(local)
        for line in lines:
            line.stack_trace = call.stack_trace
        self.operators[op.index:op.index] = lines

    def _implicit(self, op, operands, targets, depth) -> list:
        """The redistribute lines of the operands an operation moved, each with its
        move's collectives, pairing the moves (in operand order) with the operands
        whose placements they start from and reach."""
        lines, moves = [], list(op.moves)
        tensors = [i for i, x in enumerate(operands) if isinstance(x, DTensor)]
        for t, (i, dst) in enumerate(zip(tensors, targets)):
            spec = op.specs[t] if t < len(op.specs) else operands[i]._spec
            src = tuple(spec.placements)
            if tuple(dst) == src:
                continue
            lines.append(_RedistributeCall(
                i, f"{placements_str(src)} -> {placements_str(dst)}", depth + 1))
            move = next((m for m in moves if m[4] == src and _reaches(m[5], dst)), None)
            if move is not None:
                moves.remove(move)
                lines += self._move_lines(move, depth + 2, None, dst)
            else:
                local = _local(spec.shape, spec.mesh, src)
                lines.append(_RedistributeCall(
                    f"t: {_dtype(spec.dtype)}{_shape(local)}",
                    f"trace: {placements_str(src)}->{placements_str(dst)}", depth + 2))
        return lines

    def _move_lines(self, move, depth, explicit, dst=None) -> list:
        """``redistribute_input(t: local, trace: states)`` at ``depth`` and the
        collectives of its plan's steps under it."""
        mesh, steps, shape, dtype, src, last = move
        states = [src] + [tuple(from_code(c) for c in s[3]) for s in steps]
        if not steps:
            states.append(tuple(last))
        if dst is not None and tuple(dst) != states[-1]:
            states.append(tuple(dst))  # partitioned after its plan
        trace = "->".join(placements_str(s) for s in states)
        abbr = _dtype(dtype)
        arg = f"t: {abbr}{_shape(_local(shape, mesh, src))}"
        lines = [_RedistributeCall(arg, f"trace: {trace}", depth, is_explicit=bool(explicit))]
        if explicit and self.record_stack_trace:
            lines[0].stack_trace = _user_frame()
        for step in steps:
            name = _COLLECTIVES.get(step[0])
            if name is None:
                continue
            before = tuple(from_code(c) for c in step[2])
            after = tuple(from_code(c) for c in step[3])
            m = step[1]
            size = mesh.shape[m] if m >= 0 else mesh.size()
            extra = [size]
            if step[0] in ("all_reduce", "reduce_scatter", "all_reduce_nodes"):
                reduce_op = next((p.reduce_op for p in before if isinstance(p, Partial)), "sum")
                extra = [reduce_op] if step[0] != "reduce_scatter" else [reduce_op, size]
            if m >= 0:
                extra.append(m)
            call = _OpCall(name, ", ".join([f"t: {abbr}{_shape(_local(shape, mesh, before))}"]
                                           + [str(e) for e in extra]), depth + 1)
            if self.record_output:
                call.output_str = f"  ->  t: {abbr}{_shape(_local(shape, mesh, after))}"
            lines.append(call)
        return lines

    def _move(self, explicit, mesh, steps, shape, dtype, src, dst) -> None:
        move = (mesh, steps, shape, dtype, tuple(src), tuple(dst))
        if not explicit and self._open is not None and any(
                tuple(s.placements) == move[4] and tuple(s.shape) == tuple(shape)
                for s in self._open.specs):
            self._open.moves.append(move)
            return
        lines = self._move_lines(move, self.call_depth + 1, explicit)
        self.operators.extend(lines)

    def _local(self, name, inputs, out_placements) -> None:
        plain = all(is_local_mesh(x._spec.mesh) for x in inputs)
        if plain and not self.record_realtensor:
            return
        depth = self.call_depth + 1 if plain else self.call_depth
        self._record(_OpCall(name, _args(inputs, self._style()), depth))
        if self.record_output and not plain:
            self.operators.append(_OutputPlacementCall(placements_str(out_placements),
                                                       depth + 1))

    def _collective(self, what, mesh, placements, shape, dtype) -> None:
        text = what
        if shape is not None and dtype is not None:
            text += f" {_dtype(dtype)}{_shape(shape)}"
        if placements is not None:
            text += f"| {placements_str(placements)}"
        self._record(_AnnotateCall(text, "collective", self.call_depth + 1))

    def _call_enter(self, name, args, kwargs):
        call = _OpCall(name, _args(args, self._style(), kwargs), self.call_depth)
        self._record(call)
        self.call_depth += 1
        return (call, len(self.operators))

    def _call_exit(self, handle, result) -> None:
        call, start = handle
        self.call_depth -= 1
        inner = self.operators[start:]
        if (not self.record_torchfunction and inner and isinstance(inner[0], _OpCall)
                and all(c.call_depth > inner[0].call_depth for c in inner[1:])):
            # One operation (with what it nests): the call is that operation, as
            # torch's dispatch shows a torch function that is one aten op.
            del self.operators[start - 1]
            for c in inner:
                c.call_depth -= 1
            return
        if self.record_output and result is not None:
            call.output_str = "  ->  " + str(_arg(result, self._style()))

    # -- modules --------------------------------------------------------------------------
    def _enter_module(self, module, args) -> None:
        fqn = self.module_tracker.fqn(module)
        self._record(_AnnotateCall(fqn, "nn.Mod", self.call_depth + 1))
        self.current_nn_module_stack.append(fqn)
        self.call_depth += 1

    def _exit_module(self, module, args, output) -> None:
        if self.current_nn_module_stack:
            self.call_depth -= 1
            self.current_nn_module_stack.pop()

    # -- annotations -----------------------------------------------------------------------
    @staticmethod
    def _annotate(tag) -> None:
        """Adds ``[annotate] tag`` to the innermost entered DebugMode's trace (none
        entered: nothing). Local.

        Example: ``DebugMode._annotate("step 3")``.
        """
        mode = get_active_debug_mode()
        if mode is not None:
            mode._record(_AnnotateCall(tag, "annotate", mode.call_depth))

    # -- output -----------------------------------------------------------------------------
    def debug_string(self, show_stack_trace: bool | None = None) -> str:
        """The trace, one record a line, indented two spaces per level of nesting
        (torch's format). With ``show_stack_trace`` (default: ``record_stack_trace``)
        each group of records from one user line gets a ``# File: ...`` line above
        it. Local.

        Example: ``print(debug_mode.debug_string())``.
        """
        show = self.record_stack_trace if show_stack_trace is None else show_stack_trace
        lines, previous = [], None
        for op in self.operators:
            if show and op.stack_trace and op.stack_trace != previous:
                if lines:
                    lines.append("")
                lines.append("  " * (op.call_depth + 1) + "# " + op.stack_trace)
                previous = op.stack_trace
            lines.append("  " + "  " * op.call_depth + op.render(self.record_tensor_attributes))
        return "\n".join(lines)


def _reaches(plan_dst, target) -> bool:
    """Whether a move to ``plan_dst`` serves an operand headed to ``target``: the
    same placements but where the target partitions a Replicate into Partial(sum)."""
    return len(plan_dst) == len(target) and all(
        p == q or (isinstance(q, Partial) and not p.is_shard() and not isinstance(p, Partial))
        for p, q in zip(plan_dst, target))


def get_active_debug_mode() -> DebugMode | None:
    """The innermost entered DebugMode, or None. Local.

    Example: ``mode = get_active_debug_mode()``.
    """
    return _modes.recorders[-1] if _modes.recorders else None
