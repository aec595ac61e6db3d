"""The NumPy coverage page (docs/numpy_coverage.md), generated from the registry:
every NumPy function that dispatches to DTensors and every ufunc method, and
whether it runs distributed (a rule of ``mpitensor._ops``) or on the gathered
arrays (the fallback). ``python -m mpitensor._coverage > docs/numpy_coverage.md``
writes it; a test checks that the committed page is current.
"""

from __future__ import annotations

import numpy as np

from . import _registry
from ._ops import _ufunc_methods

_NAMESPACES = (("numpy", np), ("numpy.linalg", np.linalg), ("numpy.fft", np.fft))
_METHODS = ("reduce", "accumulate", "outer", "reduceat", "at")


def _functions() -> list[tuple[str, object]]:
    """(name, function) of every public NumPy function that dispatches on its
    arguments (``__array_function__``), by name."""
    out = {}
    for prefix, module in _NAMESPACES:
        for name in dir(module):
            f = getattr(module, name)
            if not name.startswith("_") and callable(f) and hasattr(f, "_implementation"):
                out.setdefault(f"{prefix}.{name}", f)
    return sorted(out.items())


def _rule(f) -> str:
    impl = _registry.functions.get(f)
    if impl is None:
        return "gathered"
    module = getattr(impl, "__module__", "") or ""
    # Named from mpitensor/_ops, where the rules live, or from the package for
    # the few that live with what they use (np.save's beside the sharded writer).
    path = module.split(".", 1)[-1].replace(".", "/")
    return f"distributed (`{path.removeprefix('_ops/')}.py`)"


def _method_row(ufunc) -> list[str]:
    cells = []
    for m in _METHODS:
        if ufunc.nin != 2 and m != "at":
            cells.append("")
            continue
        # A ufunc that may not be regrouped is folded along a chain of ranks,
        # but for the float results whose bits NumPy's reduce gives otherwise.
        fold = _ufunc_methods._fold
        folded = (ufunc not in fold.REGROUPABLE and fold.foldable(ufunc)
                  and m in ("reduce", "accumulate", "reduceat")
                  and ufunc not in _ufunc_methods._REDUCE)
        if folded and ufunc in fold._FLOATS_NOT_FOLDED:
            floats_only = all(t[-1] in "efdgFDGO" for t in ufunc.types)
            cells.append("gathered" if floats_only
                         else "distributed: integers; floats gathered")
            continue
        regroupable = ufunc in fold.REGROUPABLE or fold.foldable(ufunc)
        known = {"reduce": ufunc in _ufunc_methods._REDUCE or regroupable,
                 "accumulate": ufunc in _ufunc_methods._ACCUMULATE or regroupable,
                 "outer": ufunc.signature is None,
                 "reduceat": regroupable,
                 "at": True}.get(m, False)
        cells.append("distributed" if known else "gathered")
    return cells


def page() -> str:
    """The page's Markdown. Local.

    Example: ``"numpy.sum" in page()`` is True.
    """
    funcs = _functions()
    done = sum(_registry.functions.get(f) is not None for _, f in funcs)
    lines = [
        "# NumPy coverage",
        "",
        "Every NumPy call on DTensors answers with NumPy's value. A call marked",
        "**distributed** runs its rule in the file named, under `mpitensor/_ops` (the",
        "[user guide](user_guide.md) says what each moves; some forms of it still gather,",
        "named there); a call marked",
        "**gathered** has no rule yet: its DTensor arguments are gathered on every rank,",
        "NumPy runs on the whole arrays and the result is replicated, with a",
        "`mpitensor.GatherWarning` (`mpitensor.strict()` makes it a `TypeError`).",
        "Elementwise ufuncs (`np.add(a, b)`, `a + b`, ...) are all distributed.",
        "",
        "This page is generated from the registry: "
        "`python -m mpitensor._coverage > docs/numpy_coverage.md`.",
        "",
        f"## Functions: {done} of {len(funcs)} distributed",
        "",
        "| function | runs |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {_rule(f)} |" for name, f in funcs]
    lines += ["", "## ufunc methods", "",
              "`reduce`, `accumulate` and `reduceat` of a ufunc whose steps may not be "
              "regrouped (`subtract`, `divide`, ...) are NumPy's left fold, bit for bit: "
              "the ranks along the sharded axis continue it in turn from the carry "
              "(one slice per segment) the rank before sends (`_algorithms/_fold.py`). A dtype "
              "without a loop raises NumPy's error. Along a sharded axis, results of "
              "float16, long double or complex dtype gather, and so do those named "
              "below: NumPy's own reduction of them is no fold of its elementwise "
              "steps.", "",
              "| ufunc | " + " | ".join(f"`{m}`" for m in _METHODS) + " |",
              "|---|" + "---|" * len(_METHODS)]
    ufuncs = sorted({getattr(np, n) for n in dir(np) if isinstance(getattr(np, n), np.ufunc)},
                    key=lambda u: u.__name__)
    lines += [f"| `{u.__name__}` | " + " | ".join(_method_row(u)) + " |"
              for u in ufuncs if u.signature is None]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(page(), end="")
