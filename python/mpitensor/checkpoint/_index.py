"""index.json, the table of contents of a checkpoint directory: for each
state_dict entry, its file, shape, dtype, kind and the placements and mesh it was
saved with.

It is replaced whole (a synced temporary file renamed over it), so a reader sees
one save's index or the previous one's. The first rank reads it and checks all of
it (JSON, every field an entry needs, and each file inside the directory and a
regular file) before any entry is loaded: a malformed or hostile index raises one
error naming the checkpoint, not a KeyError in the middle of a load, a read of a
file outside the directory, or a FIFO that blocks every rank.
"""

from __future__ import annotations

import json
import os
import urllib.parse

from ..placement_types import Replicate, Shard
from . import _npy, _paths, _tree

INDEX = "index.json"
FORMAT = "mpitensor-checkpoint"
VERSION = 1
KINDS = ("dtensor", "ndarray")


def file_name(name: str, alternate: bool = False) -> str:
    """A file name for a state_dict key; dotted module paths stay readable. The
    alternate name ends in "+1.npy" (quoting leaves no other "+" in a name): a save
    takes it for an entry whose first name the current index uses, so it never
    writes over a file of the checkpoint it replaces. Local."""
    if not isinstance(name, str) or name in ("", ".", ".."):
        raise ValueError(f"state_dict keys must be non-empty strings, got {name!r}")
    return urllib.parse.quote(name, safe="._-") + ("+1.npy" if alternate else ".npy")


def placement_to_json(p) -> str:
    return f"S({p.dim})" if isinstance(p, Shard) else "R"


def placement_from_json(text: str):
    if text == "R":
        return Replicate()
    if text.startswith("S(") and text.endswith(")") and text[2:-1].isdigit():
        return Shard(int(text[2:-1]))
    raise ValueError(f"unknown placement {text!r}")


def write(folder: str, index: dict, durable: bool = True) -> None:
    """Replaces the index of ``folder`` whole and syncs it (when ``durable``).
    Local."""
    _paths.replace_synced(os.path.join(folder, INDEX),
                          json.dumps(index, indent=1).encode("utf-8"), durable)


def _ints(value, least: int) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= least for v in value)


def _placements(value) -> bool:
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        return False
    try:
        [placement_from_json(t) for t in value]
    except ValueError:
        return False
    return True


def _dtype(value) -> bool:
    try:
        _npy.dtype_of(value)
    except Exception:  # noqa: BLE001 - whatever NumPy makes of a bad descr
        return False
    return isinstance(value, str)


# What load needs of an entry: each field and what it must be.
_FIELDS = (("file", lambda v: isinstance(v, str) and v != "", "a file name"),
           ("shape", lambda v: _ints(v, 0), "a list of sizes"),
           ("dtype", _dtype, "a NumPy dtype descr"),
           ("kind", lambda v: v in KINDS, f"one of {KINDS}"),
           ("placements", _placements, 'a list of "R" and "S(d)"'),
           ("mesh_shape", lambda v: _ints(v, 1), "a list of sizes"))


def check(index, folder: str) -> None:
    """ValueError, naming the checkpoint, unless ``index`` (parsed JSON) is an index
    whose entries each have every field load needs. Local."""
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ValueError(f"the checkpoint {folder!r} has an {INDEX} that is not an "
                         f"mpitensor checkpoint index")
    if index.get("version") != VERSION:
        raise ValueError(f"the checkpoint {folder!r} has an {INDEX} of version "
                         f"{index.get('version')!r}; this mpitensor reads version "
                         f"{VERSION}")
    entries = index.get("entries")
    if not isinstance(entries, dict):
        raise ValueError(f"the checkpoint {folder!r} has a malformed {INDEX}: "
                         f"'entries' is not an object")
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            raise ValueError(f"the checkpoint {folder!r} has a malformed {INDEX}: entry "
                             f"{name!r} is not an object")
        for field, ok, what in _FIELDS:
            if field not in entry or not ok(entry[field]):
                raise ValueError(f"the checkpoint {folder!r} has a malformed {INDEX}: "
                                 f"entry {name!r} has no {field!r} that is {what}")
    if "tree" in index and not _tree.check(index["tree"], list(entries)):
        raise ValueError(f"the checkpoint {folder!r} has a malformed {INDEX}: its "
                         f"'tree' does not describe its entries")


def _parse(data: bytes, folder: str):
    try:
        return json.loads(data)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"the checkpoint {folder!r} has a malformed {INDEX}: "
                         f"{e}") from None


def read(folder: str) -> bytes:
    """On the first rank: the bytes of the index of ``folder``, after checking it
    and that every file it names lies inside ``folder`` and is a regular file."""
    path = os.path.join(folder, INDEX)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{folder!r} is not a checkpoint: it has no {INDEX}")
    with _paths.open_regular(path) as f:
        data = f.read()
    index = _parse(data, folder)
    check(index, folder)
    for entry in index["entries"].values():
        _paths.inside(folder, entry["file"])
    return data


def current_files(folder: str):
    """On the first rank, before a save: the files that the index of ``folder``
    names; an empty set when there is none, and None when there is one that does
    not parse (nothing is removed on its account then)."""
    path = os.path.join(folder, INDEX)
    if not os.path.lexists(path):
        return set()
    try:
        with _paths.open_regular(path) as f:
            index = _parse(f.read(), folder)
        check(index, folder)
    except (OSError, ValueError):
        return None
    return {entry["file"] for entry in index["entries"].values()}
