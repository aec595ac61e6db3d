"""DTensor factories: each rank allocates only its own shard, with no communication.

``requires_grad=True`` makes the new tensor a leaf that autograd records (a
floating-point dtype only), as torch's factories."""

from __future__ import annotations

import numpy as np

from . import _args, _strided, random as _random
from ._dtensor import DTensor
from ._dtensor_spec import DTensorSpec, contiguous_strides
from ._layout import compute_local_shape_and_global_offset

__all__ = ["zeros", "ones", "empty", "full", "rand", "randn"]


def _spec_and_box(size, dtype, device_mesh, placements, what):
    shape = _args.parse_size(size)
    dt = _args.check_dtype(np.float64 if dtype is None else dtype)
    mesh = _args.resolve_mesh(device_mesh)
    pl = _args.normalize_placements(placements, mesh, len(shape))
    _args.reject_partial(pl, what)
    local_shape, offset = compute_local_shape_and_global_offset(shape, mesh, pl)
    return DTensorSpec(mesh, pl, shape, dt, contiguous_strides(shape)), local_shape, offset


def _filled(size, dtype, device_mesh, placements, what, make):
    spec, local_shape, _ = _spec_and_box(size, dtype, device_mesh, placements, what)
    return DTensor(make(local_shape, spec.dtype), spec)


def zeros(*size, dtype=None, device_mesh=None, placements=None,
          requires_grad: bool = False) -> DTensor:
    """A DTensor of zeros; each rank allocates only its shard. Local.

    Example::

        >>> zeros(8, 4, device_mesh=mesh, placements=[Shard(0)]).shape
        (8, 4)
    """
    return _filled(size, dtype, device_mesh, placements, "zeros", np.zeros
                   ).requires_grad_(requires_grad)


def ones(*size, dtype=None, device_mesh=None, placements=None,
         requires_grad: bool = False) -> DTensor:
    """A DTensor of ones; each rank allocates only its shard. Local.

    Example::

        >>> ones((8, 4), device_mesh=mesh).to_local().sum()
        32.0
    """
    return _filled(size, dtype, device_mesh, placements, "ones", np.ones
                   ).requires_grad_(requires_grad)


def empty(*size, dtype=None, device_mesh=None, placements=None,
          requires_grad: bool = False) -> DTensor:
    """A DTensor whose values are uninitialized. Local.

    Example::

        >>> empty(3, device_mesh=mesh, dtype=np.int32).dtype
        dtype('int32')
    """
    return _filled(size, dtype, device_mesh, placements, "empty", np.empty
                   ).requires_grad_(requires_grad)


def full(size, fill_value, *, dtype=None, device_mesh=None, placements=None,
         requires_grad: bool = False) -> DTensor:
    """A DTensor filled with ``fill_value``; dtype inferred from it as NumPy does. Local.

    Example::

        >>> full((2, 2), 7, device_mesh=mesh).dtype
        dtype('int64')
    """
    size = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    return _filled(size, dtype, device_mesh, placements, "full",
                   lambda shape, dt: np.full(shape, fill_value, dt)
                   ).requires_grad_(requires_grad)


def _random_tensor(size, dtype, device_mesh, placements, what, dist) -> DTensor:
    spec, local_shape, offset = _spec_and_box(size, dtype, device_mesh, placements, what)
    if spec.dtype not in _random._DTYPES:
        kinds = ", ".join(map(str, _random._DTYPES))
        raise TypeError(f"{what} makes {kinds} tensors, not {spec.dtype}")
    stream = _random._next_stream()  # every rank advances, members or not
    local = np.empty(local_shape, spec.dtype)
    if spec.mesh.get_coordinate() is not None:  # a 0-d member also has offset ()
        shape = spec.shape
        if _strided.has_strided(spec.placements):
            # A strided part is one box of the expansion, whose elements have the
            # same C-order indices as the tensor's: the same values as a plain one.
            shape, pl, _ = _strided.expand(shape, spec.placements, spec.mesh.shape)
            box, offset = compute_local_shape_and_global_offset(shape, spec.mesh, pl)
            local = local.reshape(box)
        local = _random.fill(local, shape, offset, dist, stream).reshape(local_shape)
    return DTensor(local, spec)


def rand(*size, dtype=None, device_mesh=None, placements=None,
         requires_grad: bool = False) -> DTensor:
    """Uniform [0, 1) values that depend only on the seed and the global index. Local.

    The global tensor is bit-identical on any mesh and placements.

    Example::

        >>> manual_seed(0); a = rand(6, device_mesh=mesh, placements=[Shard(0)])
    """
    return _random_tensor(size, dtype, device_mesh, placements, "rand", _random._UNIFORM
                          ).requires_grad_(requires_grad)


def randn(*size, dtype=None, device_mesh=None, placements=None,
          requires_grad: bool = False) -> DTensor:
    """Standard normal values that depend only on the seed and the global index. Local.

    Example::

        >>> manual_seed(0); a = randn(6, 6, device_mesh=mesh, placements=[Shard(1)])
    """
    return _random_tensor(size, dtype, device_mesh, placements, "randn", _random._NORMAL
                          ).requires_grad_(requires_grad)
