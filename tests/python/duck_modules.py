"""A stand-in for mpitensor.nn's Module, with exactly the methods CommDebugMode's
module tracing relies on (see mpitensor/debug/_module_tracker.py), and an MLP built
on it, parallelized Colwise -> Rowwise by hand with DTensors."""

from __future__ import annotations

import numpy as np

from mpitensor import DTensor, Replicate, Shard, distribute_tensor


class Handle:
    """What register_forward_*hook returns: remove() unregisters the hook."""

    def __init__(self, hooks: dict, key: int):
        self._hooks, self._key = hooks, key

    def remove(self) -> None:
        self._hooks.pop(self._key, None)


class Module:
    """__call__ runs the pre-hooks, forward, then the post-hooks, as torch's."""

    _next_key = 0

    def __init__(self):
        self._children: dict = {}
        self._params: dict = {}
        self._pre: dict = {}
        self._post: dict = {}

    def add(self, name: str, child: "Module") -> "Module":
        self._children[name] = child
        return child

    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self, recurse: bool = True):
        assert recurse is False, "the tracker asks for a module's own parameters"
        yield from self._params.items()

    def _register(self, hooks: dict, hook) -> Handle:
        Module._next_key += 1
        hooks[Module._next_key] = hook
        return Handle(hooks, Module._next_key)

    def register_forward_pre_hook(self, hook) -> Handle:
        return self._register(self._pre, hook)

    def register_forward_hook(self, hook) -> Handle:
        return self._register(self._post, hook)

    def hook_count(self) -> int:
        return sum(len(m._pre) + len(m._post) for _, m in self.named_modules())

    def __call__(self, *args):
        for hook in list(self._pre.values()):
            hook(self, args)
        out = self.forward(*args)
        for hook in list(self._post.values()):
            hook(self, args, out)
        return out


class Linear(Module):
    """y = x @ weight.T + bias, weight (out, in); ``output`` placements, when given,
    are what the output is redistributed to (RowwiseParallel's output layout)."""

    def __init__(self, mesh, n_in: int, n_out: int, weight_pl, bias_pl, output=None):
        super().__init__()
        rng = np.random.default_rng(n_in * 100 + n_out)
        self._params["weight"] = distribute_tensor(rng.standard_normal((n_out, n_in)),
                                                   mesh, weight_pl)
        self._params["bias"] = distribute_tensor(rng.standard_normal(n_out), mesh, bias_pl)
        self.output = output

    def forward(self, x):
        y = x @ self._params["weight"].T
        if self.output is not None:
            y = y.redistribute(y.device_mesh, self.output)
        return y + self._params["bias"]


class ReLU(Module):
    def forward(self, x):
        return np.maximum(x, 0.0)


class MLP(Module):
    """net1 (Colwise: weight and bias Shard(0)) -> relu -> net2 (Rowwise: weight
    Shard(1), bias Replicate, output all-reduced to Replicate)."""

    def __init__(self, mesh, dim: int = 8, hidden: int = 16):
        super().__init__()
        self.net1 = self.add("net1", Linear(mesh, dim, hidden, [Shard(0)], [Shard(0)]))
        self.relu = self.add("relu", ReLU())
        self.net2 = self.add("net2", Linear(mesh, hidden, dim, [Shard(1)], [Replicate()],
                                            output=[Replicate()]))

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def replicated_input(mesh, batch: int = 4, dim: int = 8) -> DTensor:
    x = np.random.default_rng(7).standard_normal((batch, dim))
    return DTensor.from_local(x, mesh, [Replicate()])
