"""Utilities of a torch training script under torch's names: ``checkpoint``
(activation checkpointing, as ``torch.utils.checkpoint``)."""

from . import checkpoint  # noqa: F401

__all__ = ["checkpoint"]
