"""``async_save``: a save that writes while training goes on, as torch's DCP
``async_save``.

At the call, every DTensor's local array (and every ndarray) is copied: the
values saved are those of the call, whatever the program writes afterwards. The
copies are saved by one worker thread per process through the ordinary ``save``,
on meshes of its own: a mesh's collectives run on the thread that made it, so the
worker makes, once, a mesh of the same ranks and dim names for each mesh it meets
(collectively, its first save on that mesh). The workers of the ranks run the
saves in the order the program made them, so their collectives pair, on
communicators the program's never meet. Once the future's ``result()`` returns,
the file is what ``save`` would have left: whole, replaced at once, synced.
"""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np

from .._dtensor import DTensor
from ..device_mesh import DeviceMesh

__all__ = ["start"]

_lock = threading.Lock()
_executor: list = []  # the worker, made at the first async_save
_meshes: dict = {}    # the worker's meshes, by the program's mesh's ranks and names


def start(save, obj, path, kwargs: dict) -> concurrent.futures.Future:
    """``save(obj, path, **kwargs)`` of a copy of ``obj``, on the worker thread:
    mpitensor.async_save. Local."""
    if not isinstance(obj, (DTensor, dict)):
        raise TypeError(f"async_save takes a DTensor or a dict of DTensors and ndarrays, "
                        f"got {type(obj).__name__}")
    staged = _stage(obj)
    device_mesh = kwargs.pop("device_mesh", None)
    with _lock:
        if not _executor:
            _executor.append(concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="mpitensor-async-save"))
        return _executor[0].submit(_save, save, staged, path, device_mesh, kwargs)


class _Staged:
    """A DTensor's copy, to be made a DTensor again on the worker's mesh."""

    __slots__ = ("local", "mesh", "placements", "shape", "stride")

    def __init__(self, dt: DTensor):
        self.local = np.array(dt.to_local(), copy=True)
        self.mesh, self.placements = dt.device_mesh, dt.placements
        self.shape, self.stride = dt.shape, dt.stride()


def _stage(obj):
    if isinstance(obj, DTensor):
        return _Staged(obj)
    if isinstance(obj, dict):
        return {k: _stage(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_stage(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return obj.copy()
    return obj


def _save(save, staged, path, device_mesh, kwargs) -> None:
    obj = _unstage(staged)
    if device_mesh is not None:
        kwargs["device_mesh"] = _worker_mesh(device_mesh)
    save(obj, path, **kwargs)


def _unstage(obj):
    if isinstance(obj, _Staged):
        return DTensor.from_local(obj.local, _worker_mesh(obj.mesh), obj.placements,
                                  shape=obj.shape, stride=obj.stride)
    if isinstance(obj, dict):
        return {k: _unstage(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unstage(v) for v in obj)
    return obj


def _worker_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The worker's mesh of ``mesh``'s ranks and dim names (a slice: the same
    slice of the worker's copy of its root). Made on the worker thread."""
    root = mesh._get_root_mesh()
    key = (tuple(root.mesh.shape), tuple(root.mesh.reshape(-1).tolist()),
           root.mesh_dim_names)
    mine = _meshes.get(key)
    if mine is None:
        mine = _meshes[key] = DeviceMesh(root.device_type, root.mesh.tolist(),
                                         mesh_dim_names=root.mesh_dim_names)
    if root is mesh:
        return mine
    if not mesh.mesh_dim_names:
        raise NotImplementedError(
            "async_save of a DTensor on a mesh sliced without dim names; save it with "
            "mpitensor.save")
    return mine[mesh.mesh_dim_names]
