"""Smoke test of ``benchmarks/handover.py --quick``: it runs, and writes what it promises.

Timings are never asserted: only that the rows ran, none overlapped or failed, and the
files and the docs section were written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "handover.py"
START, END = "<!-- HANDOVER-FLOOR -->", "<!-- /HANDOVER-FLOOR -->"


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


def test_an_unknown_row_is_refused_before_measuring(tmp_path: Path) -> None:
    proc = run("--only", "floor,nosuch", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "--only: no row nosuch" in proc.stderr
    assert not (tmp_path / "handover.json").exists()
