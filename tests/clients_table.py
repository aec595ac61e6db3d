#!/usr/bin/env python
"""Writes docs/ecosystem.md's tables from a run of the client-library tests.

    make ecosystem     # runs tests/python/test_clients_*.py at np 2, then this

Reads the JSON report of that run (MT_TEST_REPORT, written by the conftest) and rewrites the part of
docs/ecosystem.md between its two markers: per library, how many cases give
NumPy's answer, run distributed or through a gather (the NumPy functions that ran
on gathered arrays, named), and which are refused, with the reason the test gives.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

BEGIN, END = "<!-- clients: begin -->", "<!-- clients: end -->"
LIBRARIES = {"test_clients_sklearn.py": "scikit-learn", "test_clients_scipy.py": "SciPy",
             "test_clients_xarray.py": "xarray"}


def case_name(nodeid: str) -> str:
    name = nodeid.split("::", 1)[1]
    m = re.match(r"test_(\w+?)\[(.*)\]$", name)
    return f"{m.group(1)}: {m.group(2)}" if m else name


def tables(report: dict) -> str:
    rows = defaultdict(list)
    for t in report["tests"]:
        lib = LIBRARIES.get(t["nodeid"].split("::")[0].rsplit("/", 1)[-1])
        if lib is None:
            continue
        gathered = t["properties"].get("gathered", "")
        reason = (t["properties"].get("why") or t["why"])[:120] if t["outcome"] != "passed" else ""
        rows[lib].append((case_name(t["nodeid"]), t["outcome"], gathered, reason))
    out = ["| library | cases | NumPy's answer, distributed | NumPy's answer, some call "
           "gathered | refused or failing |", "|---|---|---|---|---|"]
    for lib, cases in rows.items():
        ok = [c for c in cases if c[1] == "passed"]
        out.append(f"| {lib} | {len(cases)} | {sum(1 for c in ok if not c[2])} | "
                   f"{sum(1 for c in ok if c[2])} | {len(cases) - len(ok)} |")
    gathers = defaultdict(set)
    for lib, cases in rows.items():
        for name, outcome, gathered, _ in cases:
            for g in filter(None, gathered.split(",")):
                gathers[(lib, g)].add(name)
    if gathers:
        out += ["", "What ran on gathered arrays (a `GatherWarning` each):", "",
                "| library | NumPy function gathered | cases |", "|---|---|---|"]
        for (lib, g), names in sorted(gathers.items()):
            out.append(f"| {lib} | `{g}` | {len(names)} |")
    refused = [(lib, c) for lib, cases in rows.items() for c in cases if c[1] != "passed"]
    if refused:
        out += ["", "Refused or failing:", "", "| library | case | outcome | why |",
                "|---|---|---|---|"]
        for lib, (name, outcome, _, reason) in refused:
            why = reason.replace("|", "\\|")
            out.append(f"| {lib} | `{name}` | {outcome} | {why} |")
    return "\n".join(out)


def main() -> int:
    report_path, page = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "docs/ecosystem.md"
    with open(report_path) as f:
        report = json.load(f)
    with open(page) as f:
        text = f.read()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(page, "w") as f:
        f.write(head + BEGIN + "\n" + tables(report) + "\n" + END + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
