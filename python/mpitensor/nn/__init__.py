"""Neural-network building blocks for DTensors and plain ndarrays.

So far only :mod:`mpitensor.nn.functional` (softmax, log_softmax)."""

from . import functional

__all__ = ["functional"]
