"""Smoke test of ``benchmarks/fanout.py --quick``: it runs, and writes what it promises.

Timings are never asserted: only that every case was measured and every file written.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "fanout.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STATS = {"iterations", "p50_ms", "p90_ms", "p99_ms", "mean_ms"}
METHODS = ("sequential", "asyncredlock", "asyncredlock_fenced", "asyncredlock_fenced_apart")
FENCED = {"asyncredlock_fenced": 0, "asyncredlock_fenced_apart": 1}  # extra rounds expected
FENCING_FIELDS = ("cost_p50_ms", "cost_rtts", "acquire_ratio", "release_cost_p50_ms")
EXPECTED_CASES = {(n, rtt, False) for n in (1, 3, 5, 7) for rtt in (0.0, 2.0, 10.0)} | {
    (5, 2.0, True)
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Run the quick benchmark once; its output directory and parsed JSON."""
    out = tmp_path_factory.mktemp("fanout")
    readme = out / "README.md"
    readme.write_text("intro\n<!-- BENCH-SUMMARY -->\nold table\n<!-- /BENCH-SUMMARY -->\nend\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--readme", str(readme)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "fanout.json").read_text())


def methods_of(case: dict[str, Any]) -> set[str]:
    """The methods measured in ``case``: all but counters apart with one master."""
    return set(METHODS) - ({"asyncredlock_fenced_apart"} if case["n"] == 1 else set())


def test_every_case_is_measured_by_every_method(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _, report = quick_run
    cases = report["cases"]
    assert {(c["n"], c["rtt_ms"], c["blackholed"]) for c in cases} == EXPECTED_CASES
    for case in cases:
        assert case["iterations"] > 0
        assert case["speedup_p50"] > 0
        assert set(case["methods"]) == methods_of(case)
        for method in methods_of(case):
            for phase in ("total", "acquire", "release"):
                stats = case["methods"][method][phase]
                assert stats.keys() >= STATS
                assert stats["iterations"] == case["iterations"]


def test_every_case_records_the_fencing_cost(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    for case in report["cases"]:
        fenced = methods_of(case) & FENCED.keys()
        assert set(case["fencing"]) == fenced
        for method in fenced:
            record = case["fencing"][method]
            for name in FENCING_FIELDS:
                assert isinstance(record[name], float | int), (method, name)
                assert math.isfinite(record[name]), (method, name)
            assert record["extra_rounds_expected"] == FENCED[method]
            assert record["acquisitions"] == case["iterations"]
        rtt = report["measured_rtt"][f"{case['rtt_ms']:g}"]["p50_ms"]
        assert case["measured_rtt_p50_ms"] == rtt
        for method in methods_of(case) - {"sequential"}:
            assert {"in_flight", "background_tasks"} <= case[f"{method}_statistics"].keys()


def test_commit_rounds_are_skipped_in_step_and_run_apart(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    """Counters apart: every acquisition ran its commit round (else the skew missed).
    In step: most skip it (one may still commit after a master missed a round)."""
    _, report = quick_run
    for case in report["cases"]:
        in_step = case["fencing"]["asyncredlock_fenced"]
        assert 0 <= in_step["commit_rounds"] < in_step["acquisitions"], case["name"]
        if case["n"] > 1:
            apart = case["fencing"]["asyncredlock_fenced_apart"]
            assert apart["commit_rounds"] >= apart["acquisitions"], case["name"]


def test_environment_is_recorded(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    env = report["environment"]
    assert {"python", "redis_py", "server", "cpu_count", "date"} <= env.keys()
    assert report["plan"]["quick"] is True
    assert set(report["measured_rtt"]) == {"0", "2", "10"}


def test_table_and_plot_are_written(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, report = quick_run
    table = (out / "fanout.md").read_text()
    assert table.count("\n| ") == len(report["cases"]) + 1  # header + one row per case
    header = table.split("\n| ", 1)[1].split("\n", 1)[0]
    assert "asyncredlock fenced p50 (ms)" in header
    assert "fenced, counters apart p50 (ms)" in header
    assert "fencing cost, in step (RTTs)" in header
    assert "fencing cost, apart (RTTs)" in header
    assert "Fencing cost, counters in step (" in table  # the findings under the table
    assert "Fencing cost, counters apart (" in table
    assert "Commit rounds run by the measured acquisitions" in table
    assert (out / "fanout.png").read_bytes().startswith(PNG_MAGIC)


def test_readme_summary_is_replaced_between_its_markers(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    out, report = quick_run
    text = (out / "README.md").read_text()
    assert text.startswith("intro\n<!-- BENCH-SUMMARY -->\n")
    assert text.endswith("<!-- /BENCH-SUMMARY -->\nend\n")
    assert "old table" not in text
    rows = [c for c in report["cases"] if c["n"] in (3, 5)]
    assert text.count("\n| ") == len(rows) + 1  # header + one row per N = 3, 5 case
