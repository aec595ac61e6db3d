"""The state-dict functions of ``torch.distributed.checkpoint.state_dict``, so that a
torch script's save and resume code ports line for line.

``get_state_dict(model, optimizers)`` gives the model's state dict and the
optimizers' in torch's distributed form: keys are the parameters' fully qualified
names with wrappers' prefixes taken out (``_checkpoint_wrapped_module.``), and the
optimizer's state is keyed by those names instead of indices, so a checkpoint
loads into the same model wrapped otherwise, parallelized otherwise, or on another
mesh. ``StateDictOptions(full_state_dict=True)`` gives whole arrays instead of
DTensors (with ``cpu_offload=True`` on the first rank only, as torch's);
``set_state_dict`` takes either back, and with ``broadcast_from_rank0=True`` a full
state dict that only rank 0 holds.
"""

from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple

import numpy as np

from .._distribute import distribute_tensor
from .._dtensor import DTensor
from ..placement_types import Replicate
from ..optim.optimizer import Optimizer
from . import _agree

__all__ = ["StateDictOptions", "get_model_state_dict", "get_optimizer_state_dict",
           "get_state_dict", "set_model_state_dict", "set_optimizer_state_dict",
           "set_state_dict"]

_WRAPPERS = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


@dataclasses.dataclass
class StateDictOptions:
    """torch's options of the state-dict functions. ``full_state_dict``: whole
    arrays (NumPy) instead of DTensors; ``cpu_offload``: with ``full_state_dict``,
    only the first rank of the world gets them (the others an empty dict);
    ``ignore_frozen_params``: parameters that do not require grad are left out;
    ``keep_submodule_prefixes``: with ``submodules``, keys keep their prefix;
    ``strict``: ``set_*`` raise on missing or unexpected keys;
    ``broadcast_from_rank0``: ``set_*`` take a full state dict that only rank 0
    holds; ``flatten_optimizer_state_dict``: the optimizer's state dict as one flat
    dict (``state.<fqn>.<key>``, ``param_groups.<fqn>.<key>``). Local (a value).

    Example: ``StateDictOptions(full_state_dict=True, cpu_offload=True)``.
    """

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False


class IncompatibleKeys(NamedTuple):
    """``set_model_state_dict``'s result, as torch's ``_IncompatibleKeys``."""

    missing_keys: list
    unexpected_keys: list


def _fqn(name: str) -> str:
    for w in _WRAPPERS:
        name = name.replace(w, "")
    return name


def _optimizers(optimizers) -> list:
    opts = [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)
    for o in opts:
        if not isinstance(o, Optimizer):
            raise TypeError(f"expected mpitensor optimizers, got {type(o).__name__}")
    return opts


def _first_rank() -> bool:
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank() == 0


def _full(value):
    return value.detach().full_tensor() if isinstance(value, DTensor) else value


def _finish(sd: dict, options: StateDictOptions, full=None) -> dict:
    """``sd`` as the options ask: whole arrays (``full`` says how to make one from
    a value), and with cpu_offload only on the first rank."""
    if not options.full_state_dict:
        return sd
    out = _map_arrays(sd, full or _full)
    return out if not options.cpu_offload or _first_rank() else {}


