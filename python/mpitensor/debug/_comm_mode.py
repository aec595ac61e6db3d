"""CommDebugMode: counts the collectives that really ran, and their bytes, per
module, with the DTensor operations that led to them."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from collections import defaultdict

from .. import _modes, device_mesh as _device_mesh, _comm
from ._module_tracker import ModuleTracker

__all__ = ["CommDebugMode"]

# Views and copies: operations that never communicate, shown at noise level 3 only
# (torch's trivial aten ops: detach, t, view, transpose, ...).
TRIVIAL_OPS = frozenset({
    "numpy.transpose", "numpy.permute_dims", "numpy.matrix_transpose", "numpy.reshape",
    "numpy.ravel", "numpy.squeeze", "numpy.expand_dims", "numpy.moveaxis",
    "numpy.swapaxes", "numpy.copy", "numpy.positive", "numpy.asarray",
})
# Plan step kinds (csrc/ext/ext_redistribute.c) -> the collective that runs them.
_STEP_COLLECTIVE = {
    "all_gather": "all_gather_into_tensor", "all_to_all": "all_to_all_single",
    "all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter_tensor",
    "direct": "all_to_all_single", "all_reduce_nodes": "all_reduce",
}
_ANSI = re.compile(r"\x1B\[[0-?]*[ -/]*[@-~]")
_YELLOW, _RED, _RESET = "\033[1;33m", "\033[1;31m", "\033[0m"


class Counts(dict):
    """A dict of counts whose missing keys count 0 (as torch's defaultdict(int)),
    shown as a plain dict."""

    def __missing__(self, key) -> int:
        return 0


def _colours() -> bool:
    """ANSI colours for a terminal: never under NO_COLOR, always under FORCE_COLOR
    (no-color.org, force-color.org). A rank of an MPI job gets none by default:
    Open MPI gives every rank a pseudo-terminal whatever mpiexec's own output is
    (a pipe, a file)."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")):
        return False
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())


def _diff(now: dict, then: dict, index: int) -> Counts:
    out = Counts()
    for name, value in now.items():
        delta = value[index] - then[name][index]
        if delta:
            out[name] = delta
    return out


def _noise(level: int) -> tuple[bool, bool, bool]:
    """(DTensor operations and module data, operations without DTensor inputs,
    trivial operations) shown at ``level``, as torch's noise levels 0..3."""
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 3:
        raise ValueError(f"noise_level must be an int in 0..3, got {level!r}")
    return level > 0, level > 1, level > 2


