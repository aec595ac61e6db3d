"""Random DTensors that do not depend on the mesh.

Values come from Philox4x32-10 in the C core, keyed by the seed and counted by each
element's global index, so ``rand`` gives the bit-identical global tensor for every
mesh shape, placement and number of ranks. Each call to a random factory draws a
fresh stream; all ranks call the factories in the same order (SPMD), so their
streams stay in step without communication.
"""

from __future__ import annotations

import numpy as np

from ._bind import core

__all__ = ["manual_seed", "initial_seed", "get_rng_state", "set_rng_state"]

# Fixed, so that every rank starts in step without a broadcast and a run is
# reproducible even when no seed is set.
_DEFAULT_SEED = 0x5EED_0F_D7E75011
_UNIFORM, _NORMAL = 0, 1
# The dtypes rand and randn make (torch's floating and complex types NumPy has).
_DTYPES = tuple(np.dtype(t) for t in ("float16", "float32", "float64", "complex64",
                                     "complex128"))


class _State:
    seed = _DEFAULT_SEED
    stream = 0


def manual_seed(seed: int) -> None:
    """Seed the generator of :func:`rand` and :func:`randn` and restart its streams.

    Local, but call it with the same seed on every rank, like every factory.

    Example::

        >>> manual_seed(42); a = rand(4, 4, device_mesh=mesh, placements=[Shard(0)])
        >>> manual_seed(42); b = rand(4, 4, device_mesh=mesh, placements=[Shard(1)])
        >>> # a.full_tensor() and b.full_tensor() are bit-identical
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed must lie in [0, 2**64), got {seed}")
    _State.seed = int(seed)
    _State.stream = 0


def initial_seed() -> int:
    """The seed in use (the last :func:`manual_seed`, or the fixed default). Local.

    Example: ``manual_seed(42); assert initial_seed() == 42``.
    """
    return _State.seed


def get_rng_state() -> np.ndarray:
    """The generator's state: a uint64 array ``[seed, next stream]``, equal on every
    rank of an SPMD program. Save it with the model (``mpitensor.save({...,
    "rng": get_rng_state()}, dir)``) and give it to :func:`set_rng_state` to
    resume with the same draws, on any mesh (draws do not depend on it). Local.

    Example::

        >>> state = get_rng_state(); a = rand(4, device_mesh=mesh)
        >>> set_rng_state(state); b = rand(4, device_mesh=mesh)  # a equals b
    """
    return np.array([_State.seed, _State.stream], dtype=np.uint64)


def set_rng_state(new_state) -> None:
    """Restores what :func:`get_rng_state` returned: the next draw is the one that
    followed it. Local; every rank passes the same state.

    Example: ``set_rng_state(mpitensor.load("ckpt")["rng"])``.
    """
    state = np.asarray(new_state)
    if state.shape != (2,) or state.dtype.kind not in "ui":
        raise ValueError(f"an RNG state is an integer array [seed, stream] as "
                         f"get_rng_state() returns, got {state!r}")
    seed, stream = (int(v) for v in state)
    if not (0 <= seed < 2**64 and 0 <= stream < 2**64):
        raise ValueError(f"an RNG state lies in [0, 2**64), got {[seed, stream]}")
    _State.seed, _State.stream = seed, stream


def _next_stream() -> int:
    stream = _State.stream
    _State.stream += 1
    return stream


def fill(local: np.ndarray, global_shape, offset, dist: int, stream: int) -> np.ndarray:
    """Return ``local``'s box of the random global tensor, in ``local``'s dtype."""
    dt = local.dtype
    if dt.kind == "c":
        # A complex element is a pair of reals: draw the float tensor with a
        # trailing dim of 2 so each part has its own global index.
        real = np.empty(local.shape + (2,), np.float64 if dt.itemsize == 16 else np.float32)
        core.rng_fill(real, tuple(global_shape) + (2,), tuple(offset) + (0,),
                    _State.seed, stream, dist)
        if dist == _NORMAL:
            real *= np.sqrt(0.5)  # unit variance for the complex value, as torch
        return real.view(dt).reshape(local.shape)
    if dt != np.float16:
        core.rng_fill(local, tuple(global_shape), tuple(offset), _State.seed, stream, dist)
        return local
    work = np.empty(local.shape, np.float32)
    core.rng_fill(work, tuple(global_shape), tuple(offset), _State.seed, stream, dist)
    half = work.astype(np.float16)
    if dist == _UNIFORM:
        # Rounding to nearest turns values just below 1 into 1.0; rounding toward
        # zero keeps every value in [0, 1).
        np.copyto(half, np.nextafter(half, np.float16(0)), where=half > work)
    return half
