"""Experimental APIs, as torch.distributed.tensor.experimental: ``local_map``,
``implicit_replication``, ``register_sharding`` and ``context_parallel``.
Subject to change."""

from . import _implicit
from ._context_parallel import (context_parallel, context_parallel_unshard,
                                set_rotate_method)
from ._implicit import implicit_replication
from ._local_map import local_map
from ._register_sharding import clear_sharding_registry, register_sharding

__all__ = ["local_map", "implicit_replication", "register_sharding",
           "clear_sharding_registry", "context_parallel", "context_parallel_unshard",
           "set_rotate_method"]