class CommDebugMode:
    """Context manager that counts the MPI collectives run inside it, on this rank,
    and tells which module and which DTensor operation ran them.

    Counts come from the C executor, so they are the MPI calls that really ran.
    Keys are torch's functional-collective names: ``"all_gather_into_tensor"``,
    ``"all_reduce"``, ``"reduce_scatter_tensor"``, ``"all_to_all_single"``,
    ``"broadcast"``, ``"scatter"``, ``"exscan"``; missing keys read 0. Entering resets
    everything; ``comm_module_counts["Global"]`` exists from entry, as in torch.
    Local: counting and reporting never communicate (files are written by the rank
    that asks; give each rank its own file name or ask on one rank).

    Modules: every ``mpitensor.nn`` module that runs inside the context is traced,
    as in torch (global module hooks): counts also appear per module FQN in
    ``comm_module_counts[fqn]["forward"][name]``, added to every enclosing module
    and to ``"Global"``; collectives run by autograd's backward are counted under
    ``"backward"`` instead (on the modules running then: ``"Global"``). FQNs are torch's: ``MLP``, ``MLP.net2``. Passing a module
    (or calling :meth:`track`) names its submodules up front, so that one of them
    called on its own is still ``MLP.net1``.

    Example::

        >>> with CommDebugMode() as comm_mode:
        ...     model(x)
        >>> comm_mode.get_comm_counts()["all_reduce"]
        1
        >>> comm_mode.comm_module_counts["MLP.net2"]["forward"]["all_reduce"]
        1
        >>> print(comm_mode.generate_comm_debug_tracing_table(noise_level=1))
        >>> comm_mode.summary()
        '1 collective, 256 B sent by this rank: all_reduce 1 (256 B)'
    """

    def __init__(self, module=None):
        self._start = self._end = self._last = None
        self.comm_module_counts: dict = {}
        self.comm_module_bytes: dict = {}
        self._operation_counts: dict = {}
        # The operations as recorded, turned into torch's dicts only when read:
        # recording sits on every traced op, so an op appends what it was given,
        # ``(name, input specs)`` (the decision event appends it to ``_records``, as
        # _modes.add_listener says) or ``(name, shapes, shardings, mesh)``. Where
        # they ran is noted once per run of them at each module boundary and
        # backward switch: ``(end, module, is_bw)`` in ``_runs``, the run being
        # _records[previous end:end].
        self._records: list = []
        self._runs: list = []
        self.advanced_module_tracker = ModuleTracker(self._attribute)
        if module is not None:
            self.track(module)

    def track(self, module) -> "CommDebugMode":
        """Names ``module`` after its class and its submodules under it (``MLP``,
        ``MLP.net1``), as if it had run first. Local. Returns self.

        Example::

            >>> with CommDebugMode().track(model) as comm_mode:
            ...     model.net2(h)
            >>> list(comm_mode.comm_module_counts)
            ['Global', 'MLP.net2']
        """
        self.advanced_module_tracker.track(module)
        return self

    # -- context -----------------------------------------------------------------------
    def _inside(self) -> bool:
        return self._start is not None and self._end is None

    def __enter__(self) -> "CommDebugMode":
        self.comm_module_counts.clear()
        self.comm_module_bytes.clear()
        for table in (self.comm_module_counts, self.comm_module_bytes):
            # As torch's: "Global" is there from entry, with nothing counted yet.
            table["Global"] = {"forward": defaultdict(int), "backward": defaultdict(int)}
        self._operation_counts.clear()
        self._records.clear()
        self._runs.clear()
        self.advanced_module_tracker.reset()
        self._start, self._end = _comm.comm_counters(), None
        self._last = self._start
        self.advanced_module_tracker.attach()
        _modes.add_listener(self)
        return self

    def __exit__(self, *exc) -> None:
        _modes.remove_listener(self)
        self._end = _comm.comm_counters()
        self._attribute(self._end)
        self.advanced_module_tracker.detach()

    def _window(self):
        if self._start is None:
            raise RuntimeError("CommDebugMode has not been entered yet: use `with CommDebugMode() as m:`")
        return (self._end or _comm.comm_counters()), self._start

    def _attribute(self, now=None) -> None:
        """Adds the collectives since the last module boundary to the running module
        and to every module around it."""
        self._end_run()
        now = _comm.comm_counters() if now is None else now
        calls, nbytes = _diff(now, self._last, 0), _diff(now, self._last, 1)
        self._last = now
        if not calls:
            return
        side = "backward" if _modes.state.backward else "forward"
        for fqn in dict.fromkeys(self.advanced_module_tracker.parent_list):
            for table, delta in ((self.comm_module_counts, calls),
                                 (self.comm_module_bytes, nbytes)):
                entry = table.setdefault(fqn, {"forward": defaultdict(int),
                                               "backward": defaultdict(int)})
                for name, value in delta.items():
                    entry[side][name] += value

    def _settle(self) -> None:
        if self._inside():
            self._attribute()

    # -- operation trace (called by mpitensor._trace) ------------------------------------
    def _record_operation(self, name, shapes, shardings, mesh) -> None:
        self._records.append((name, shapes, shardings, mesh))

    def _end_run(self) -> None:
        """Notes that the operations recorded since the last note ran in the module
        running now, on the side (forward, backward) in force now: called before
        either changes."""
        end = len(self._records)
        if end and (not self._runs or self._runs[-1][0] != end):
            self._runs.append((end, self.advanced_module_tracker.name,
                               _modes.state.backward))

    @property
    def comm_module_operation_counts(self) -> dict:
        """Per module name, ``{"operations_list": [...]}``: each operation on
        DTensors with its input shapes, shardings, mesh and whether it ran in the
        backward, as torch's CommDebugMode lists them. Local.

        Example: ``comm_mode.comm_module_operation_counts["Global"]["operations_list"][0]["name"]``.
        """
        if self._inside():
            self._end_run()
        start = 0
        for end, module, is_bw in self._runs:
            for record in self._records[start:end]:
                self._list_operation(module, is_bw, *record)
            start = end
        self._records.clear()
        self._runs.clear()
        return self._operation_counts

    def _list_operation(self, module, is_bw, name, shapes, shardings=None,
                        mesh=None) -> None:
        """A recorded operation (shapes: the input specs without shardings) added to
        its module's list, as torch's CommDebugMode lists it."""
        if shardings is None:
            shapes, shardings, mesh = ([tuple(x.shape) for x in shapes],
                                       [tuple(x.placements) for x in shapes],
                                       shapes[0].mesh)
        if _device_mesh.is_local_mesh(mesh):
            # A rank's own values that autograd follows (to_local in grad mode):
            # torch's to_local gives a plain tensor there, which it does not list.
            return
        ops = self._operation_counts.setdefault(module, {"operations_list": []})
        ops["operations_list"].append({
            "name": name, "input_shape": list(shapes),
            "input_sharding": list(shardings),
            "device_mesh": str(mesh) if shapes else "",
            "is_bw": is_bw, "is_activation_checkpointing": False,
        })

    def _record_redistribute(self, explicit, mesh, steps, shape, src) -> None:
        if explicit:
            self._record_operation("DTensor.redistribute", [tuple(shape)], [src], mesh)
        for step in steps:
            collective = _STEP_COLLECTIVE.get(step[0])
            if collective is not None:
                self._record_operation(collective, [], [], mesh)

    # -- counts ----------------------------------------------------------------------------
    def get_comm_counts(self) -> Counts:
        """``{collective name: calls}`` inside the context (so far, while inside it);
        a collective that did not run counts 0. Local: this rank's calls.

        Example: ``comm_mode.get_comm_counts()["all_reduce"]`` is 1 after one
        ``Partial -> Replicate`` redistribute.
        """
        return _diff(*self._window(), 0)

    def get_comm_bytes(self) -> Counts:
        """``{collective name: payload bytes this rank delivered to other ranks}``.
        Local.

        Example: ``sum(comm_mode.get_comm_bytes().values())``: bytes this rank sent.
        """
        return _diff(*self._window(), 1)

    def get_total_counts(self) -> int:
        """All collective calls inside the context. Local: this rank's count.

        Example: ``assert comm_mode.get_total_counts() == 1``.
        """
        return sum(self.get_comm_counts().values())

    def get_parameter_info(self) -> dict:
        """``{module FQN: {parameter name: DTensor or ndarray}}`` of the modules
        that ran inside the context. Local.

        Example: ``comm_mode.get_parameter_info()["MLP.net1"]["weight"].placements``.
        """
        return self.advanced_module_tracker.module_parameters_dict

    def get_sharding_info(self) -> dict:
        """``{"MLP.net1.weight": placements}`` of the DTensor parameters of the
        modules that ran inside the context. Local.

        Example: ``comm_mode.get_sharding_info()["MLP.net1.weight"] == (Shard(0),)``.
        """
        return self.advanced_module_tracker.sharding_dict

    def summary(self) -> str:
        """One line: collectives, bytes this rank sent, and each kind's share. Local.

        >>> comm_mode.summary()
        '3 collectives, 1536 B sent by this rank: all_gather_into_tensor 2 (1024 B), all_reduce 1 (512 B)'
        """
        counts, nbytes = self.get_comm_counts(), self.get_comm_bytes()
        total = sum(counts.values())
        head = (f"{total} collective{'' if total == 1 else 's'}, "
                f"{sum(nbytes.values())} B sent by this rank")
        if not total:
            return head
        return head + ": " + ", ".join(f"{name} {counts[name]} ({nbytes[name]} B)"
                                       for name in sorted(counts))

    # -- reports ---------------------------------------------------------------------------
    def _operations(self, fqn: str, level: int, side: str = "forward") -> list:
        with_dtensor, without_dtensor, trivial = _noise(level)
        if not with_dtensor:
            return []
        ops = self.comm_module_operation_counts.get(fqn, {"operations_list": []})
        return [op for op in ops["operations_list"]
                if (without_dtensor or op["input_shape"])
                and (trivial or op["name"] not in TRIVIAL_OPS)
                and op["is_bw"] == (side == "backward")]

    def _collectives(self, fqn: str, side: str = "forward") -> list:
        counts = self.comm_module_counts.get(fqn)
        if counts is None:
            return []
        nbytes = self.comm_module_bytes[fqn][side]
        return [(name, count, nbytes[name]) for name, count in counts[side].items()]

    def generate_comm_debug_tracing_table(self, noise_level: int = 3) -> str:
        """The module tree with each module's collectives (count and bytes this rank
        sent) and, by ``noise_level``, more: 0 module-level collective counts;
        1 also module types, DTensor parameters and DTensor operations (shapes,
        placements, mesh) except trivial ones; 2 also operations without DTensor
        inputs (the collectives themselves); 3 also trivial operations (views).
        Collective and operation lines carry ANSI colours, as torch's, when
        standard output is a terminal (not under mpiexec, whose ranks all write to
        pseudo-terminals) and ``NO_COLOR`` is unset, or when ``FORCE_COLOR`` is
        set. Local.

        Example::

            >>> print(comm_mode.generate_comm_debug_tracing_table(noise_level=0))
            Global
              FORWARD PASS
                *all_reduce: 1 (256 B)
        """
        self._settle()
        with_module_data = _noise(noise_level)[0]
        tracker = self.advanced_module_tracker
        yellow, red, reset = (_YELLOW, _RED, _RESET) if _colours() else ("", "", "")
        lines = []
        for fqn, info in tracker.module_helper_dict.items():
            indent = "  " * (2 * info["depth"])
            lines.append(f"{indent}{fqn}")
            if with_module_data and "module_type" in info:
                lines.append(f"{indent}*module type: {info['module_type']}")
            if with_module_data and "parameters" in info:
                lines.append(f"{indent}*Parameter List")
                lines += [f"{indent} *{p}: {pl}" for p, pl in info["parameters"].items()]
            for side in ("forward", "backward"):
                collectives = self._collectives(fqn, side)
                operations = self._operations(fqn, noise_level, side)
                if not collectives and not operations:
                    continue
                lines.append(f"{indent}  {side.upper()} PASS")
                c_indent = "  " * (2 * info["depth"] + 2)
                o_indent = "  " * (2 * info["depth"] + 3)
                lines += [f"{yellow}{c_indent}*{name}: {count} ({nbytes} B){reset}"
                          for name, count, nbytes in collectives]
                for op in operations:
                    lines.append(f"{yellow}{c_indent}**{op['name']}{reset}")
                    if op["input_shape"]:
                        lines.append(f"{red}{o_indent}shape: {op['input_shape']}{reset}")
                        lines.append(f"{red}{o_indent}sharding: {op['input_sharding']}{reset}")
                        lines.append(f"{red}{o_indent}device mesh: {op['device_mesh']}{reset}")
        return "".join(line + "\n" for line in lines)

    def log_comm_debug_tracing_table_to_file(self, file_name: str = "comm_mode_log.txt",
                                             noise_level: int = 3) -> None:
        """Writes :meth:`generate_comm_debug_tracing_table` to ``file_name`` without
        colour codes. Local: the calling rank writes.

        Example::

            >>> if mesh.get_rank() == 0:
            ...     comm_mode.log_comm_debug_tracing_table_to_file("comm.txt", 1)
        """
        table = _ANSI.sub("", self.generate_comm_debug_tracing_table(noise_level))
        with open(file_name, "w") as f:
            f.write(table)

    def generate_json_dump(self, file_name: str = "comm_mode_log.json",
                           noise_level: int = 3) -> None:
        """Writes the module tree as JSON, in torch's format (``fqn``,
        ``module_type``, ``parameters``, ``children``, ``collectives_forward`` as
        ``[name, count]`` pairs, ``operations_forward``, and the same for
        ``_backward``: what ran inside autograd's backward; the checkpointing list
        stays empty) plus ``collective_bytes_forward``/``_backward``: ``[name, bytes
        this rank sent]`` pairs.
        ``noise_level`` selects operations as in
        :meth:`generate_comm_debug_tracing_table`. Local: the calling rank writes.

        Example::

            >>> comm_mode.generate_json_dump("comm.json", noise_level=1)
            >>> json.load(open("comm.json"))["collectives_forward"]
            [['all_reduce', 1]]
        """
        self._settle()
        with open(file_name, "w") as f:
            json.dump(self._json_node("Global", noise_level), f, indent=4)

    def _json_node(self, fqn: str, noise_level: int) -> dict:
        tracker = self.advanced_module_tracker
        info = tracker.module_helper_dict[fqn]
        with_module_data = _noise(noise_level)[0]
        operations, backward_ops = (copy.deepcopy(self._operations(fqn, noise_level, side))
                                    for side in ("forward", "backward"))
        for op in operations + backward_ops:
            op["input_shape"] = [str(s) for s in op["input_shape"]]
            op["input_sharding"] = [str(s) for s in op["input_sharding"]]
        collectives = self._collectives(fqn)
        backward = self._collectives(fqn, "backward")
        return {
            "fqn": fqn,
            "module_type": info.get("module_type", "") if with_module_data else "",
            "parameters": (list(info.get("parameters", {}).items())
                           if with_module_data else []),
            "children": [self._json_node(child, noise_level)
                         for child in tracker.parent_dict.get(fqn, [])],
            "collectives_forward": [[name, count] for name, count, _ in collectives],
            "collective_bytes_forward": [[name, nbytes] for name, _, nbytes in collectives],
            "collectives_backward": [[name, count] for name, count, _ in backward],
            "collective_bytes_backward": [[name, nbytes] for name, _, nbytes in backward],
            "operations_forward": operations,
            "operations_backward": backward_ops,
            "operations_checkpointing": [],
        }
