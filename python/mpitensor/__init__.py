"""mpitensor: torch.distributed.tensor's DTensor for NumPy arrays, on MPI.

Example (``mpiexec -n 4 python script.py``)::

    import numpy as np
    import mpitensor as mt

    mesh = mt.init_device_mesh("cpu", (4,))
    x = mt.DTensor.from_local(np.ones((2, 3)), mesh, [mt.Shard(0)])
    print(x.shape)  # (8, 3) on every rank
"""

import os as _os

from . import _C, _comm, _dtypes, _ops  # _ops fills the registry DTensor's operations are found in
from ._dtensor import DTensor
from ._device import device
from ._distribute import distribute_tensor
from ._distribute_module import distribute_module
from ._factories import (arange, empty, empty_like, eye, full, full_like, identity,
                         linspace, logspace, ones, ones_like, rand, rand_like, randn,
                         randn_like, tri, zeros, zeros_like)
from ._layout import compute_local_shape_and_global_offset, local_shape_and_global_offset
from ._modes import set_gather_warning
from ._ops._fallback import GatherWarning, strict
from .device_mesh import DeviceMesh, init_device_mesh, set_cache_limits
from .placement_types import Partial, Placement, Replicate, Shard
from .random import get_rng_state, manual_seed, set_rng_state
from . import autograd
from .autograd import enable_grad, no_grad
from . import nn
from . import optim
from . import checkpoint
from .checkpoint import async_save, load, save
from .checkpoint._xarray import open_dataset, to_netcdf, to_zarr
from . import parallel
from . import fsdp
from . import testing
from . import utils
from . import debug
from . import array_api

from ._version import __version__
from ._show_config import show_config

# Freed large output and staging blocks are kept resident for reuse (see
# csrc/include/mpitensor/comm/pool.h); MPITENSOR_POOL_BYTES caps them, 0 turns it off.
if _os.environ.get("MPITENSOR_POOL_BYTES"):
    _comm.pool_set_limit(int(_os.environ["MPITENSOR_POOL_BYTES"]))

# MPITENSOR_LOGS=+dtensor (debug lines) and MPITENSOR_CHECK=1 (collective mismatch
# detection); see mpitensor.debug.
from . import _logging
from .debug import _collective_check

_logging.configure_from_environment()
_collective_check.configure_from_environment()

__all__ = [
    "DTensor",
    "device",
    "distribute_tensor",
    "distribute_module",
    "DeviceMesh",
    "init_device_mesh",
    "set_cache_limits",
    "set_gather_warning",
    "GatherWarning",
    "strict",
    "Placement",
    "Shard",
    "Replicate",
    "Partial",
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
    "arange",
    "linspace",
    "logspace",
    "eye",
    "identity",
    "tri",
    "manual_seed",
    "get_rng_state",
    "set_rng_state",
    "compute_local_shape_and_global_offset",
    "local_shape_and_global_offset",
    "autograd",
    "no_grad",
    "enable_grad",
    "nn",
    "optim",
    "checkpoint",
    "save",
    "async_save",
    "load",
    "to_netcdf",
    "to_zarr",
    "open_dataset",
    "parallel",
    "fsdp",
    "testing",
    "utils",
    "show_config",
    "array_api",
]


def __getattr__(name: str):
    """``mpitensor.bfloat16``: ml_dtypes' bfloat16 dtype, as ``torch.bfloat16``
    (ImportError naming ml_dtypes when it is not installed). Local.

    Example: ``MixedPrecisionPolicy(param_dtype=mt.bfloat16)``.
    """
    if name == "bfloat16":
        return _dtypes.require_bfloat16()
    raise AttributeError(f"module 'mpitensor' has no attribute {name!r}")
