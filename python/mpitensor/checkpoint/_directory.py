"""A state_dict as a directory: one .npy per entry and an index.json that records
each entry's file, shape, dtype and the placements and mesh it was saved with.

index.json is written last, atomically, by the first rank, once every entry's file
is in place; a reader trusts only what it lists.
"""

from __future__ import annotations

import json
import os
import urllib.parse

import numpy as np

from .._api import DTensor
from ..placement_types import Replicate, Shard
from . import _agree, _npy, _tensor

INDEX = "index.json"
FORMAT = "mpitensor-checkpoint"
VERSION = 1


def file_name(name: str) -> str:
    """A file name for a state_dict key; dotted module paths stay readable."""
    if not isinstance(name, str) or name in ("", ".", ".."):
        raise ValueError(f"state_dict keys must be non-empty strings, got {name!r}")
    return urllib.parse.quote(name, safe="._-") + ".npy"


def placement_to_json(p) -> str:
    return f"S({p.dim})" if isinstance(p, Shard) else "R"


def placement_from_json(text: str):
    if text == "R":
        return Replicate()
    if text.startswith("S(") and text.endswith(")"):
        return Shard(int(text[2:-1]))
    raise ValueError(f"unknown placement {text!r} in {INDEX}")


def _make_dir(path: str) -> bytes:
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"cannot save a state_dict to {path!r}: it is a file")
    os.makedirs(path, exist_ok=True)
    return b""


def _write_index(path: str, index: dict) -> bytes:
    tmp = os.path.join(path, f".{INDEX}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1)
    os.replace(tmp, os.path.join(path, INDEX))
    return b""


def _entry(name: str, value, mesh) -> DTensor:
    """A state_dict value as a DTensor: an ndarray (or NumPy scalar) is taken to be
    the same on every rank and is written by the first."""
    if isinstance(value, DTensor):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        return DTensor.from_local(arr, mesh, [Replicate()] * mesh.ndim)
    raise TypeError(f"state_dict entry {name!r} is a {type(value).__name__}; save takes "
                    f"DTensors and NumPy arrays")


def _save_entry(dt: DTensor, file: str, mesh) -> tuple:
    """Collective on ``mesh``. Writes one entry; returns the placements written.

    An entry on a slice (``mesh["tp"]``) is written by the first slice only: the
    others hold the same values. The first rank of ``mesh`` is in that slice, so
    its outcome, broadcast, makes every rank raise or none (the other slices must
    not go on into the next entry's collectives while the first one has failed).
    """
    if dt.device_mesh._get_root_mesh() is dt.device_mesh:
        return _tensor.save_dtensor(dt, file)
    failure = None
    if dt.device_mesh._first_slice:
        try:
            _tensor.save_dtensor(dt, file)
        except Exception as e:  # noqa: BLE001 - raised on every rank just below
            failure = e

    def outcome() -> bytes:
        if failure is not None:
            raise failure
        return b""

    _agree.first_rank(mesh, outcome)
    return _tensor.written_placements(dt.placements)


def save_dict(state: dict, path: str, mesh) -> None:
    """Collective on ``mesh`` (which holds every DTensor's mesh members)."""
    entries = {name: _entry(name, value, mesh) for name, value in state.items()}
    files = {name: file_name(name) for name in entries}
    _agree.first_rank(mesh, lambda: _make_dir(path))
    index = {"format": FORMAT, "version": VERSION, "entries": {}}
    for name, dt in entries.items():
        written = _save_entry(dt, os.path.join(path, files[name]), mesh)
        index["entries"][name] = {
            "file": files[name], "shape": list(dt.shape), "dtype": _npy.descr(dt.dtype),
            "kind": "dtensor" if isinstance(state[name], DTensor) else "ndarray",
            "placements": [placement_to_json(p) for p in written],
            "saved_placements": [repr(p) for p in dt.placements],
            "mesh_shape": list(dt.device_mesh.shape),
            "mesh_dim_names": dt.device_mesh.mesh_dim_names,
        }
    _agree.first_rank(mesh, lambda: _write_index(path, index))


def _read_index(path: str) -> bytes:
    with open(os.path.join(path, INDEX), "rb") as f:
        return f.read()


def read_index(mesh, path: str) -> dict:
    """Collective on the mesh: the parsed index, the same on every rank."""
    index = json.loads(_agree.first_rank(mesh, lambda: _read_index(path), outsiders=True))
    if index.get("format") != FORMAT or not isinstance(index.get("entries"), dict):
        raise ValueError(f"{os.path.join(path, INDEX)!r} is not an mpitensor "
                         f"checkpoint index")
    return index


def _placements_for(name: str, entry: dict, mesh, placements):
    if isinstance(placements, dict):
        placements = placements.get(name)
    if placements is not None:
        return placements
    saved = [placement_from_json(t) for t in entry["placements"]]
    # The saved layout is kept when it fits this mesh; otherwise replicate.
    if len(saved) == mesh.ndim and list(entry["mesh_shape"]) == list(mesh.shape):
        return saved
    return None


def _check_entry(name: str, entry: dict, head, file: str) -> None:
    if list(head.shape) != list(entry["shape"]) or _npy.descr(head.dtype) != entry["dtype"]:
        raise ValueError(f"{file!r} holds {head.shape} {head.dtype}, but the index says "
                         f"{tuple(entry['shape'])} {entry['dtype']} for {name!r}")


def load_dict(path: str, mesh, placements, like) -> dict:
    """Collective on ``mesh``. Every entry of the checkpoint, DTensors on ``mesh``
    (or on the mesh of the matching entry of ``like``) and ndarrays."""
    index = read_index(mesh, path)
    names = list(index["entries"])
    if like is not None:
        _check_keys(set(names), set(like), path)
    out = {}
    for name in names:
        entry = index["entries"][name]
        file = os.path.join(path, entry["file"])
        head = _tensor.read_header(mesh, file)
        _check_entry(name, entry, head, file)
        out[name] = _load_entry(name, entry, head, file, mesh, placements, like)
    return out


def _load_entry(name, entry, head, file, mesh, placements, like):
    if like is not None:
        return _tensor.load_like(head, file, like[name], mesh)
    if entry["kind"] == "ndarray":
        return _tensor.load_dtensor(head, file, mesh, None).to_local()
    return _tensor.load_dtensor(head, file, mesh, _placements_for(name, entry, mesh,
                                                                  placements))


def _check_keys(saved: set, wanted: set, path: str) -> None:
    missing, unexpected = sorted(wanted - saved), sorted(saved - wanted)
    if missing or unexpected:
        raise KeyError(f"the checkpoint {path!r} does not match the state_dict: missing "
                       f"keys {missing}, unexpected keys {unexpected}")
