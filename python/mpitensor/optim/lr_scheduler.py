"""Learning-rate schedulers, as torch.optim.lr_scheduler: they set ``"lr"`` in the
parameter groups of a :mod:`mpitensor.optim` optimizer, with torch's algorithms
(the chainable form on each ``step()``, the closed form on ``step(epoch)``), so a
run gives torch's learning rates step for step, also after a resume.

A scheduler only reads and writes Python numbers in ``param_groups``: it is Local
and moves no data. Every rank must step it alike, as it steps the optimizer; a
rank whose learning rate differs makes the next ``optimizer.step()`` raise on every
rank (the step agrees on the hyperparameters). ``state_dict()`` holds plain values
(numbers, lists, dicts), so ``mpitensor.save`` writes it beside the model and the
optimizer.

Example::

    >>> opt = mpitensor.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> sched = mpitensor.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    >>> for batch in batches:
    ...     loss_fn(model(batch)).backward(); opt.step(); opt.zero_grad()
    ...     sched.step()
"""

from __future__ import annotations

import math
import types
import warnings
from bisect import bisect_right
from collections import Counter
from typing import Callable

from .optimizer import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR",
           "ConstantLR", "LinearLR", "ExponentialLR", "PolynomialLR",
           "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
           "SequentialLR", "ChainedScheduler", "OneCycleLR", "ReduceLROnPlateau"]

_EPOCH_DEPRECATED = (
    "The epoch parameter in `scheduler.step()` was not necessary and is being "
    "deprecated where possible. Please use `scheduler.step()` to step the scheduler. "
    "During the deprecation, if epoch is different from None, the closed form is used "
    "instead of the new chainable form, where available.")


def _per_group(name: str, optimizer: Optimizer, value) -> list:
    """One value per parameter group: a list or tuple of as many, or one value for
    all."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{name} must have the same length as optimizer.param_groups. "
                             f"{name} has {len(value)} values, param_groups has "
                             f"{len(optimizer.param_groups)}.")
        return list(value)
    return [value] * len(optimizer.param_groups)


def _set_momentum(sched, group: dict, value) -> None:
    """SGD's ``momentum`` or Adam's ``betas[0]``, as the optimizer has."""
    if sched.use_beta1:
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value


def _check_optimizer(optimizer) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")


class LRScheduler:
    """Base class of the schedulers, as torch.optim.lr_scheduler.LRScheduler.

    On construction each group gets ``"initial_lr"`` (its ``"lr"``, unless it has
    one: a resumed optimizer keeps its own) and the scheduler makes its first step,
    which sets epoch 0's learning rates. With ``last_epoch`` other than -1 the
    groups must already hold ``"initial_lr"`` (KeyError otherwise), as when an
    optimizer was loaded from a checkpoint. A subclass defines ``get_lr`` (the
    chainable form, from the groups' current ``"lr"``) and may define
    ``_get_closed_form_lr`` (from ``base_lrs`` and ``last_epoch``). Local.

    Example::

        >>> sched = mpitensor.optim.lr_scheduler.StepLR(opt, step_size=30)
        >>> sched.last_epoch, sched.base_lrs
        (0, [0.1])
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in "
                                   f"param_groups[{i}] when resuming an optimizer")
        self.base_lrs: list = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        """The step made on construction: epoch 0, from the groups' learning rates
        as they are (``_is_initial`` tells the chainable forms so)."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def state_dict(self) -> dict:
        """Everything of the scheduler but its optimizer, as torch's (a copy of
        the attributes' dict). Local.

        Example: ``mpitensor.save({"sched": sched.state_dict(), ...}, "ckpt")``.
        """
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes back what :meth:`state_dict` gave (also after ``mpitensor.load``).
        Load the optimizer's state too: the learning rates live in its groups.
        Local.

        Example: ``sched.load_state_dict(mpitensor.load("ckpt")["sched"])``.
        """
        self.__dict__.update(state_dict)

    def get_last_lr(self) -> list:
        """The learning rate of each group as the last step set it. Local.

        Example: ``sched.get_last_lr()`` gives ``[0.1]`` before the first decay.
        """
        return self._last_lr

    def get_lr(self) -> list:
        """The chainable form: the next learning rate of each group, from the
        groups' current ones. Called by :meth:`step`; called elsewhere it warns,
        as torch (use :meth:`get_last_lr`). Local.

        Example: ``sched.get_last_lr()`` is what to call instead.
        """
        raise NotImplementedError(f"{type(self).__name__} defines no get_lr")

    def _warn_outside_step(self) -> None:
        if not getattr(self, "_get_lr_called_within_step", False):
            warnings.warn("To get the last learning rate computed by the scheduler, "
                          "please use `get_last_lr()`.", UserWarning, stacklevel=3)

    def step(self, epoch: int | None = None) -> None:
        """Moves to the next epoch (or to ``epoch``, deprecated as in torch, with
        the closed form where there is one) and sets each group's ``"lr"``. Call
        it after ``optimizer.step()``: called before it (on its first call) it
        warns as torch does. Local.

        Example: ``opt.step(); sched.step()``.
        """
        if self._step_count == 1 and not getattr(self.optimizer, "_opt_called", False):
            warnings.warn(
                "Detected call of `lr_scheduler.step()` before `optimizer.step()`. You "
                "should call them in the opposite order: `optimizer.step()` before "
                "`lr_scheduler.step()`. Failure to do this will result in skipping the "
                "first value of the learning rate schedule.", UserWarning)
        self._step_count += 1
        if epoch is not None:
            warnings.warn(_EPOCH_DEPRECATED, UserWarning)
        self._update_lr(epoch)

    def _update_lr(self, epoch: int | None = None) -> None:
        self._get_lr_called_within_step = True
        try:
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                self.last_epoch = epoch
                closed = getattr(self, "_get_closed_form_lr", None)
                values = closed() if closed is not None else self.get_lr()
        finally:
            self._get_lr_called_within_step = False
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _lrs(self) -> list:
        return [group["lr"] for group in self.optimizer.param_groups]


