"""Review of the peer benchmarks (benchmarks/peers.py and its adapters) for fairness
and truth, on the stored results only: nothing here runs a benchmark.

- the README's summary is what the report code makes of the stored peers.json, and a
  few of its ratios recomputed by hand from the raw numbers agree;
- the settings the JSON says were in force for scenario c are those of scenario a
  (the two modes share a name: the first recorded wins).

(The review also showed, on real servers, that an aioredlock attempt short of a quorum
keeps and re-sets its keys: not kept here, as the suite installs no peer library and
skips only for a missing Docker engine; docs/peers.md's "Known asymmetries" has the
measured consequence.)
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture
def lockbench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("lockbench")


def stored() -> Any:
    return json.loads((RESULTS / "peers.json").read_text())


def results_of(report: Any, sid: str, case: str) -> dict[str, Any]:
    (scenario,) = [s for s in report["scenarios"] if s["id"] == sid]
    (found,) = [c for c in scenario["cases"] if c["name"] == case]
    return found["results"]


def test_the_readme_summary_is_the_stored_run(lockbench: ModuleType) -> None:
    """README.md's PEERS-SUMMARY block is exactly what the report code writes from
    benchmarks/results/peers.json (the docs section is checked elsewhere; the README
    block was not), and four of its ratios, recomputed here from the raw numbers
    without the report code, are the ones it prints."""
    peers_report = importlib.import_module("lockbench.peers_report")
    report = stored()
    readme = (ROOT / "README.md").read_text()
    start = readme.index(peers_report.SUMMARY_START) + len(peers_report.SUMMARY_START)
    block = readme[start : readme.index(peers_report.SUMMARY_END)]
    assert block.strip() == peers_report.summary_table(report).strip()

    c5 = results_of(report, "c", "N=5")
    d5 = results_of(report, "d", "N=5")
    e5 = results_of(report, "e", "N=5")
    b_hole = results_of(report, "b", "1 of 5 blackholed")
    ratios = {
        "c N=5": c5["asyncredlock"]["cycles_per_s"] / c5["aioredlock"]["cycles_per_s"],
        "d N=5": d5["asyncredlock"]["acquisitions_per_s"] / d5["aioredlock"]["acquisitions_per_s"],
        "e N=5": e5["pottery"]["wake"]["p50_ms"] / e5["asyncredlock"]["wake"]["p50_ms"],
        "b hole": b_hole["redlock-ng"]["acquire"]["p50_ms"]
        / b_hole["asyncredlock"]["acquire"]["p50_ms"],
    }
    printed = {
        "c N=5": r"\| N=5 \| 7,059 \| aioredlock 1,370 \| ([\d.]+)x the peer's \|",
        "d N=5": r"\| N=5 \| 823 \| aioredlock 478 \| ([\d.]+)x the peer's \|",
        "e N=5": r"\| N=5 \| 1\.19 \| pottery AIORedlock 76\.58 \| ([\d.]+)x faster \|",
        "b hole": r"\| 1 of 5 blackholed \| 3\.47 \| redlock-ng 101\.77 \| ([\d.]+)x faster \|",
    }
    for name, pattern in printed.items():
        match = re.search(pattern, block)
        assert match is not None, name
        shown = float(match.group(1))
        tolerance = 0.005 if shown < 10 else 0.05  # half a unit of the printed digit
        assert abs(ratios[name] - shown) <= tolerance, (name, ratios[name])


@pytest.mark.xfail(
    strict=True,
    reason="scenario c's sessions (THROUGHPUT_MODE, 200 workers) are named 'uncontended' "
    "like scenario a's (1 worker), and Run records settings with setdefault by that name "
    "(benchmarks/lockbench/workloads.py:57 and :198): peers.json says python-redis-lock "
    "ran with threads=1 in every uncontended case, while c ran it with 200 threads",
)
def test_the_settings_of_scenario_c_are_recorded(lockbench: ModuleType) -> None:
    workloads = importlib.import_module("lockbench.workloads")
    adapters = importlib.import_module("lockbench.adapters")
    assert workloads.THROUGHPUT_MODE.workers != adapters.UNCONTENDED.workers
    recorded = stored()["libraries"]["python-redis-lock"]["settings"]
    threads = {mode: settings["threads"] for mode, settings in recorded.items()}
    assert workloads.THROUGHPUT_MODE.workers in threads.values(), threads
