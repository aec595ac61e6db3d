"""Experimental APIs, as torch.distributed.tensor.experimental: ``local_map`` and
``implicit_replication``. Subject to change."""

from . import _implicit
from ._implicit import implicit_replication
from ._local_map import local_map

__all__ = ["local_map", "implicit_replication"]
