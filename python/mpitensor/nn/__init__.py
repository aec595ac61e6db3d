"""A small NumPy module system in torch.nn's shapes, for DTensors and ndarrays.

Parameters are ndarrays or DTensors and every layer's forward works on both, so
the same model runs as one plain process or tensor-parallel over MPI ranks after
:func:`mpitensor.parallel.parallelize_module` or :func:`mpitensor.distribute_module`.
Initialisation draws from mpitensor's generator: reproducible with
:func:`mpitensor.manual_seed`.

Example::

    >>> import mpitensor as mt
    >>> mt.manual_seed(0)
    >>> mlp = mt.nn.Sequential(mt.nn.Linear(8, 32), mt.nn.GELU(), mt.nn.Linear(32, 8))
    >>> mlp(np.ones((4, 8))).shape
    (4, 8)
"""

from . import functional, init, utils
from .activation import GELU, ReLU, SiLU
from .attention import MultiheadAttention
from .container import ModuleList, Sequential
from .dropout import Dropout
from .embedding import Embedding
from .linear import Linear
from .module import (Module, Parameter, RemovableHandle, register_module_forward_hook,
                     register_module_forward_pre_hook, register_module_full_backward_hook,
                     register_module_full_backward_pre_hook)
from .normalization import LayerNorm, RMSNorm
from .transformer import FeedForward, TransformerBlock

__all__ = ["functional", "init", "utils", "Module", "Parameter", "RemovableHandle", "Linear",
           "Embedding", "LayerNorm", "RMSNorm", "Dropout", "GELU", "ReLU", "SiLU", "Sequential",
           "ModuleList",
           "MultiheadAttention", "FeedForward", "TransformerBlock",
           "register_module_forward_pre_hook", "register_module_forward_hook",
           "register_module_full_backward_pre_hook", "register_module_full_backward_hook"]
