"""What the client-library tests share: the NumPy calls a case ran on gathered
arrays, recorded as the test's property ``gathered`` (docs/ecosystem.md lists
them, made by tests/clients_table.py from the run's JSON report)."""

from __future__ import annotations

import contextlib
import warnings

from mpitensor._ops import _fallback
from mpitensor._ops._fallback import GatherWarning


@contextlib.contextmanager
def recording_gathers(record_property):
    """Inside it, every warning is silenced and each NumPy function that ran on
    gathered arrays is recorded (GatherWarning warns once per function and
    process, so the record of what warned already is set aside meanwhile)."""
    before = set(_fallback._warned)
    _fallback._warned.clear()
    names: set = set()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            yield
        for w in seen:
            if issubclass(w.category, GatherWarning):
                names.add(str(w.message).split(" has no distributed rule")[0])
    finally:
        _fallback._warned.update(before)
        record_property("gathered", ",".join(sorted(names)))

