"""The standard's ``fft`` extension and the rest of ``numpy.fft`` (``fft2``,
``rfft2``, ...): NumPy's functions on DTensors (through the registry, as every
NumPy call), and ``fftfreq``/``rfftfreq`` made as the namespace's creation
functions make arrays."""

import numpy as np

from ._creation import _distributed
from ._funcs import arrays_out

__all__ = ["fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft",
           "ihfft", "fftfreq", "rfftfreq", "fftshift", "ifftshift", "fft2", "ifft2",
           "rfft2", "irfft2"]

globals().update({name: arrays_out(getattr(np.fft, name)) for name in __all__
                  if not name.endswith("freq")})


def fftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The standard's ``fftfreq``: NumPy's sample frequencies, cut along the mesh as
    the creation functions cut. Local.

    Example: ``fftfreq(4).shape == (4,)``.
    """
    return _distributed(np.fft.fftfreq(n, d=d).astype(dtype or np.float64, copy=False),
                        device)


def rfftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The standard's ``rfftfreq``, as :func:`fftfreq`. Local.

    Example: ``rfftfreq(4).shape == (3,)``.
    """
    return _distributed(np.fft.rfftfreq(n, d=d).astype(dtype or np.float64, copy=False),
                        device)
