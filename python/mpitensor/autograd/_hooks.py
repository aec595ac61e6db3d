"""Running the hooks users register, inside a backward, safely under SPMD.

A hook is user Python that runs in the middle of a backward whose next step is
often a collective. If it raised on one rank only, that rank would leave the
backward while the others wait in the collective for it. So the ranks of the
tensor's mesh agree on each hook call's outcome (``_comm.agree``, one small
all-reduce): a hook that raises on some rank raises the same exception, with the
first failing rank's message, on every rank, and the backward ends there on all of
them. The agreement also carries the placements a hook's replacement gradient has,
so a hook that returns differently placed gradients on different ranks (which would
make the next redistribute pair different collectives) is a ValueError on every
rank. A mesh of one rank has nothing to agree with and pays nothing while the
hooks return.
"""

from __future__ import annotations

from .. import _comm
from .._dtensor import DTensor
from .._fingerprint import fingerprint

__all__ = ["agreed", "tensor_hooks", "post_accumulate_grad_hooks"]


def agreed(mesh, call, layout, what: str):
    """``call()``'s result once the ranks of ``mesh`` agree it returned everywhere
    with the same ``layout(result)`` (a value with a canonical repr). An exception
    of ``call`` on any rank becomes that rank's exception (its class mapped by
    ``_comm.agree``, its message prefixed with ``what``) on every rank, chained to the
    original where it happened. Collective on ``mesh`` (nothing for one rank when
    ``call`` returns)."""
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 - every exception must be agreed on
        text = f"{what} raised {type(error).__name__}: {error}"
        try:
            _comm.agree(mesh, False, 0, text, type(error))
        except Exception as agreed_error:  # noqa: BLE001 - the agreed one
            raise agreed_error from error
        raise  # not reached: an agreement with a failing member raises
    if mesh.size() > 1:
        _comm.agree(mesh, True, fingerprint(layout(result)),
                 f"{what} gave gradients of other placements on other ranks: the "
                 f"ranks must return the same placements")
    return result


def _name(hook) -> str:
    return getattr(hook, "__name__", "<unknown>")


def _checked(hook, old: DTensor, new) -> DTensor:
    """``new``, a hook's replacement for ``old``, checked as torch checks it."""
    if type(new) is not DTensor:
        raise TypeError(f"expected DTensor, but hook returned '{type(new).__name__}'")
    if new._spec.dtype != old._spec.dtype:
        raise RuntimeError(
            f"hook '{_name(hook)}' has changed the type of value (was {old._spec.dtype} "
            f"got {new._spec.dtype})")
    if new.shape != old.shape:
        raise RuntimeError(f"hook '{_name(hook)}' has changed the size of value")
    return new


def tensor_hooks(t: DTensor, g: DTensor) -> DTensor:
    """``g``, the gradient backward computed for ``t``, after ``t``'s
    ``register_hook`` hooks, each given the previous one's result. Collective on
    ``t``'s mesh (see the module's docstring)."""
    hooks = list(t._backward_hooks.values())

    def call():
        out = g
        for hook in hooks:
            new = hook(out)
            if new is not None:
                out = _checked(hook, out, new)
        return out
    return agreed(t._spec.mesh, call, lambda out: out._spec.placements,
                  "a gradient hook (register_hook)")


def post_accumulate_grad_hooks(t: DTensor) -> None:
    """Calls ``t``'s post-accumulate-grad hooks with ``t``. Collective on its mesh."""
    hooks = list(t._post_accumulate_grad_hooks.values())

    def call():
        for hook in hooks:
            out = hook(t)
            # torch 2.13 lets the tensor itself through too.
            if out is None or out is t:
                continue
            if type(out) is not DTensor:
                raise TypeError(
                    f"expected DTensor, but hook returned '{type(out).__name__}'")
            raise RuntimeError("Tensor post accumulate grad hooks should return None.")
    agreed(t._spec.mesh, call, lambda _: 0, "a post-accumulate-grad hook")