def _map_arrays(obj, fn):
    if isinstance(obj, dict):
        return {k: _map_arrays(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_arrays(v, fn) for v in obj]
    if isinstance(obj, (DTensor, np.ndarray)):
        return fn(obj)
    return obj


def _model_items(model, submodules, options: StateDictOptions):
    """(clean fqn, own key, value) of the model's state dict, as the options pick."""
    frozen = {id(p) for p in model.parameters() if not p.requires_grad} \
        if options.ignore_frozen_params else set()
    prefixes = None
    if submodules:
        names = {id(m): n for n, m in model.named_modules()}
        prefixes = [_fqn(names[id(m)]) + "." for m in submodules]
    items = []
    for key, value in model.state_dict().items():
        fqn = _fqn(key)
        if id(value) in frozen:
            continue
        if prefixes is not None:
            hit = next((p for p in prefixes if fqn.startswith(p)), None)
            if hit is None:
                continue
            if not options.keep_submodule_prefixes:
                fqn = fqn[len(hit):]
        items.append((fqn, key, value))
    return items


def get_model_state_dict(model, *, submodules=None, options=None) -> dict:
    """The model's state dict by fully qualified names (wrappers' prefixes taken
    out): the parameters and buffers themselves (DTensors, or with
    ``full_state_dict`` whole NumPy arrays), as torch's. Collective with
    ``full_state_dict`` (each DTensor is gathered), else Local.

    Example::

        >>> sd = get_model_state_dict(model)
        >>> mpitensor.save(sd, "ckpt/model")
    """
    options = options or StateDictOptions()
    return _finish({fqn: v for fqn, _, v in _model_items(model, submodules, options)},
                   options)


def _param_names(model) -> dict:
    return {id(p): _fqn(n) for n, p in model.named_parameters()}


def get_optimizer_state_dict(model, optimizers, *, submodules=None, options=None) -> dict:
    """The optimizers' state dict keyed by parameter names instead of indices, as
    torch's: ``{"state": {fqn: {...}}, "param_groups": [{..., "params": [fqn,
    ...]}]}`` (several optimizers' merged). With ``full_state_dict`` the state
    tensors are whole arrays; with ``flatten_optimizer_state_dict`` one flat dict.
    Collective with ``full_state_dict``, else Local.

    Example: ``osd = get_optimizer_state_dict(model, opt)``.
    """
    options = options or StateDictOptions()
    names = _param_names(model)
    state, groups = {}, []
    for opt in _optimizers(optimizers):
        for group in opt.param_groups:
            fqns = [names[id(p)] for p in group["params"] if id(p) in names]
            for p, fqn in zip(group["params"], fqns):
                if opt.state.get(p):
                    state[fqn] = dict(opt.state[p])
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": fqns})
    osd = _finish({"state": state, "param_groups": groups}, options)
    if options.flatten_optimizer_state_dict and osd:
        osd = _flatten(osd)
    return osd


def get_state_dict(model, optimizers, *, submodules=None, options=None) -> tuple:
    """``(get_model_state_dict(...), get_optimizer_state_dict(...))``, as torch's.

    Example::

        >>> model_sd, optim_sd = get_state_dict(model, opt)
        >>> mpitensor.save({"model": model_sd, "optim": optim_sd}, "ckpt")
    """
    return (get_model_state_dict(model, submodules=submodules, options=options),
            get_optimizer_state_dict(model, optimizers, submodules=submodules,
                                     options=options))


def _flatten(osd: dict) -> dict:
    flat = {}
    for fqn, s in osd["state"].items():
        for k, v in s.items():
            flat[f"state.{fqn}.{k}"] = v
    for g in osd["param_groups"]:
        for fqn in g["params"]:
            for k, v in g.items():
                if k != "params":
                    flat[f"param_groups.{fqn}.{k}"] = v
    return flat


def _unflatten(flat: dict, model, optimizers) -> dict:
    if "state" in flat and "param_groups" in flat:
        return flat
    names = _param_names(model)
    state: dict = {}
    for key, v in flat.items():
        if key.startswith("state."):
            fqn, _, k = key[len("state."):].rpartition(".")
            state.setdefault(fqn, {})[k] = v
    groups = []
    for opt in _optimizers(optimizers):
        for group in opt.param_groups:
            fqns = [names[id(p)] for p in group["params"]]
            hyper = {k[len(f"param_groups.{fqns[0]}."):]: v for k, v in flat.items()
                     if fqns and k.startswith(f"param_groups.{fqns[0]}.")}
            groups.append({**hyper, "params": fqns})
    return {"state": state, "param_groups": groups}


# -- loading ---------------------------------------------------------------------------

def _mesh_of(model):
    mesh = next((p.device_mesh for p in model.parameters() if isinstance(p, DTensor)), None)
    if mesh is None:
        raise ValueError("broadcast_from_rank0 needs a model whose parameters are DTensors")
    return mesh


def _from_rank0(value: np.ndarray, like, mesh):
    """Rank 0's array ``value`` (a placeholder of its shape elsewhere) laid out as
    ``like``: a DTensor's mesh and placements, or whole on every rank."""
    if isinstance(like, DTensor):
        return distribute_tensor(np.asarray(value, like.dtype), like.device_mesh,
                                 like.placements, src_data_rank=0)
    whole = distribute_tensor(np.asarray(value), mesh, [Replicate()] * mesh.ndim,
                              src_data_rank=0)
    return whole.to_local()


def _broadcast_structure(mesh, sd: dict) -> dict:
    """Rank 0's state dict on every rank of ``mesh``: its keys and plain values,
    and its arrays as placeholders of their shapes and dtypes (rank 0 keeps its
    own). One broadcast of the structure."""
    def describe(obj):
        if isinstance(obj, dict):
            return {"d": [[k, describe(v)] for k, v in obj.items()]}
        if isinstance(obj, (list, tuple)):
            return {"l" if isinstance(obj, list) else "t": [describe(v) for v in obj]}
        if isinstance(obj, (np.ndarray, np.generic, DTensor)):
            return {"a": [list(obj.shape), obj.dtype.str]}
        return {"v": obj}

    def rebuild(node):
        (kind, body), = node.items()
        if kind == "d":
            return {k: rebuild(v) for k, v in body}
        if kind in ("l", "t"):
            items = [rebuild(v) for v in body]
            return items if kind == "l" else tuple(items)
        if kind == "a":
            return np.empty(tuple(body[0]), np.dtype(body[1]))
        return body

    text = _agree.first_rank(mesh, lambda: json.dumps(describe(sd)).encode(), cap=1 << 16)
    return sd if _first_rank() else rebuild(json.loads(text))


def set_model_state_dict(model, model_state_dict: dict, *, options=None) -> IncompatibleKeys:
    """Loads a state dict by fully qualified names (what ``get_model_state_dict``
    gave, of this model wrapped or parallelized otherwise, or from another mesh;
    DTensors or whole arrays) into the model's parameters and buffers, each
    keeping its placements. With ``broadcast_from_rank0`` only rank 0 passes the
    (full) state dict; each array is scattered from it. Returns
    ``(missing_keys, unexpected_keys)``. Collective on the parameters' meshes.

    Example: ``set_model_state_dict(model, mpitensor.load("ckpt/model"))``.
    """
    options = options or StateDictOptions()
    own = {_fqn(k): k for k in model.state_dict()}
    values = model.state_dict()
    sd = model_state_dict
    if options.broadcast_from_rank0:
        mesh = _mesh_of(model)
        sd = {fqn: _from_rank0(v, values[own[fqn]], mesh)
              if fqn in own and isinstance(v, (np.ndarray, DTensor)) else v
              for fqn, v in _broadcast_structure(mesh, sd).items()}
    renamed = {own.get(fqn, fqn): v for fqn, v in sd.items()}
    missing, unexpected = model.load_state_dict(renamed, strict=options.strict)
    back = {k: f for f, k in own.items()}
    return IncompatibleKeys([back.get(k, k) for k in missing], [_fqn(k) for k in unexpected])


def set_optimizer_state_dict(model, optimizers, optim_state_dict: dict, *,
                             options=None) -> None:
    """Loads an optimizer state dict keyed by parameter names (what
    ``get_optimizer_state_dict`` gave, flat or not, DTensors or whole arrays)
    into the optimizers, each state tensor laid out as its parameter. With
    ``broadcast_from_rank0`` only rank 0 passes it. Collective on the
    parameters' meshes.

    Example: ``set_optimizer_state_dict(model, opt, mpitensor.load("ckpt/optim"))``.
    """
    options = options or StateDictOptions()
    opts = _optimizers(optimizers)
    names = _param_names(model)
    osd = optim_state_dict
    mesh = _mesh_of(model) if options.broadcast_from_rank0 else None
    if mesh is not None:
        osd = _broadcast_structure(mesh, osd)
    osd = _unflatten(osd, model, opts)
    groups = iter(osd["param_groups"])
    for opt in opts:
        index: dict = {}
        packed_groups = []
        for group in opt.param_groups:
            saved = next(groups)
            packed_groups.append({**{k: v for k, v in saved.items() if k != "params"},
                                  "params": [index.setdefault(id(p), len(index))
                                             for p in group["params"]]})
        state = {}
        for group in opt.param_groups:
            for p in group["params"]:
                s = osd["state"].get(names.get(id(p)))
                if s is None:
                    continue
                if mesh is not None:
                    s = {k: _from_rank0(v, p if v.shape == tuple(p.shape) else v, mesh)
                         if isinstance(v, np.ndarray) else v for k, v in s.items()}
                state[index[id(p)]] = s
        opt.load_state_dict({"state": state, "param_groups": packed_groups})


def set_state_dict(model, optimizers, *, model_state_dict: dict, optim_state_dict: dict,
                   options=None) -> IncompatibleKeys:
    """``set_model_state_dict`` then ``set_optimizer_state_dict``, as torch's.

    Example::

        >>> sd = mpitensor.load("ckpt")
        >>> set_state_dict(model, opt, model_state_dict=sd["model"],
        ...                optim_state_dict=sd["optim"])
    """
    keys = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return keys
