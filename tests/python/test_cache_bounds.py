"""Programs whose shapes vary (sequence lengths, a last batch) do not grow memory
without bound: each mesh's caches (decisions of operations and redistributes, the
layouts they are keyed by, parsed indexing keys) stay within their limits
(mpitensor.set_cache_limits), and 50,000 distinct shapes grow resident memory by
less than 32 MiB. The caches are per rank and the same at every size; this runs
at np 1, where nothing waits on another rank (test_executor checks the bound on
the plans decisions hold, which need more than one rank)."""

import gc
import os

import numpy as np
import psutil
import pytest

import mpitensor as mt
from mpitensor import Replicate, Shard

pytestmark = [
    pytest.mark.np(1),
    pytest.mark.skipif(bool(os.environ.get("MT_SANITIZED")),
                       reason="RSS is meaningless under AddressSanitizer"),
]


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_50000_distinct_shapes_grow_memory_by_less_than_32_mib():
    mesh = mt.init_device_mesh("cpu", (1,))
    base = rss()
    for i in range(50_000):
        shape = (1 + i % 500, 1 + i // 500)
        x = mt.DTensor.from_local(np.ones(shape), mesh, [Shard(0)])
        x.redistribute(mesh, [Replicate()])  # a redistribute's decision
        (x + x).sum(0) * 2.0  # decisions and the layouts of their results
        x[:1]  # a parsed indexing key
    growth = rss() - base
    stats = mesh._dispatch_stats()
    assert growth < 32 << 20, growth
    assert stats["decisions"] <= stats["decision_limit"]
    assert stats["layouts"] <= stats["layout_limit"]
    assert len(mesh._index_keys) <= 256
