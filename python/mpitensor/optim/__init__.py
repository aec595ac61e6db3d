"""Optimizers for DTensor parameters, as torch.optim: :class:`SGD`, :class:`Adam`,
:class:`AdamW`, :class:`RMSprop`, :class:`Adagrad` on the :class:`Optimizer` base
(param_groups, zero_grad, step, state_dict in torch's format), and the
learning-rate schedulers of :mod:`mpitensor.optim.lr_scheduler`.

A state tensor is a DTensor with its parameter's mesh and placements, so every
update runs on the local shards with no data moved (a step agrees with the other
ranks that they step alike, one all-reduce of three int64), and the state saves and
loads with ``mpitensor.save``/``mpitensor.load`` like the parameters.

Example (``mpiexec -n 2``)::

    >>> w = mpitensor.distribute_tensor(np.ones((4, 3)), mesh, [Shard(0)],
    ...                                 requires_grad=True)
    >>> opt = mpitensor.optim.AdamW([w], lr=1e-2)
    >>> (w * w).sum().backward()
    >>> opt.step(); opt.zero_grad()
    >>> opt.state[w]["exp_avg"].placements
    (Shard(dim=0),)
"""

from . import lr_scheduler
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "lr_scheduler"]
