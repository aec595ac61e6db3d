"""torch.distributed's names that act on local arrays: the functional collectives
(:mod:`mpitensor.distributed._functional_collectives`, torch's
``torch.distributed._functional_collectives``).

Example::

    >>> import mpitensor.distributed._functional_collectives as funcol
    >>> funcol.all_reduce(np.ones(2), "sum", mesh)
"""

from . import _functional_collectives  # noqa: F401

__all__: list[str] = []
