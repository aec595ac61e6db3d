"""Assertions for tests of programs that use DTensors: ``assert_close`` and
``assert_equal``, collective on the DTensor's mesh (every rank fails together), and
``init_torch_gloo`` to run torch's DTensor beside mpitensor for comparisons.

The pytest plugin that runs tests under ``mpiexec`` lives in ``pytest_mpitensor``
(active once mpitensor is installed; ``-p no:mpitensor`` turns it off).

Example (``mpiexec -n 4 python -m pytest``)::

    from mpitensor.testing import assert_close

    def test_sum(mesh):
        x = mt.distribute_tensor(np.arange(8.0), mesh, [mt.Shard(0)])
        assert_close(x.sum(), 28.0)
"""

from ._comparison import assert_close, assert_equal
from ._torch import init_torch_gloo

__all__ = ["assert_close", "assert_equal", "init_torch_gloo"]
