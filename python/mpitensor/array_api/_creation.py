"""The array API standard's creation functions, building DTensors.

Where an array is made: on the mesh given as ``device=``, else the innermost
``with mesh:``, else the world (every process of ``MPI.COMM_WORLD`` as a 1-D mesh,
made at the first creation call), so that a plain ``python script.py`` and an
``mpiexec`` run of it both work and give the same values. A new array is cut along
its first dim (``Shard(0)`` on every mesh dim, so each rank holds its own rows); a
0-d array is replicated. Each rank takes its own part of what it is given: nothing
moves.
"""

from __future__ import annotations

import numpy as np

from .. import _args, _device, _factories
from .._distribute import distribute_tensor
from .._dtensor import DTensor
from ..device_mesh import DeviceMesh, _mesh_stack, init_device_mesh
from ..placement_types import Replicate, Shard

__all__ = ["default_mesh", "default_placements", "arange", "array", "asanyarray", "asarray",
           "asarray_chkfinite", "ascontiguousarray", "asfortranarray", "empty",
           "empty_like", "eye", "from_dlpack", "full", "full_like", "identity", "linspace",
           "ones", "ones_like", "require", "zeros", "zeros_like"]

_world_mesh: DeviceMesh | None = None


def default_mesh(device=None) -> DeviceMesh:
    """The mesh a creation function builds on: ``device`` when it is a DeviceMesh or
    an array's device (``x.device``: its mesh), else the innermost ``with mesh:``,
    else the world as a 1-D mesh. ``device`` may also be the standard's device
    (``"cpu"``, ``mpitensor.device("cpu")``), which says nothing about the mesh.
    Collective the first time the world mesh is made (every rank must call it),
    Local after.

    Example::

        >>> with mesh:
        ...     default_mesh() is mesh
        True
    """
    global _world_mesh
    if isinstance(device, DeviceMesh):
        return device
    if _device.mesh_of(device) is not None:  # an array's device: its mesh
        return _device.mesh_of(device)
    if device is not None:
        _device.device(device)  # ValueError for a device that is not the CPU
    if _mesh_stack:
        return _mesh_stack[-1]
    if _world_mesh is None:
        from mpi4py import MPI  # imported here so that importing mpitensor does not start MPI

        _world_mesh = init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
    return _world_mesh


def default_placements(mesh: DeviceMesh, ndim: int) -> tuple:
    """``Shard(0)`` on every mesh dim for an array of one dim or more, Replicate for a
    0-d one. Local.

    Example: ``default_placements(mesh, 2) == (Shard(0),)`` on a 1-D mesh.
    """
    return ((Shard(0) if ndim else Replicate()),) * mesh.ndim


def _placed(shape, device):
    mesh = default_mesh(device)
    ndim = 1 if isinstance(shape, (int, np.integer)) else len(tuple(shape))
    return mesh, default_placements(mesh, ndim)


def _distributed(arr: np.ndarray, device) -> DTensor:
    mesh = default_mesh(device)
    return distribute_tensor(arr, mesh, default_placements(mesh, arr.ndim), src_data_rank=None)


def asarray(obj, /, *, dtype=None, device=None, copy=None) -> DTensor:
    """The standard's ``asarray``: a DTensor of ``obj`` (a DTensor, scalar, nested
    sequence, buffer or ndarray, as ``np.asarray`` takes them). A DTensor keeps its
    mesh and placements (cast if ``dtype`` differs); anything else is cut along its
    first dim, each rank keeping its part; an ndarray's part is a view of it unless
    ``copy=True`` (then each rank copies its part alone). Values a DTensor cannot hold (dates, times, strings, objects)
    stay NumPy's array, as NumPy's namespace gives them: xarray hands its
    coordinates over so (``idxmax``). Local.

    Example::

        >>> asarray([[1, 2], [3, 4]]).placements
        (Shard(dim=0),)
    """
    if isinstance(obj, DTensor):
        if isinstance(device, DeviceMesh) and device != obj.device_mesh:
            raise ValueError(f"the array lives on {obj.device_mesh}, not on {device}")
        if dtype is None or np.dtype(dtype) == obj.dtype:
            return obj.copy() if copy else obj
        if copy is False:
            raise ValueError("casting to another dtype needs a copy, and copy=False")
        return obj.astype(dtype)
    if isinstance(obj, (list, tuple)) and _holds_dtensor(obj):
        obj = _gathered_sequence(obj)
    elif not isinstance(obj, np.ndarray) and hasattr(obj, "__dlpack__") \
            and not hasattr(obj, "__array__"):
        obj = np.from_dlpack(obj, copy=copy)
    # copy= as np.asarray takes it in NumPy 2; NumPy 1.x's asarray has no copy=.
    arr = np.asarray(obj, dtype=dtype, **({} if copy is None else {"copy": copy and None}))
    if not _args.holds(arr.dtype):
        return arr.copy() if copy and arr is obj else arr
    out = _distributed(arr, device)
    if copy:
        # Each rank copies its own rows only, into an array its DTensor alone holds
        # (which a where may then defer on: mpitensor._ops._deferring).
        out = DTensor(out._local_tensor.copy(), out._spec)
    return out


