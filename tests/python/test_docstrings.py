"""Every public callable of mpitensor has a docstring that shows an example and says
whether it is collective, as the conventions ask (docs/developing.md).

Public means: named in ``__all__`` of mpitensor or of one of its public submodules;
for a class, also its methods and properties that do not start with ``_`` (including
those it inherits from mpitensor classes). Plain Python: runs the same at any np."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

pytestmark = pytest.mark.np(1)

MODULES = ["mpitensor", "mpitensor.device_mesh", "mpitensor.placement_types",
           "mpitensor.debug", "mpitensor.experimental", "mpitensor.nn",
           "mpitensor.nn.functional", "mpitensor.parallel", "mpitensor.checkpoint",
           "mpitensor.testing", "mpitensor.random", "mpitensor.optim",
           "mpitensor.optim.lr_scheduler", "mpitensor.array_api",
           "mpitensor.array_api.linalg", "mpitensor.array_api.fft"]

EXAMPLE = re.compile(r">>>|Example")
COLLECTIVENESS = re.compile(r"\b(Collective|collective|Local|local)\b")


def _ours(obj) -> bool:
    """Defined by mpitensor (its Python code or its C extension), not by NumPy,
    the standard library or Python itself."""
    module = getattr(obj, "__module__", None) or ""
    if isinstance(obj, (property, staticmethod, classmethod)):
        return True
    return module.split(".")[0] == "mpitensor"


def _members(cls):
    """(name, member, docstring) of the public methods and properties of cls, from
    cls and the mpitensor classes it inherits from. An override without a docstring
    has the docstring of the method it overrides, as in ``help()``."""
    found = {}
    for klass in cls.__mro__:
        if not _ours(klass):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or not (callable(member) or isinstance(
                    member, (property, staticmethod, classmethod))):
                continue
            if name not in found:
                found[name] = [member, _doc(member)]
            elif not found[name][1]:
                found[name][1] = _doc(member)
    return [(name, member, doc) for name, (member, doc) in found.items()]


def _doc(member) -> str:
    if isinstance(member, property):
        return inspect.cleandoc(member.__doc__ or "")
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    return inspect.cleandoc(getattr(member, "__doc__", None) or "")


def public_api() -> dict[str, str]:
    """``{"mpitensor.debug.CommDebugMode.get_comm_counts": docstring}`` for every
    public callable, each listed once under the first name that reaches it (a method
    inherited by several classes under the class that defines it)."""
    api: dict[str, str] = {}
    done: set[int] = set()
    for modname in MODULES:
        module = importlib.import_module(modname)
        for name in module.__all__:
            obj = getattr(module, name)
            # NumPy's own functions and dtypes, which the array API namespace
            # re-exports, are documented by NumPy.
            if not callable(obj) or id(obj) in done or not _ours(obj):
                continue
            done.add(id(obj))
            api[f"{modname}.{name}"] = _doc(obj)
            if inspect.isclass(obj):
                for mname, member, doc in _members(obj):
                    if id(member) not in done:
                        done.add(id(member))
                        api[f"{modname}.{name}.{mname}"] = doc
    return api


def problems(api: dict[str, str]) -> list[str]:
    out = []
    for qualname, doc in api.items():
        missing = [what for what, pattern in (("an example", EXAMPLE),
                                              ("whether it is collective", COLLECTIVENESS))
                   if not pattern.search(doc)]
        if missing:
            out.append(f"{qualname}: docstring lacks {' and '.join(missing)}")
    return out


def test_the_walk_finds_the_public_api():
    api = public_api()
    for name in ("mpitensor.DTensor.redistribute", "mpitensor.DTensor.placements",
                 "mpitensor.DeviceMesh.get_group", "mpitensor.Shard.is_shard",
                 "mpitensor.debug.CommDebugMode.get_comm_counts",
                 "mpitensor.nn.functional.softmax", "mpitensor.parallel.parallelize_module",
                 "mpitensor.random.initial_seed", "mpitensor.testing.assert_close"):
        assert name in api, name
    assert len(api) > 100


def test_the_check_can_fail():
    def no_doc():
        pass

    def only_example():
        """>>> only_example()"""

    def complete():
        """Local.

        >>> complete()
        """

    found = problems({"a": _doc(no_doc), "b": _doc(only_example), "c": _doc(complete),
                      "d": _doc(property(lambda self: None, doc="Collective."))})
    assert found == ["a: docstring lacks an example and whether it is collective",
                     "b: docstring lacks whether it is collective",
                     "d: docstring lacks an example"]


def test_every_public_callable_has_an_example_and_says_if_collective():
    found = problems(public_api())
    assert not found, f"{len(found)} public callables:\n" + "\n".join(found)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
