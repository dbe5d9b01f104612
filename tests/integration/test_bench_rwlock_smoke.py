"""Smoke test of ``benchmarks/rwlock.py --quick``: it runs, and writes what it promises.

Timings are never asserted: only that every case was measured and every file written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "rwlock.py"
MARKER = "<!-- RWLOCK-BENCH -->"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODES = {"readers first (patience=inf)", "default (patience=1 s)", "patience=0.1 s", "fair"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Run the quick benchmark once, publishing into a copy of the docs page."""
    out = tmp_path_factory.mktemp("rwlock")
    docs = out / "docs"
    docs.mkdir()
    (docs / "rwlock.md").write_text(f"# page\n\n{MARKER}\n\nold table\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--docs", str(docs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "rwlock.json").read_text())


def test_readers_are_measured_against_the_exclusive_lock(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _, report = quick_run
    readers = report["readers"]
    assert {name.split()[0] for name in readers} == {"read", "exclusive"}
    for result in readers.values():
        assert result["cycles"] > 0
        assert result["cycles_per_s"] > 0
        assert result["acquire"]["iterations"] == result["cycles"]


def test_every_mode_has_a_writer_result(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    assert set(report["writer_wait"]) == MODES
    for result in report["writer_wait"].values():
        assert result["reads"] > 0  # the readers ran
        assert result["writes"] + result["writer_timeouts"] > 0  # and the writer tried
        if result["writes"]:
            assert result["writer_wait"]["iterations"] == result["writes"]


def test_files_and_docs_section_are_written(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, report = quick_run
    table = (out / "rwlock.md").read_text()
    assert table.count("\n| ") == len(report["readers"]) + len(report["writer_wait"]) + 2
    assert (out / "rwlock.png").read_bytes().startswith(PNG_MAGIC)
    assert (out / "docs" / "img" / "rwlock.png").read_bytes().startswith(PNG_MAGIC)
    page = (out / "docs" / "rwlock.md").read_text()
    assert "old table" not in page
    assert page.split(MARKER, 1)[1].strip() == table.strip()
    assert {"python", "redis_py", "server", "date"} <= report["environment"].keys()