class _LRScheduler(LRScheduler):
    """torch's older name of :class:`LRScheduler`, for scripts that subclass it."""


class _LambdaState:
    """state_dict for schedulers that hold one function per group: a plain
    function (or lambda) is not saved, a callable object's attributes are."""

    lr_lambdas: list

    def state_dict(self) -> dict:
        """The scheduler's state; of each function only a callable object's
        attributes (a function or lambda is None), as torch's. Local.

        Example: ``sched.state_dict()["lr_lambdas"]`` is ``[None]`` for a lambda.
        """
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType)
                               else dict(fn.__dict__) for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes back :meth:`state_dict`, the callable objects' attributes
        included (the functions stay those given to the constructor). Local.

        Example: ``sched.load_state_dict(saved["sched"])``.
        """
        saved = state_dict["lr_lambdas"]
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "lr_lambdas"})
        for fn, attrs in zip(self.lr_lambdas, saved):
            if attrs is not None:
                fn.__dict__.update(attrs)


def _lambdas(optimizer: Optimizer, lr_lambda) -> list:
    if not isinstance(lr_lambda, (list, tuple)):
        return [lr_lambda] * len(optimizer.param_groups)
    if len(lr_lambda) != len(optimizer.param_groups):
        raise ValueError(f"Expected {len(optimizer.param_groups)} lr_lambdas, but got "
                         f"{len(lr_lambda)}")
    return list(lr_lambda)


class LambdaLR(_LambdaState, LRScheduler):
    """``lr = initial_lr * lr_lambda(epoch)`` (one function, or one per group), as
    torch's LambdaLR. Local.

    Example (a linear warmup over 100 steps)::

        >>> sched = LambdaLR(opt, lambda step: min(1.0, (step + 1) / 100))
    """

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable | list,
                 last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self._warn_outside_step()
        return [base * fn(self.last_epoch)
                for fn, base in zip(self.lr_lambdas, self.base_lrs)]


class MultiplicativeLR(_LambdaState, LRScheduler):
    """Each step multiplies ``lr`` by ``lr_lambda(epoch)`` (one function, or one
    per group), as torch's MultiplicativeLR. Local.

    Example::

        >>> sched = MultiplicativeLR(opt, lambda epoch: 0.95)
    """

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable | list,
                 last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        self.lr_lambdas = _lambdas(optimizer, lr_lambda)
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(f"lr_lambda should be a function, but got "
                                f"{type(fn).__name__}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self._warn_outside_step()
        if self._is_initial:
            return self._lrs()
        return [lr * fn(self.last_epoch) for fn, lr in zip(self.lr_lambdas, self._lrs())]


class StepLR(LRScheduler):
    """Multiplies ``lr`` by ``gamma`` every ``step_size`` epochs:
    ``initial_lr * gamma ** (epoch // step_size)``, as torch's StepLR. Local.

    Example::

        >>> sched = StepLR(opt, step_size=30, gamma=0.1)
    """

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self._warn_outside_step()
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]

    def _get_closed_form_lr(self) -> list:
        return [base * self.gamma ** (self.last_epoch // self.step_size)
                for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiplies ``lr`` by ``gamma`` at each of ``milestones`` (a milestone given
    twice multiplies twice), as torch's MultiStepLR. Local.

    Example::

        >>> sched = MultiStepLR(opt, milestones=[30, 80], gamma=0.1)
    """

    def __init__(self, optimizer: Optimizer, milestones, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def load_state_dict(self, state_dict: dict) -> None:
        # mpitensor.load gives the milestones back as a plain dict.
        super().load_state_dict(state_dict)
        self.milestones = Counter({int(k): v for k, v in self.milestones.items()})

    def get_lr(self) -> list:
        self._warn_outside_step()
        if self.last_epoch not in self.milestones:
            return self._lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._lrs()]

    def _get_closed_form_lr(self) -> list:
        milestones = sorted(self.milestones.elements())
        return [base * self.gamma ** bisect_right(milestones, self.last_epoch)
                for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """``lr = initial_lr * factor`` until epoch ``total_iters``, then
    ``initial_lr``, as torch's ConstantLR. Local.

    Example::

        >>> sched = ConstantLR(opt, factor=0.5, total_iters=4)
    """

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if factor > 1.0 or factor < 0:
            raise ValueError("Constant multiplicative factor expected to be between 0 "
                             "and 1.")
        self.factor = factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self._warn_outside_step()
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._lrs()]
        if self.last_epoch != self.total_iters:
            return self._lrs()
        return [lr * (1.0 / self.factor) for lr in self._lrs()]

    def _get_closed_form_lr(self) -> list:
        return [base * (self.factor + (self.last_epoch >= self.total_iters)
                        * (1 - self.factor)) for base in self.base_lrs]


class LinearLR(LRScheduler):
    """``lr`` goes linearly from ``initial_lr * start_factor`` to ``initial_lr *
    end_factor`` over ``total_iters`` epochs, then stays, as torch's LinearLR (a
    warmup, typically). Local.

    Example::

        >>> sched = LinearLR(opt, start_factor=0.01, total_iters=100)
    """

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, total_iters: int = 5,
                 last_epoch: int = -1) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 "
                             "and less or equal to 1.")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self._warn_outside_step()
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in self._lrs()]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._lrs()
        # The ratio of this epoch's factor to the last one's.
        span = self.end_factor - self.start_factor
        ratio = 1.0 + span / (self.total_iters * self.start_factor
                              + (self.last_epoch - 1) * span)
        return [lr * ratio for lr in self._lrs()]

    def _get_closed_form_lr(self) -> list:
        span = self.end_factor - self.start_factor
        return [base * (self.start_factor + span * min(self.total_iters, self.last_epoch)
                        / self.total_iters) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiplies ``lr`` by ``gamma`` every epoch, as torch's ExponentialLR.
    Local.

    Example::

        >>> sched = ExponentialLR(opt, gamma=0.95)
    """

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self._warn_outside_step()
        # A resumed scheduler's first step must not decay once more.
        if self._is_initial:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]

    def _get_closed_form_lr(self) -> list:
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """``lr = initial_lr * (1 - min(epoch, total_iters) / total_iters) ** power``,
    as torch's PolynomialLR. Local.

    Example::

        >>> sched = PolynomialLR(opt, total_iters=50, power=0.9)
    """

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0,
                 last_epoch: int = -1) -> None:
        self.total_iters = total_iters
        self.power = power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self._warn_outside_step()
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._lrs()
        decay = ((1.0 - self.last_epoch / self.total_iters)
                 / (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
        return [lr * decay for lr in self._lrs()]

    def _get_closed_form_lr(self) -> list:
        return [base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters)
                ** self.power for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from ``initial_lr`` to ``eta_min`` over ``T_max`` epochs
    (and back up over the next ``T_max``: no restart), with torch's recurrence::

        lr_t = eta_min + (lr_{t-1} - eta_min) * (1 + cos(pi t / T_max))
                                              / (1 + cos(pi (t - 1) / T_max))

    so that a change made to ``lr`` from outside carries on, as torch's
    CosineAnnealingLR. Local.

    Example::

        >>> sched = CosineAnnealingLR(opt, T_max=1000, eta_min=1e-5)
    """

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self._warn_outside_step()
        t, T, lo = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._lrs()
        if self._step_count == 1 and t > 0:
            # The first step of a scheduler made with last_epoch: the closed form.
            return [lo + (base - lo) * (1 + math.cos(t * math.pi / T)) / 2
                    for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            # Leaving the minimum, where the recurrence would divide by zero.
            return [lr + (base - lo) * (1 - math.cos(math.pi / T)) / 2
                    for base, lr in zip(self.base_lrs, self._lrs())]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                * (lr - lo) + lo for lr in self._lrs()]

    def _get_closed_form_lr(self) -> list:
        return [self.eta_min + (base - self.eta_min)
                * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from ``initial_lr`` to ``eta_min`` that restarts: over
    ``T_0`` epochs, then ``T_0 * T_mult``, and so on, as torch's
    CosineAnnealingWarmRestarts (SGDR). ``step(epoch)`` takes a fractional epoch
    (``epoch + i / iters`` within an epoch) and may jump. Local.

    Example::

        >>> sched = CosineAnnealingWarmRestarts(opt, T_0=10, T_mult=2, eta_min=1e-5)
    """

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1,
                 eta_min: float = 0.0, last_epoch: int = -1) -> None:
        if T_0 <= 0 or not isinstance(T_0, int):
            raise ValueError(f"Expected positive integer T_0, but got {T_0}")
        if T_mult < 1 or not isinstance(T_mult, int):
            raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"Expected float or int eta_min, but got {eta_min} of type "
                             f"{type(eta_min)}")
        self.T_0 = T_0
        self.T_i = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self._warn_outside_step()
        return [self.eta_min + (base - self.eta_min)
                * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base in self.base_lrs]

    def step(self, epoch=None) -> None:
        """The next epoch, or ``epoch`` (a float allowed: a point within an
        epoch), restarting the cosine at the end of each period. Local.

        Example: ``sched.step(epoch + i / len(loader))`` after each batch.
        """
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        elif epoch < 0:
            raise ValueError(f"Expected non-negative epoch, but got {epoch}")
        elif epoch < self.T_0:
            self.T_i = self.T_0
            self.T_cur = epoch
        elif self.T_mult == 1:
            self.T_cur = epoch % self.T_0
        else:
            # The number of whole periods before epoch: the geometric series'
            # inverse.
            n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
            self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
            self.T_i = self.T_0 * self.T_mult ** n
        self.last_epoch = math.floor(epoch)
        self._get_lr_called_within_step = True
        try:
            values = self.get_lr()
        finally:
            self._get_lr_called_within_step = False
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = self._lrs()


class CyclicLR(LRScheduler):
    """The cyclical learning rate (CLR), as torch's CyclicLR: ``lr`` goes from
    ``base_lr`` to ``max_lr`` in ``step_size_up`` steps and back in
    ``step_size_down`` (default: the same), its amplitude scaled by ``mode``
    (``"triangular"``: 1; ``"triangular2"``: halved each cycle; ``"exp_range"``:
    ``gamma ** step``) or by ``scale_fn`` of the cycle or of the step
    (``scale_mode``); with ``cycle_momentum`` the momentum (SGD's ``momentum``,
    Adam's ``betas[0]``) moves the other way between ``max_momentum`` and
    ``base_momentum``. Local.

    Example::

        >>> sched = CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=200)
    """

    def __init__(self, optimizer: Optimizer, base_lr, max_lr, step_size_up: int = 2000,
                 step_size_down: int | None = None, mode: str = "triangular",
                 gamma: float = 1.0, scale_fn: Callable | None = None,
                 scale_mode: str = "cycle", cycle_momentum: bool = True,
                 base_momentum=0.8, max_momentum=0.9, last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        base_lrs = _per_group("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.max_lrs = _per_group("max_lr", optimizer, max_lr)
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError("mode is invalid and scale_fn is None")
        self.mode = mode
        self.gamma = gamma
        self._scale_fn_custom = scale_fn
        # The built-in modes decide their own scale_mode.
        self.scale_mode = scale_mode if scale_fn is not None else (
            "iterations" if mode == "exp_range" else "cycle")
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with "
                                 "`cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = _per_group("base_momentum", optimizer, base_momentum)
            self.max_momentums = _per_group("max_momentum", optimizer, max_momentum)
            if last_epoch == -1:
                for high, low, group in zip(self.max_momentums, self.base_momentums,
                                            optimizer.param_groups):
                    _set_momentum(self, group, high)
                    group["max_momentum"] = high
                    group["base_momentum"] = low
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def scale_fn(self, x) -> float:
        """The amplitude's scale at ``x`` (a cycle number or a step, as
        ``scale_mode`` says). Local.

        Example: ``CyclicLR(opt, 0.01, 0.1, mode="triangular2").scale_fn(3) == 0.25``.
        """
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma ** x

    def get_lr(self) -> list:
        self._warn_outside_step()
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        if x <= self.step_ratio:
            factor = x / self.step_ratio
        else:
            factor = (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        lrs = [base + (top - base) * factor * scale
               for base, top in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:
            for group, low, high in zip(self.optimizer.param_groups, self.base_momentums,
                                        self.max_momentums):
                _set_momentum(self, group, high - (high - low) * factor * scale)
        return lrs

    def state_dict(self) -> dict:
        """The scheduler's state; of ``scale_fn`` only a callable object's
        attributes (a function or lambda is None), as torch's. Local.

        Example: ``mpitensor.save({"sched": sched.state_dict()}, "ckpt")``.
        """
        state = super().state_dict()
        fn = state.pop("_scale_fn_custom")
        plain = fn is None or isinstance(fn, types.FunctionType)
        state["_scale_fn_custom"] = None if plain else dict(fn.__dict__)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes back :meth:`state_dict` (the ``scale_fn`` stays the one given to
        the constructor, with a callable object's attributes restored). Local.

        Example: ``sched.load_state_dict(saved["sched"])``.
        """
        attrs = state_dict.get("_scale_fn_custom")
        super().load_state_dict({k: v for k, v in state_dict.items()
                                 if k != "_scale_fn_custom"})
        if attrs is not None:
            self._scale_fn_custom.__dict__.update(attrs)


def _check_children(kind: str, optimizer, schedulers) -> None:
    if len(schedulers) < 1:
        raise ValueError(f"{kind} expects at least one scheduler, but got no scheduler.")
    for i, sched in enumerate(schedulers):
        if not hasattr(sched, "optimizer"):
            raise TypeError(f"{kind} at index {i} should have `optimizer` as its "
                            f"attribute.")
        if isinstance(sched, ReduceLROnPlateau):
            raise ValueError(f"{kind} does not support `ReduceLROnPlateau` scheduler as it "
                             f"requires additional kwargs to be specified when calling "
                             f"`step`, but got one at index {i} in the given schedulers "
                             f"sequence.")
        if sched.optimizer is not optimizer:
            raise ValueError(f"{kind} expects all schedulers to belong to the same "
                             f"optimizer, but got scheduler {type(sched).__name__} at "
                             f"index {i} with another one.")


class _Composite:
    """state_dict for schedulers made of schedulers: theirs nested under
    ``"_schedulers"``."""

    _schedulers: list

    def state_dict(self) -> dict:
        """The scheduler's state, each inner scheduler's state_dict under
        ``"_schedulers"``, as torch's. Local.

        Example: ``mpitensor.save({"sched": sched.state_dict()}, "ckpt")``.
        """
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes back :meth:`state_dict`, each inner scheduler's too. Local.

        Example: ``sched.load_state_dict(saved["sched"])``.
        """
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "_schedulers"})
        for sched, state in zip(self._schedulers, state_dict["_schedulers"]):
            sched.load_state_dict(state)


class SequentialLR(_Composite, LRScheduler):
    """Runs ``schedulers`` one after the other, switching at each of ``milestones``
    (a scheduler starts at its own epoch 0 there, by its closed form), as torch's
    SequentialLR. The schedulers given are rewound to before their first step.
    Local.

    Example (a warmup, then cosine decay)::

        >>> warm = LinearLR(opt, start_factor=0.01, total_iters=10)
        >>> decay = CosineAnnealingLR(opt, T_max=90)
        >>> sched = SequentialLR(opt, [warm, decay], milestones=[10])
    """

    def __init__(self, optimizer: Optimizer, schedulers: list, milestones: list,
                 last_epoch: int = -1) -> None:
        _check_children(type(self).__name__, optimizer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"Sequential Schedulers expects number of schedulers provided to be one "
                f"more than the number of milestone points, but got number of schedulers "
                f"{len(schedulers)} and the number of milestones to be equal to "
                f"{len(milestones)}")
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        # Each scheduler stepped once when it was made: take those steps back,
        # then the first scheduler alone makes epoch 0.
        self._rewind(self)
        self._schedulers[0]._initial_step()
        self._last_lr = self._schedulers[0].get_last_lr()

    @staticmethod
    def _rewind(sched) -> None:
        inner = getattr(sched, "_schedulers", None)
        if inner is not None:
            for s in inner:
                SequentialLR._rewind(s)
        elif hasattr(sched, "last_epoch"):
            sched.last_epoch -= 1

    def step(self) -> None:  # type: ignore[override]
        """Steps the scheduler of the current epoch; at a milestone the next one
        starts at its epoch 0. Local.

        Example: ``opt.step(); sched.step()``.
        """
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        sched = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            sched._update_lr(0)
        else:
            sched.step()
        self._last_lr = sched.get_last_lr()


class ChainedScheduler(_Composite, LRScheduler):
    """Steps every scheduler of ``schedulers`` on each step, in order, so that
    their factors multiply, as torch's ChainedScheduler. Local.

    Example::

        >>> sched = ChainedScheduler([ConstantLR(opt, 0.1, 20), ExponentialLR(opt, 0.9)])
    """

    def __init__(self, schedulers: list, optimizer: Optimizer | None = None) -> None:
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler to be "
                             f"chained, but got no scheduler.")
        optimizer = optimizer or schedulers[0].optimizer
        _check_children(type(self).__name__, optimizer, schedulers)
        self._schedulers = list(schedulers)
        self.optimizer = optimizer
        self._last_lr = self._lrs()

    def step(self) -> None:  # type: ignore[override]
        """Steps each scheduler in turn. Local.

        Example: ``opt.step(); sched.step()``.
        """
        for sched in self._schedulers:
            sched.step()
        self._last_lr = self._lrs()


class OneCycleLR(LRScheduler):
    """The 1cycle policy, as torch's OneCycleLR: ``lr`` rises from ``max_lr /
    div_factor`` to ``max_lr`` over ``pct_start`` of ``total_steps`` (or ``epochs *
    steps_per_epoch``), then falls to ``initial_lr / final_div_factor`` (with
    ``three_phase``, back to ``initial_lr`` first), by ``anneal_strategy`` (``"cos"``
    or ``"linear"``); with ``cycle_momentum`` the momentum (SGD's ``momentum``,
    Adam's ``betas[0]``) moves the other way between ``max_momentum`` and
    ``base_momentum``. Stepping past ``total_steps`` raises ValueError. Local.

    Example::

        >>> sched = OneCycleLR(opt, max_lr=0.1, total_steps=1000)
    """

    def __init__(self, optimizer: Optimizer, max_lr, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None,
                 pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum=0.85, max_momentum=0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False, last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        self.total_steps = self._total(total_steps, epochs, steps_per_epoch)
        n = self.total_steps
        if three_phase:
            self._schedule_phases = [
                self._phase(float(pct_start * n) - 1, "initial_lr", "max_lr",
                            "max_momentum", "base_momentum"),
                self._phase(float(2 * pct_start * n) - 2, "max_lr", "initial_lr",
                            "base_momentum", "max_momentum"),
                self._phase(n - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            self._schedule_phases = [
                self._phase(float(pct_start * n) - 1, "initial_lr", "max_lr",
                            "max_momentum", "base_momentum"),
                self._phase(n - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        if pct_start < 0 or pct_start > 1 or not isinstance(pct_start, float):
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got "
                             f"{pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead "
                             f"got {anneal_strategy}")
        self._anneal_func_type = anneal_strategy
        max_lrs = _per_group("max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for top, group in zip(max_lrs, optimizer.param_groups):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with "
                                 "`cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            highs = _per_group("max_momentum", optimizer, max_momentum)
            lows = _per_group("base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for high, low, group in zip(highs, lows, optimizer.param_groups):
                    _set_momentum(self, group, high)
                    group["max_momentum"] = high
                    group["base_momentum"] = low
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _total(total_steps, epochs, steps_per_epoch) -> int:
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"Expected positive integer total_steps, but got "
                                 f"{total_steps}")
            return total_steps
        if epochs is not None and steps_per_epoch is not None:
            if not isinstance(epochs, int) or epochs <= 0:
                raise ValueError(f"Expected positive integer epochs, but got {epochs}")
            if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
                raise ValueError(f"Expected positive integer steps_per_epoch, but got "
                                 f"{steps_per_epoch}")
            return epochs * steps_per_epoch
        raise ValueError("You must define either total_steps OR (epochs AND "
                         "steps_per_epoch)")

    @staticmethod
    def _phase(end_step, start_lr, end_lr, start_momentum, end_momentum) -> dict:
        return {"end_step": end_step, "start_lr": start_lr, "end_lr": end_lr,
                "start_momentum": start_momentum, "end_momentum": end_momentum}

    def _anneal(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list:
        self._warn_outside_step()
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total "
                             f"steps is {self.total_steps}")
        lrs = []
        last = len(self._schedule_phases) - 1
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == last:
                    pct = (step - start) / (end - start)
                    lrs.append(self._anneal(group[phase["start_lr"]],
                                            group[phase["end_lr"]], pct))
                    if self.cycle_momentum:
                        _set_momentum(self, group, self._anneal(
                            group[phase["start_momentum"]], group[phase["end_momentum"]],
                            pct))
                    break
                start = end
        return lrs


class ReduceLROnPlateau(LRScheduler):
    """Multiplies ``lr`` by ``factor`` (not below ``min_lr``) when ``metrics``,
    passed to each ``step(metrics)``, has not improved for more than ``patience``
    steps, then waits ``cooldown`` steps, as torch's ReduceLROnPlateau (``mode``
    ``"min"`` or ``"max"``, ``threshold_mode`` ``"rel"`` or ``"abs"``; a change
    smaller than ``eps`` is not made). Local; ``step`` with a 0-d DTensor metric
    reads it with ``float()``, which is Collective on its mesh, and every rank
    must pass the same metric.

    Example::

        >>> sched = ReduceLROnPlateau(opt, "min", factor=0.5, patience=3)
        >>> sched.step(validation_loss)
    """

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1,
                 patience: int = 10, threshold: float = 1e-4, threshold_mode: str = "rel",
                 cooldown: int = 0, min_lr=0, eps: float = 1e-8) -> None:
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        self.factor = factor
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueError(f"expected {len(optimizer.param_groups)} min_lrs, got "
                                 f"{len(min_lr)}")
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * len(optimizer.param_groups)
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = self._lrs()
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def step(self, metrics, epoch=None) -> None:  # type: ignore[override]
        """Takes this epoch's metric (a number, or a 0-d DTensor), and lowers the
        learning rates when it has not improved for more than ``patience`` steps.
        Local (a DTensor metric: Collective on its mesh, as ``float()``).

        Example: ``sched.step(float(val_loss))``.
        """
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(_EPOCH_DEPRECATED, UserWarning)
        self.last_epoch = epoch
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad epochs do not count during the cooldown
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = self._lrs()

    def _reduce_lr(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(
                    f"The number of param groups in the `optimizer` ({len(groups)}) "
                    f"differs from when `ReduceLROnPlateau` was initialized "
                    f"({len(self.min_lrs)}), usually due to a new param group being added "
                    f"to the optimizer. Please modify the `min_lrs` field to match the "
                    f"length of the `optimizer` param groups.")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, low in zip(groups, self.min_lrs):
            old = float(group["lr"])
            new = max(old * self.factor, low)
            if old - new > self.eps:
                group["lr"] = new

    @property
    def in_cooldown(self) -> bool:
        """Whether the scheduler waits after a reduction (bad epochs do not count
        then). Local.

        Example: ``sched.in_cooldown`` is False before the first reduction.
        """
        return self.cooldown_counter > 0

    def _is_better(self, a: float, best: float) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def _init_is_better(self, mode: str, threshold: float, threshold_mode: str) -> None:
        if mode not in ("min", "max"):
            raise ValueError("mode " + mode + " is unknown!")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError("threshold mode " + threshold_mode + " is unknown!")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes back :meth:`state_dict`. Local.

        Example: ``sched.load_state_dict(saved["sched"])``.
        """
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)

