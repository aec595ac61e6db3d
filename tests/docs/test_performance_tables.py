"""docs/performance.md, docs/plans.md and docs/benchmarks.md show the figures of the
committed benchmark results: their tables are what benchmarks/tables.py makes of benchmarks/results/CPU/*.json, so they
cannot drift from them. Plain pytest: `python -m pytest tests/docs`."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).parents[2]
spec = importlib.util.spec_from_file_location("tables", ROOT / "benchmarks" / "tables.py")
tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tables)


def page() -> str:
    """The pages, one after the other (each table sits on one of them)."""
    return "".join(Path(p).read_text() for p in tables.PAGES)


def test_the_page_shows_the_committed_results():
    results = tables.load(ROOT / "benchmarks" / "results")
    assert results, "no committed results in benchmarks/results"
    assert tables.render(page(), results) == page(), (
        "a page differs from benchmarks/results: run python benchmarks/tables.py")


def test_every_marked_table_has_a_generator():
    names = [m.group(2) for m in tables.MARKER.finditer(page())]
    assert sorted(names) == sorted(tables.TABLES)


def test_a_changed_result_changes_the_page():
    results = tables.load(ROOT / "benchmarks" / "results")
    cpu, key = next((cpu, k) for cpu, rs in results.items() for k in rs
                    if k[0] == "redistribute")
    changed = copy.deepcopy(results)
    changed[cpu][key]["points"][0]["summary"]["ratio"] = 123.456
    assert "123.46 [" in tables.render(page(), changed)
    assert tables.render(page(), changed) != page()


def test_a_benchmark_without_results_says_so():
    text = tables.render(page(), {})
    assert "No committed results of `benchmarks/checkpoint.py` yet" in text
    assert "No committed results of `benchmarks/redistribute.py` yet" in text


def test_each_cpu_section_names_its_commit_and_day():
    results = tables.load(ROOT / "benchmarks" / "results")
    for rs in results.values():
        shown = tables.shown("redistribute", rs)
        if shown:
            m = next(iter(shown.values()))["machine"]
            assert f"commit `{m['commit']}` ({m['date'][:10]})" in page()


def test_results_are_summaries_that_say_where_and_when():
    # Committed results hold a median and its spread per point, never each
    # repetition's time, and name the CPU, the commit and the date of their run.
    paths = sorted((ROOT / "benchmarks" / "results").glob("*/*.json"))
    assert paths
    for path in paths:
        text = path.read_text()
        machine = json.loads(text)["machine"]
        for key in ("cpu", "cores", "np", "mpi", "numpy", "python", "commit", "date"):
            assert machine.get(key) not in (None, "", "?", "unknown"), (path, key)
        assert '"times_s"' not in text and '"times_us"' not in text, path
    assert sum(len(p.read_text().splitlines()) for p in paths) < 5000
