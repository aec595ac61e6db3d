"""A state_dict as a directory: one .npy per entry and an index.json (_index.py)
that names each entry's file, shape, dtype and the placements and mesh it was
saved with.

A save is all or nothing as ``load`` sees it. Entries are written under names
the current index does not use (``w.npy``, or ``w+1.npy`` while the index names
``w.npy``), each synced (and the directory once, for all their names), and then
the index is replaced, atomically; only then are the previous save's files
removed. Before any entry is written the first rank lists both saves' files in
PENDING, so what a failed or killed save leaves is removed by the next save of
the directory: every file PENDING lists that the index does not name, with the
temporary files of their saves.
"""

from __future__ import annotations

import json
import os

import numpy as np

from .._dtensor import DTensor
from ..placement_types import Replicate
from . import _agree, _index, _io, _npy, _opened, _paths, _tensor, _tree

PENDING = ".pending.json"


def _make_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"cannot save a state_dict to {path!r}: it is a file")
    os.makedirs(path, exist_ok=True)


def _pending(folder: str) -> list:
    """The file names PENDING lists (plain names in ``folder`` only), or none."""
    try:
        with _paths.open_regular(os.path.join(folder, PENDING)) as f:
            names = json.loads(f.read())
    except (OSError, ValueError):
        return []
    ours = (_index.INDEX, PENDING)
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and n not in ours
            and n not in ("", ".", "..") and os.path.basename(n) == n]


def _tidy(folder: str) -> None:
    """On the first rank: removes the files PENDING lists that the index does not
    name, the temporary files of their saves and of the index, then PENDING. An
    index that does not parse keeps every file. Never raises: what stays is found
    again by the next save."""
    keep, listed = _index.current_files(folder), _pending(folder)
    _paths.remove_leftovers(folder, [*listed, _index.INDEX, PENDING])
    if keep is None:
        return
    for name in [*(n for n in listed if n not in keep), PENDING]:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


def _begin(folder: str, names: list, durable: bool) -> bytes:
    """On the first rank, before a save of entries ``names``: the directory, made or
    tidied; for each entry a file name that the index does not use, whose target
    is absent or a regular file; both saves' files in PENDING. Returns the names as
    JSON."""
    _make_dir(folder)
    _tidy(folder)
    current = _index.current_files(folder) or set()
    files = {n: _index.file_name(n, _index.file_name(n) in current) for n in names}
    _paths.check_targets(folder, list(files.values()))
    listed = sorted(current | set(files.values()))
    _paths.replace_synced(os.path.join(folder, PENDING), json.dumps(listed).encode(),
                          durable)
    return json.dumps(files).encode()


def _commit(folder: str, index: dict, durable: bool) -> bytes:
    """On the first rank, once every entry is written: the directory synced once
    for the names of all the entries (each entry's save synced its file only),
    the index switched to this save, then the previous save's files removed."""
    if durable:
        _paths.sync_dir(folder)
    _index.write(folder, index, durable)
    _tidy(folder)
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


def _save_entry(dt: DTensor, file: str, mesh, durable: bool) -> tuple:
    """Collective on ``mesh``. Writes one entry; returns the placements written.

    An entry on a slice (``mesh["tp"]``) is written by the first slice only: the
    others hold the same values. The first rank of ``mesh`` is in that slice, so
    its outcome, broadcast, makes every rank raise or none (the other slices must
    not go on into the next entry's collectives while the first one has failed).
    """
    if dt.device_mesh._get_root_mesh() is dt.device_mesh:
        return _tensor.save_dtensor(dt, file, durable=durable)
    failure = None
    if dt.device_mesh._first_slice:
        try:
            _tensor.save_dtensor(dt, file, durable=durable)
        except Exception as e:  # noqa: BLE001 - raised on every rank just below
            failure = e

    def outcome() -> bytes:
        if failure is not None:
            raise failure
        return b""

    _agree.first_rank(mesh, outcome)
    return _tensor.written_placements(dt.placements)


def save_dict(state: dict, path: str, mesh, durable: bool = True) -> None:
    """Collective on ``mesh`` (which holds every DTensor's mesh members); ranks
    outside it take no part. A nested dict is saved as its flat entries and the
    index's tree (_tree.py)."""
    state, tree = _tree.flatten(state)
    entries = {name: _entry(name, value, mesh) for name, value in state.items()}
    for name in entries:
        _index.file_name(name)
    if mesh.get_coordinate() is None:
        return
    _agree.same_path(mesh, path)
    files = json.loads(_agree.first_rank(mesh, lambda: _begin(path, list(entries), durable)))
    index = {"format": _index.FORMAT, "version": _index.VERSION, "entries": {}}
    if tree is not None:
        index["tree"] = tree
    try:
        for name, dt in entries.items():
            written = _save_entry(dt, os.path.join(path, files[name]), mesh,
                                  _io.DURABLE_FILE if durable else False)
            index["entries"][name] = {
                "file": files[name], "shape": list(dt.shape), "dtype": _npy.descr(dt.dtype),
                "kind": "dtensor" if isinstance(state[name], DTensor) else "ndarray",
                "placements": [_index.placement_to_json(p) for p in written],
                "saved_placements": [repr(p) for p in dt.placements],
                "mesh_shape": list(dt.device_mesh.shape),
                "mesh_dim_names": dt.device_mesh.mesh_dim_names,
            }
        _agree.first_rank(mesh, lambda: _commit(path, index, durable))
    except BaseException:
        # Every rank raises the same error; the index still names the previous
        # save's files, and this save's are removed.
        if mesh.get_coordinate() == [0] * mesh.ndim:
            _tidy(path)
        raise


def read_index(mesh, path: str) -> dict:
    """Collective on the mesh: the index, checked by the first rank, the same on
    every rank."""
    return json.loads(_agree.first_rank(mesh, lambda: _index.read(path), outsiders=True))


def _placements_for(name: str, entry: dict, mesh, placements):
    if isinstance(placements, dict):
        placements = placements.get(name)
    if placements is not None:
        return placements
    saved = [_index.placement_from_json(t) for t in entry["placements"]]
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
    (or on the mesh of the matching entry of ``like``) and ndarrays, in the nested
    structure it was saved with."""
    index = read_index(mesh, path)
    names = list(index["entries"])
    if like is not None:
        like = _tree.flatten(like)[0]
        _check_keys(set(names), set(like), path)
    out = {}
    for name in names:
        entry = index["entries"][name]
        with _opened.Opened(os.path.join(path, entry["file"])) as file:
            head = _tensor.read_header(mesh, file)
            _check_entry(name, entry, head, file.path)
            out[name] = _load_entry(name, entry, head, file, mesh, placements, like)
    return _tree.rebuild(index["tree"], out) if "tree" in index else out


def _load_entry(name, entry, head, file: _opened.Opened, mesh, placements, like):
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
