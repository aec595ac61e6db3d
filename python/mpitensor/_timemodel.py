"""The calibrated time model: the table ``make calibrate`` writes, loaded per mesh.

Redistribution plans are ranked by predicted time (the C core's time model:
seconds per message, ``alpha``, and per byte, ``beta``, for shared memory within
a node and for the network between nodes; seconds per communicating step,
``call``; seconds per byte a rank copies, ``copy``, or reduces, ``reduce``, in
its own memory). ``benchmarks/calibrate.py`` fits them on this machine and writes
a JSON table; every mesh created afterwards uses it.
The table is read at ``$MPITENSOR_TIME_MODEL`` if set, else at
``$XDG_CACHE_HOME/mpitensor/time_model.json`` (``~/.cache`` by default);
``MPITENSOR_TIME_MODEL=builtin`` ignores any table. Rank 0
of the mesh's communicator reads it and broadcasts what it found, so every rank
plans with the same costs (plans that differed between ranks would pair
different collectives). A missing table means the built-in costs; a table that
cannot be read or is invalid means the built-in costs and a logged warning.
"""

from __future__ import annotations

import json
import logging
import math
import os

from . import _comm

__all__ = ["table_path", "read_table", "model_for"]

log = logging.getLogger("mpitensor")

FORMAT = "mpitensor-time-model"
VERSION = 1
LINKS = ("shm", "net")


def table_path() -> str:
    """Where the calibrated table is read from and written to.

    Example: ``table_path()`` -> ``'/home/me/.cache/mpitensor/time_model.json'``.
    """
    path = os.environ.get("MPITENSOR_TIME_MODEL")
    if path:
        return path
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "mpitensor", "time_model.json")


def _number(value, name: str, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} is {value!r}; it must be a finite number >= 0 "
                         f"({unit})")
    return float(value)


def _cost(table: dict, link: str) -> tuple[float, float]:
    entry = table.get(link)
    if not isinstance(entry, dict):
        raise ValueError(f"it has no {link!r} entry of alpha and beta")
    unit = "seconds per message for alpha, per byte for beta"
    return (_number(entry.get("alpha"), f"{link}.alpha", unit),
            _number(entry.get("beta"), f"{link}.beta", unit))


def read_table(path: str | None = None) -> tuple[float, ...] | None:
    """The (alpha_shm, beta_shm, alpha_net, beta_net, call, copy, reduce) of the
    table at ``path`` (default: ``table_path()``), or None when there is no
    table. ValueError, naming the file and what is wrong, when it cannot be read
    or is invalid. A table measured on one node has no ``net`` entry: the
    built-in network costs stand in, never below shared memory's; without
    ``call``, ``copy`` or ``reduce`` (a table written before they were fitted)
    the built-in ones do.

    Example: ``read_table("/tmp/tm.json")`` ->
    ``(4e-07, 1.1e-10, 2e-05, 8e-10, 2e-06, 1.2e-10, 1.5e-10)``.
    """
    path = table_path() if path is None else path
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"the time model table {path} cannot be read: {e}") from None
    try:
        table = json.loads(text)
        if not isinstance(table, dict) or table.get("format") != FORMAT:
            raise ValueError(f"it is not a {FORMAT!r} table")
        if table.get("version") != VERSION:
            raise ValueError(f"its version is {table.get('version')!r}, "
                             f"this mpitensor reads version {VERSION}")
        builtin = _comm.default_time_model()
        shm = _cost(table, "shm")
        if "net" in table:
            net = _cost(table, "net")
        else:
            net = (max(builtin[2], shm[0]), max(builtin[3], shm[1]))
        if net[0] < shm[0] or net[1] < shm[1]:
            raise ValueError("its network link is faster than shared memory")
        local = tuple(
            _number(table.get(name, builtin[k]), name, unit)
            for k, name, unit in ((4, "call", "seconds per communicating step"),
                                  (5, "copy", "seconds per byte copied"),
                                  (6, "reduce", "seconds per byte reduced")))
    except ValueError as e:
        raise ValueError(f"the time model table {path} is invalid: {e}") from None
    return (shm[0], shm[1], net[0], net[1]) + local


def model_for(comm, mesh) -> None:
    """Gives the mesh ``mesh`` (a ``_comm.Mesh``) the calibrated costs, if any.
    Collective on ``comm``: its rank 0 reads the table and broadcasts the costs,
    or the reason it could not use them, which every rank then logs alike.

    Example: ``model_for(MPI.COMM_WORLD, mesh)`` (DeviceMesh does this).
    """
    found = None
    if comm.Get_rank() == 0 and os.environ.get("MPITENSOR_TIME_MODEL") != "builtin":
        try:
            found = read_table()
        except ValueError as e:
            found = str(e)
    found = comm.bcast(found, root=0)
    if isinstance(found, str):
        log.warning("%s; plans are ranked by the built-in time model", found)
    elif found is not None and _comm.coordinate(mesh) is not None:
        _comm.set_mesh_time_model(mesh, tuple(found) + (0,))
