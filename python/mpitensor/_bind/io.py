"""The checkpoint files of ``csrc/io`` (mpitensor/io/io.h): saving and loading a
rank's boxes, the exchange of small files, syncing and dropping cached ranges.
Callers: :mod:`mpitensor.checkpoint._io`."""

from __future__ import annotations

from .._clib import A, E, I, I64, P, S, _Box, fn, ptr, struct

IoArray, IoOptions = struct("mt_io_array"), struct("mt_io_options")


mt_io_save = fn("mt_io_save", I, P, S, S, I64, IoArray, _Box, A, I64, IoOptions, E)
mt_io_load = fn("mt_io_load", I, P, S, IoArray, _Box, A, I64, IoOptions, E)
mt_io_options_default = fn("mt_io_options_default", IoOptions)
mt_io_counters_read = fn("mt_io_counters_read", None, P, ptr(I64), ptr(I64))
mt_io_exchange = fn("mt_io_exchange", I, S, S, E)
mt_io_sync_range = fn("mt_io_sync_range", I, I, I64, I64, S, E)
mt_io_release_cache = fn("mt_io_release_cache", None, S)
