"""MPITENSOR_LOGS: the ``mpitensor`` logger configured from the environment, the way
``TORCH_LOGS`` configures torch's ``dtensor`` logger.

``MPITENSOR_LOGS=+dtensor`` is DEBUG (a line for every redistribute: source, target,
the plan's steps and bytes; and for every sharding decision: operation, input specs,
output spec, cache hit or miss), ``dtensor`` is INFO and ``-dtensor`` WARNING.
Entries are separated by commas; ``all`` is a synonym of ``dtensor``. Every line
starts with the rank in ``MPI.COMM_WORLD``: ``[rank1]:DEBUG:mpitensor: ...``.
"""

from __future__ import annotations

import logging
import os
import sys

from . import _modes

_NAMES = ("dtensor", "all")
_FORMAT = "[rank%(mpi_rank)s]:%(levelname)s:%(name)s: %(message)s"


class _RankFilter(logging.Filter):
    """Adds ``mpi_rank`` to records; asks MPI only once it is running, so that
    configuring logging at import does not start MPI."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.mpi_rank = _rank()
        return True


def _rank() -> str:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return "-"
    return str(mpi.COMM_WORLD.Get_rank())


class _StderrHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` (not the one at configuration time), so
    that redirections made later, as pytest's capture, see the lines."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


_handler: logging.Handler | None = None


def parse(settings: str) -> int | None:
    """The level an ``MPITENSOR_LOGS`` value asks for, None for an empty value.

    >>> parse("+dtensor") == logging.DEBUG
    True
    """
    level = None
    for entry in (e.strip() for e in settings.split(",")):
        if not entry:
            continue
        sign, name = (entry[0], entry[1:]) if entry[0] in "+-" else ("", entry)
        if name not in _NAMES:
            raise ValueError(
                f"Invalid MPITENSOR_LOGS setting {entry!r}: use +dtensor (DEBUG), "
                f"dtensor (INFO) or -dtensor (WARNING)"
            )
        level = {"+": logging.DEBUG, "": logging.INFO, "-": logging.WARNING}[sign]
    return level


def set_level(level: int | None) -> None:
    """Sets the ``mpitensor`` logger to ``level`` with its rank-prefixed stderr
    handler; None removes both (Python's defaults apply again)."""
    global _handler
    logger = logging.getLogger("mpitensor")
    if level is None:
        if _handler is not None:
            logger.removeHandler(_handler)
            _handler = None
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    else:
        if _handler is None:
            _handler = _StderrHandler()
            _handler.addFilter(_RankFilter())
            _handler.setFormatter(logging.Formatter(_FORMAT))
            logger.addHandler(_handler)
        logger.setLevel(level)
        logger.propagate = False
    _modes.set_log_debug(logger.isEnabledFor(logging.DEBUG))
    _modes.set_log_info(logger.isEnabledFor(logging.INFO))


def configure_from_environment() -> None:
    value = os.environ.get("MPITENSOR_LOGS", "")
    level = parse(value)
    if level is not None:
        set_level(level)
