"""Grad mode: whether operations on DTensors that require grad are recorded.

The state is mpitensor._modes' (C reads it through the flag word, so a tensor
that requires grad leaves the C fast path only while recording). Local: modes are
per process, and every rank of an SPMD program enters and leaves them alike.
"""

from __future__ import annotations

import functools

from .. import _modes

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled"]


def is_grad_enabled() -> bool:
    """Whether operations are being recorded for autograd. Local.

    Example: ``with no_grad(): assert not is_grad_enabled()``.
    """
    return _modes.state.grad_enabled


class set_grad_enabled:
    """Sets grad mode on or off: at once when called, and back to the previous mode
    when used as a context manager and left (torch.set_grad_enabled). Local.

    Example::

        >>> with set_grad_enabled(False):
        ...     y = w * 2          # not recorded
    """

    def __init__(self, mode: bool) -> None:
        self.prev = _modes.set_grad_enabled(mode)

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        _modes.set_grad_enabled(self.prev)


class _Mode:
    """A context manager and decorator that runs its block in one grad mode."""

    mode = True

    def __enter__(self) -> None:
        self.prev = _modes.set_grad_enabled(self.mode)

    def __exit__(self, *exc) -> None:
        _modes.set_grad_enabled(self.prev)

    def __call__(self, func):
        @functools.wraps(func)
        def run(*args, **kwargs):
            with type(self)():
                return func(*args, **kwargs)
        return run


class no_grad(_Mode):
    """Operations inside are not recorded (torch.no_grad); a context manager or a
    decorator. Local.

    Example::

        >>> with mpitensor.no_grad():
        ...     w -= 0.1 * w.grad      # an update autograd must not see
    """

    mode = False


class enable_grad(_Mode):
    """Operations inside are recorded, even within ``no_grad`` (torch.enable_grad);
    a context manager or a decorator. Local.

    Example::

        >>> with mpitensor.no_grad():
        ...     with mpitensor.enable_grad():
        ...         y = w * 2          # recorded
    """

    mode = True
