"""Reproducible parameter initialisation from mpitensor's counter-based generator.

Every draw takes the next stream of :mod:`mpitensor.random`, so after
``mpitensor.manual_seed(s)`` the same model built in the same order gets the same
parameters on every rank and in every process, whatever the number of ranks.
"""

from __future__ import annotations

import numpy as np

from .. import random as _random


def _draw(shape, dtype, dist):
    shape = tuple(int(s) for s in shape)
    stream = _random._next_stream()
    out = np.empty(shape, np.dtype(dtype))
    return _random.fill(out, shape, (0,) * len(shape), dist, stream)


def uniform(shape, low: float, high: float, dtype=np.float64) -> np.ndarray:
    """Uniform values in [low, high). Local."""
    return (low + (high - low) * _draw(shape, dtype, _random._UNIFORM)).astype(dtype)


def normal(shape, std: float = 1.0, dtype=np.float64) -> np.ndarray:
    """Normal values with mean 0 and standard deviation ``std``. Local."""
    return (std * _draw(shape, dtype, _random._NORMAL)).astype(dtype)