def array(object, dtype=None, *, copy=True, order="K", subok=False, ndmin=0,  # noqa: A002
          device=None) -> DTensor:
    """NumPy's ``array``, making a DTensor: of a DTensor, that DTensor (a copy
    unless ``copy`` says otherwise, cast to ``dtype``, with leading dims of one up
    to ``ndmin``), placements kept; of anything else, NumPy's array of it cut as
    :func:`asarray` cuts. ``order`` and ``subok`` are NumPy's for the array NumPy
    makes (a DTensor's parts are its own). Local.

    Example: ``array([1, 2, 3], ndmin=2).shape == (1, 3)``.
    """
    if not isinstance(object, DTensor):
        if isinstance(object, (list, tuple)) and _holds_dtensor(object):
            object = _gathered_sequence(object)
        return _distributed(np.array(object, dtype=dtype, copy=copy, order=order,
                                     subok=subok, ndmin=ndmin), device)
    out = asarray(object, dtype=dtype, device=device, copy=copy)
    if ndmin > out.ndim:
        out = out.reshape((1,) * (ndmin - out.ndim) + out.shape)
    return out


def asanyarray(a, dtype=None, order=None, *, device=None, copy=None) -> DTensor:
    """NumPy's ``asanyarray``: :func:`asarray` (a DTensor is no NumPy subclass to
    keep; ``order`` is NumPy's for the array it makes of other objects). Local.

    Example: ``asanyarray(x) is x`` for a DTensor ``x``.
    """
    if not isinstance(a, DTensor) and order is not None:
        a = np.asarray(a, order=order)
    return asarray(a, dtype=dtype, device=device, copy=copy)


def _at_least_1d(numpy_func, a, dtype):
    if not isinstance(a, DTensor):
        return _distributed(numpy_func(a, dtype=dtype), None)
    out = asarray(a, dtype=dtype)
    return out.reshape((1,)) if out.ndim == 0 else out


def ascontiguousarray(a, dtype=None) -> DTensor:
    """NumPy's ``ascontiguousarray``: :func:`asarray`, of at least one dim as
    NumPy's (a DTensor's parts are NumPy's C-ordered arrays). Local.

    Example: ``ascontiguousarray(5).shape == (1,)``.
    """
    return _at_least_1d(np.ascontiguousarray, a, dtype)


def asfortranarray(a, dtype=None) -> DTensor:
    """NumPy's ``asfortranarray``: :func:`asarray`, of at least one dim as NumPy's
    (the memory order of a DTensor's parts is not the global array's). Local.

    Example: ``asfortranarray([[1, 2], [3, 4]]).shape == (2, 2)``.
    """
    return _at_least_1d(np.asfortranarray, a, dtype)


def asarray_chkfinite(a, dtype=None, order=None) -> DTensor:
    """NumPy's ``asarray_chkfinite``: :func:`asarray`, or NumPy's ValueError on
    every rank when an element is an infinity or a NaN. Collective for a DTensor
    (one all-reduce of whether its parts are finite); Local otherwise.

    Example: ``asarray_chkfinite([1.0, np.nan])`` raises ValueError.
    """
    if not isinstance(a, DTensor):
        return _distributed(np.asarray_chkfinite(a, dtype=dtype, order=order), None)
    out = asarray(a, dtype=dtype)
    if out.dtype.kind in "fc" and not bool(np.all(np.isfinite(out))):
        raise ValueError("array must not contain infs or NaNs")
    return out


def require(a, dtype=None, requirements=None) -> DTensor:
    """NumPy's ``require``: :func:`asarray` cast to ``dtype``; the ``requirements``
    (memory order, alignment, writeability, own data) are NumPy's for the array it
    makes of other objects, a DTensor's parts being NumPy's own arrays. Local.

    Example: ``require(x, dtype=np.float32).dtype == np.float32``.
    """
    if not isinstance(a, DTensor):
        return _distributed(np.require(a, dtype=dtype, requirements=requirements), None)
    return asarray(a, dtype=dtype)


def identity(n, dtype=None, *, device=None) -> DTensor:
    """NumPy's ``identity``: :func:`eye` of ``n`` rows, float64 unless ``dtype``.
    Local.

    Example: ``identity(3).full_tensor()`` is ``np.identity(3)``.
    """
    return eye(n, dtype=np.float64 if dtype is None else dtype, device=device)


def _holds_dtensor(obj) -> bool:
    return any(isinstance(o, DTensor) or (isinstance(o, (list, tuple)) and _holds_dtensor(o))
               for o in obj)


def _gathered_sequence(obj):
    # A sequence of (0-d) DTensors is the standard's nested sequence of scalars:
    # each becomes the value every rank reads from it.
    return [(_gathered_sequence(o) if isinstance(o, (list, tuple)) else
             o.full_tensor() if isinstance(o, DTensor) else o) for o in obj]


