"""make bench-check's verdicts (benchmarks/redistribute.py): the goals judge np 2,
and at other np each point is watched against the committed run. Plain pytest:
`python -m pytest tests/docs`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # redistribute.py imports _common
spec = importlib.util.spec_from_file_location("redistribute", ROOT / "benchmarks" / "redistribute.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

MiB = 1 << 20


def point(name, nbytes, ratio, lo, hi, overhead=0.5, mt_lo=1.0, mt_hi=2.0):
    return {"transition": name, "bytes": nbytes, "check": True, "summary": {
        "ratio": ratio, "ratio_min": lo, "ratio_max": hi, "overhead_us": overhead,
        "mt": {"median_us": 1.5, "min_us": mt_lo, "max_us": mt_hi}}}


def test_goals_judge_each_point_by_its_limit():
    rows = bench.goal_verdicts([point("S0->R", MiB, 1.05, 1.0, 1.2),
                                point("S1->R", MiB, 1.30, 1.2, 1.4)])
    verdict = {(r["transition"], r["goal"]): r["pass"] for r in rows}
    assert verdict[("S0->R", "dim-0 at >= 1 MiB")] is True
    assert verdict[("S1->R", "inner dims at >= 1 MiB")] is False


def test_the_watch_allows_the_committed_runs_spread_and_no_more():
    committed = [point("S1->R", MiB, 1.5, 1.2, 1.9),       # spread 0.7: limit 2.2
                 point("S0->R", 1024, 1.0, 0.9, 1.1, overhead=0.5, mt_lo=1.0, mt_hi=3.0)]
    now = [point("S1->R", MiB, 2.1, 1.0, 3.0), point("S0->R", 1024, 1.0, 0.9, 1.1,
                                                     overhead=2.4),
           point("P->R", MiB, 9.0, 8.0, 10.0)]            # not in the committed run
    rows = bench.watch_verdicts(now, committed)
    got = {(r["transition"], r["bytes"]): (r["pass"], round(r["limit"], 6)) for r in rows}
    assert got == {("S1->R", MiB): (True, 2.2), ("S0->R", 1024): (True, 2.5)}
    worse = [point("S1->R", MiB, 2.3, 2.0, 2.6), point("S0->R", 1024, 1.0, 0.9, 1.1,
                                                       overhead=2.6)]
    assert [r["pass"] for r in bench.watch_verdicts(worse, committed)] == [False, False]
