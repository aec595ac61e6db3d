"""The covering subset a sweep runs at one, three and four ranks (tests/python/sweeps.py)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import sweeps

pytestmark = pytest.mark.np(1)


def _items(function, **params):
    """Fake collected items of ``function``, one per combination of ``params``'
    values (in pytest's order: the product, the last parameter fastest)."""
    names = list(params)
    return [SimpleNamespace(path="test_x.py", originalname=function,
                            callspec=SimpleNamespace(params=dict(zip(names, combo))))
            for combo in itertools.product(*params.values())]


def _covered(items):
    return {(name, id(value)) for item in items for name, value in item.callspec.params.items()}


def test_every_value_of_every_parameter_runs():
    layouts, calls = [object() for _ in range(5)], [object() for _ in range(7)]
    items = _items("test_f", layout=layouts, call=calls)
    kept, dropped = sweeps.covering(items, 4)
    assert _covered(kept) == _covered(items)
    assert len(kept) == 5 + 7 - 1 and len(kept) + len(dropped) == len(items)
    assert kept == [item for item in items if item in kept]  # collection order


def test_a_mesh_with_two_dims_larger_than_one_meets_every_call():
    layouts = [((4,), "S0"), ((2, 2), ("S0", "S1")), ((1, 4), ("R", "S0"))]
    items = _items("test_f", layout=layouts, call=["x", "y", "z"])
    kept, dropped = sweeps.covering(items, 4)
    assert [i.callspec.params["layout"][0] for i in kept] == [(4,)] * 3 + [(2, 2)] * 3 + [(1, 4)]
    # At another world size the same shape is no mesh of it: covered like the rest.
    assert len(sweeps.covering(items, 2)[0]) == 3 + 2


def test_a_test_that_runs_at_some_sizes_only_runs_whole():
    items = _items("test_f", layout=["a", "b"], call=["x", "y", "z"])
    kept, dropped = sweeps.covering(items, 4, keep=lambda item: True)
    assert kept == items and dropped == []


@pytest.mark.parametrize("marks,some", [
    ([], False), ([pytest.mark.np(1)], True), ([pytest.mark.mpi(ranks=4)], True),
    ([pytest.mark.world(4, reason="a (2, 2) mesh")], True),
    ([pytest.mark.skipif(False, reason="")], False), ([pytest.mark.timeout(5)], False)])
def test_which_tests_run_at_some_sizes_only(marks, some):
    marks = [m.mark for m in marks]
    item = SimpleNamespace(
        get_closest_marker=lambda name: next((m for m in marks if m.name == name), None),
        iter_markers=lambda name: (m for m in marks if m.name == name))
    assert sweeps.runs_at_some_sizes(item) is some


def test_functions_are_covered_each_on_their_own():
    values = [object(), object()]
    items = _items("test_f", a=values, b=values) + _items("test_g", a=values, b=values)
    kept, _ = sweeps.covering(items, 4)
    assert [i.originalname for i in kept] == ["test_f"] * 3 + ["test_g"] * 3


def test_values_that_print_alike_stay_distinct():
    # Two layouts equal as values but distinct entries of the parametrisation.
    items = _items("test_f", layout=[[1, 2], [1, 2]], call=[len])
    assert len(sweeps.covering(items, 4)[0]) == 2


def test_unparametrised_tests_and_single_instances_are_kept():
    plain = SimpleNamespace(path="test_x.py", originalname="test_h")
    one = _items("test_f", layout=[object()], call=[object()])
    assert sweeps.covering([plain, plain] + one, 4) == ([plain, plain] + one, [])


def test_full_sweeps_at_two_ranks_or_when_asked(monkeypatch):
    monkeypatch.delenv("MT_FULL_SWEEPS", raising=False)
    assert [sweeps.full_sweep_at(n) for n in (1, 2, 3, 4)] == [False, True, False, False]
    monkeypatch.setenv("MT_FULL_SWEEPS", "1")
    assert sweeps.full_sweep_at(4)


@pytest.mark.np(2)
def test_no_skipif_skips_a_sweep_where_it_runs_whole(request):
    # Sweeps run whole at two ranks only. A skipif that skips one there, a condition
    # on the world size, leaves its product run whole nowhere: that is a `world`
    # marker, which the covering keeps whole where the test runs. Opt-in runs (a
    # variable the user sets) are the exception.
    from _pytest.skipping import evaluate_condition

    opt_in = {"moves gigabytes: set MT_LARGE=1"}

    skipped = set()
    for item in request.session.items:
        if getattr(item, "callspec", None) is None:
            continue
        for mark in item.iter_markers("skipif"):
            conditions = mark.args or ((mark.kwargs["condition"],) if "condition" in mark.kwargs
                                       else ())
            # A skipif without a condition skips unconditionally, as pytest reads it.
            if mark.kwargs.get("reason") not in opt_in and (not conditions or any(
                    evaluate_condition(item, mark, c)[0] for c in conditions)):
                skipped.add(f"{item.path.name}::{item.originalname}: {mark.kwargs.get('reason')}")
    assert not skipped, sorted(skipped)