def from_dlpack(x, /, *, device=None, copy=None) -> DTensor:
    """The standard's ``from_dlpack``: a DTensor of any object that exports DLPack.
    A DTensor comes back as itself (a copy with ``copy=True``); another object is
    read as ``np.from_dlpack`` reads it (the whole array, on every rank) and cut as
    :func:`asarray` cuts it, each rank keeping its part. Local.

    Example::

        >>> from_dlpack(np.arange(4)).shape
        (4,)
    """
    if isinstance(x, DTensor):
        return asarray(x, device=device, copy=copy)
    arr = np.from_dlpack(x, copy=copy)
    return _distributed(arr, device)


def zeros(shape, *, dtype=None, device=None) -> DTensor:
    """The standard's ``zeros``: each rank allocates only its part. Local.

    Example: ``zeros((4, 2)).placements == (Shard(dim=0),)`` on a 1-D mesh.
    """
    mesh, pl = _placed(shape, device)
    return _factories.zeros(shape, dtype=dtype, device_mesh=mesh, placements=pl)


def ones(shape, *, dtype=None, device=None) -> DTensor:
    """The standard's ``ones``: each rank allocates only its part. Local.

    Example: ``ones(5, dtype=int8).dtype == np.int8``.
    """
    mesh, pl = _placed(shape, device)
    return _factories.ones(shape, dtype=dtype, device_mesh=mesh, placements=pl)


def empty(shape, *, dtype=None, device=None) -> DTensor:
    """The standard's ``empty``: uninitialized values; each rank allocates only its
    part. Local.

    Example: ``empty((3, 3)).shape == (3, 3)``.
    """
    mesh, pl = _placed(shape, device)
    return _factories.empty(shape, dtype=dtype, device_mesh=mesh, placements=pl)


def full(shape, fill_value, *, dtype=None, device=None) -> DTensor:
    """The standard's ``full``: dtype inferred from ``fill_value`` as NumPy does.
    Local.

    Example: ``full(4, True).dtype == np.bool_``.
    """
    mesh, pl = _placed(shape, device)
    if isinstance(fill_value, DTensor):
        fill_value = fill_value.full_tensor()[()]
    return _factories.full(shape, fill_value, dtype, device_mesh=mesh, placements=pl)


def arange(start, /, stop=None, step=1, *, dtype=None, device=None) -> DTensor:
    """The standard's ``arange``: NumPy's values, each rank computing its own. Local.

    Example: ``arange(5).full_tensor()`` is ``array([0, 1, 2, 3, 4])``.
    """
    mesh = default_mesh(device)
    return _factories.arange(start, stop, step, dtype, device_mesh=mesh,
                             placements=default_placements(mesh, 1))


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True) -> DTensor:
    """The standard's ``linspace``: NumPy's values, each rank computing its own.
    Local.

    Example: ``linspace(0, 1, 5).full_tensor()`` is ``array([0., .25, .5, .75, 1.])``.
    """
    mesh = default_mesh(device)
    return _factories.linspace(start, stop, num, endpoint=endpoint, dtype=dtype,
                               device_mesh=mesh, placements=default_placements(mesh, 1))


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None) -> DTensor:
    """The standard's ``eye``: ones on the ``k``-th diagonal. Local.

    Example: ``eye(3).shape == (3, 3)``.
    """
    mesh = default_mesh(device)
    return _factories.eye(n_rows, n_cols, k, np.float64 if dtype is None else dtype,
                          device_mesh=mesh, placements=default_placements(mesh, 2))


def _like(make, x, dtype, device, *fill):
    if not isinstance(x, DTensor):
        x = asarray(x, device=device)
    device = _device.mesh_of(device) or device
    if isinstance(device, DeviceMesh) and device != x.device_mesh:
        mesh = device
        return make(x, *fill, dtype, device_mesh=mesh,
                    placements=default_placements(mesh, x.ndim))
    if device is not None and not isinstance(device, DeviceMesh):
        _device.device(device)
    return make(x, *fill, dtype)


def zeros_like(x, /, *, dtype=None, device=None) -> DTensor:
    """The standard's ``zeros_like``: zeros laid out as ``x`` (its mesh and
    placements, a Partial made Replicate). Local.

    Example: ``zeros_like(x).placements == x.placements``.
    """
    return _like(_factories.zeros_like, x, dtype, device)


def ones_like(x, /, *, dtype=None, device=None) -> DTensor:
    """The standard's ``ones_like``, laid out as ``x``. Local.

    Example: ``ones_like(x, dtype=float32).dtype == np.float32``.
    """
    return _like(_factories.ones_like, x, dtype, device)


def empty_like(x, /, *, dtype=None, device=None) -> DTensor:
    """The standard's ``empty_like``, laid out as ``x``. Local.

    Example: ``empty_like(x).shape == x.shape``.
    """
    return _like(_factories.empty_like, x, dtype, device)


def full_like(x, /, fill_value, *, dtype=None, device=None) -> DTensor:
    """The standard's ``full_like``, laid out as ``x``. Local.

    Example: ``full_like(x, 7)`` has ``x``'s dtype, as NumPy's.
    """
    return _like(_factories.full_like, x, dtype, device, fill_value)
