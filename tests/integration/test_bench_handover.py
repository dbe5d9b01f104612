"""Smoke test of ``benchmarks/handover.py --quick``: it runs, and writes what it promises.

Timings are never asserted: only that the rows ran, none overlapped or failed, and the
files and the docs section were written.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "handover.py"
START, END = "<!-- HANDOVER-FLOOR -->", "<!-- /HANDOVER-FLOOR -->"
QUERY_START, QUERY_END = "<!-- HANDOVER-QUERY -->", "<!-- /HANDOVER-QUERY -->"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The quick run of two rows, once: its output directory and parsed JSON."""
    out = tmp_path_factory.mktemp("handover")
    (out / "docs").mkdir()
    (out / "docs" / "peers.md").write_text(f"intro\n{START}\nold table\n{END}\nend\n")
    proc = run(
        "--quick", "--only", "floor,asyncredlock", "--out", str(out), "--docs", str(out / "docs")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "handover.json").read_text())


def test_each_row_ran_without_overlap_or_failure(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    assert list(report["rows"]) == ["floor model", "asyncredlock"]
    for runs in report["rows"].values():
        (only,) = runs
        assert only["status"] == "ok"
        assert only["acquisitions"] > 0
        assert only["exclusion_violations"] == 0
        assert only["failures"] == 0
        assert only["client_cpu_ms_per_hold"] > 0
        assert only["hold_p50_ms"] > 0
        assert only["handover_p50_ms"] > 0


def test_the_table_and_the_docs_section_are_written(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    out, _ = quick_run
    table = (out / "handover.md").read_text()
    assert "| floor model |" in table
    assert "| asyncredlock |" in table
    page = (out / "docs" / "peers.md").read_text()
    assert "old table" not in page
    assert page.startswith(f"intro\n{START}\n")
    assert page.endswith(f"{END}\nend\n")
    assert "| floor model |" in page
    assert "**The floor of a hand-over between clients (quick smoke run" in page
    assert "### The floor of a hand-over between clients" in table
    assert "###" not in page  # the page's following text stays under its own heading


def test_holds_that_are_queries_are_measured_and_written_apart(tmp_path: Path) -> None:
    """``--hold query``: every hold a query to the hold service; its own files and docs
    section, the sleep's section left alone."""
    (tmp_path / "docs").mkdir()
    page = f"intro\n{START}\nsleep table\n{END}\n{QUERY_START}\nold\n{QUERY_END}\nend\n"
    (tmp_path / "docs" / "peers.md").write_text(page)
    proc = run(
        *("--quick", "--hold", "query", "--only", "asyncredlock"),
        *("--out", str(tmp_path), "--docs", str(tmp_path / "docs")),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "handover-query.json").read_text())
    assert report["hold"] == "query"
    ((only,),) = report["rows"].values()
    assert only["status"] == "ok"
    assert only["acquisitions"] > 0
    assert only["exclusion_violations"] == only["failures"] == 0
    assert not (tmp_path / "handover.json").exists()
    assert "the hold a query" in (tmp_path / "handover-query.md").read_text()
    written = (tmp_path / "docs" / "peers.md").read_text()
    assert f"{START}\nsleep table\n{END}" in written
    assert "\nold\n" not in written
    assert "| asyncredlock |" in written.split(QUERY_START)[1]


def test_an_unknown_row_is_refused_before_measuring(tmp_path: Path) -> None:
    proc = run("--only", "floor,nosuch", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "--only: no row 'nosuch'" in proc.stderr
    assert not (tmp_path / "handover.json").exists()


@pytest.mark.parametrize("only", ["", "floor,floor", "floor,"])
def test_an_empty_or_repeated_row_is_refused(tmp_path: Path, only: str) -> None:
    proc = run("--only", only, "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "--only:" in proc.stderr
    assert not (tmp_path / "handover.json").exists()


def _run(rate: float, *, same: float | None = 0.0, parts: bool = True) -> dict[str, Any]:
    """A made-up ok run of one row (``parts``: with the hold and hand-over times,
    which results written before them lack)."""
    wait = {"p50_ms": 10.0, "p99_ms": 20.0}
    cycle = {"hold_p50_ms": 1.25, "handover_p50_ms": 0.5} if parts else {}
    return {
        "status": "ok",
        "acquisitions_per_s": rate,
        "wait": wait,
        **cycle,
        "same_worker_again": same,
        "client_cpu_ms_per_hold": 0.5,
        "servers_cpu_ms_per_hold": None,
        "exclusion_violations": 0,
        "failures": 0,
    }


@pytest.fixture
def report_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("lockbench.handover_report")


def made_up(rows: dict[str, list[dict[str, Any]]], *, quick: bool = False) -> dict[str, Any]:
    """A report of made-up ``rows`` (their runs, one per repetition)."""
    environment = dict.fromkeys(
        ("date", "cpu_model", "platform", "python", "redis_py", "hiredis", "server"), "x"
    )
    return {
        "environment": {**environment, "cpu_count": 2, "asyncredlock": "0"},
        "masters": 5,
        "clients": 10,
        "hold_s": 0.001,
        "seconds_per_run": 1.0 if quick else 8.0,
        "repetitions": max(len(runs) for runs in rows.values()),
        "quick": quick,
        "rows": rows,
    }


def test_the_report_pairs_repetitions_and_tolerates_gaps(report_module: ModuleType) -> None:
    """Ratios pair the runs of one repetition, a failed run drops out of its pair, a
    lone run shows no range, and a run without a pair of holds has no same-worker
    figure."""
    failed = {"status": "failed", "reason": "no acquisition"}
    report = made_up(
        {
            "floor model": [_run(700.0), _run(650.0)],
            "asyncredlock": [failed, _run(450.0, same=None, parts=False)],
            "aioredlock": [_run(500.0, same=0.97), _run(500.0, same=0.99)],
        }
    )
    lines = report_module.table(report).splitlines()
    assert "| floor model | 675 (650-700) | 1.35x (1.30-1.40) |" in "\n".join(lines)
    ours = next(line for line in lines if line.startswith("| asyncredlock |"))
    assert ours.startswith(
        "| asyncredlock | 450 | 0.90x | 10.00 | 20.00 | n/a | n/a | n/a | 0.500 | n/a |"
    )
    theirs = "| aioredlock | 500 (500-500) | 1.00x | 10.00 | 20.00 | 1.25 | 0.50 | 98% |"
    assert theirs in "\n".join(lines)
    assert "- The floor model measured 1.35x aioredlock's rate (1.30-1.40)." in "\n".join(lines)
    assert "asks a lock for 0.96x the model's rate (0.93-1.00)" in "\n".join(lines)
    assert "- asyncredlock: 0.69x the floor model's rate." in lines
    assert "- aioredlock: 0.74x the floor model's rate (0.71-0.77)." in lines


def test_the_report_says_what_a_hold_was(report_module: ModuleType) -> None:
    """A report without ``hold`` (an older run) is one of sleeps."""
    report = made_up({"floor model": [_run(700.0)]})
    assert "each hold `asyncio.sleep` of 1 ms" in report_module.table(report)
    text = report_module.table({**report, "hold": "query"})
    assert text.startswith("### The floor of a hand-over between clients, the hold a query\n")
    assert "each hold a query to another process answered after 1 ms" in text


def test_a_row_that_never_ran_is_reported_with_its_reason(report_module: ModuleType) -> None:
    failed = {"status": "failed", "reason": "not installed: aioredlock"}
    report = made_up({"floor model": [_run(700.0)], "aioredlock": [failed]}, quick=True)
    text = report_module.table(report)
    assert "| aioredlock | failed: not installed: aioredlock |" in text
    assert "| floor model | 700 | n/a |" in text
    assert "quick smoke run: not a measurement" in text
    assert "The floor model measured" not in text  # nothing to compare with


def test_a_cycle_is_split_into_the_hold_and_the_hand_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hold: ``acquire()`` returned to ``release()`` called; hand-over: ``release()``
    called to the next holder's ``acquire()`` returning (holds taken in the order they
    began, those that began after the window left out); medians, in ms."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    handover = importlib.import_module("handover")
    hold = importlib.import_module("peers").Hold
    holds = [  # worker, asked, got, releasing, released (seconds)
        hold(1, 0.0, 1.0020, 1.0035, 1.0036),
        hold(0, 0.0, 1.0000, 1.0012, 1.0013),
        hold(2, 0.0, 1.0045, 1.0058, 1.0059),
        hold(0, 0.0, 9.0000, 9.0050, 9.0051),  # began after the window
    ]
    parts = handover.cycle_parts(holds, end=5.0)
    assert parts == {"hold_p50_ms": 1.3, "handover_p50_ms": 0.9}
    assert handover.cycle_parts([], end=5.0) == {"hold_p50_ms": None, "handover_p50_ms": None}
    lone = handover.cycle_parts(holds[:1], end=5.0)
    assert lone == {"hold_p50_ms": 1.5, "handover_p50_ms": None}  # no next holder
