"""Smoke test of ``benchmarks/scale.py --quick``: it runs, measures every case, writes
what it promises into the real docs page's markers, and its report step writes the
same files again. No timing is asserted: only counts, keys and the files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "scale.py"
START, END = "<!-- SCALE-BENCH -->", "<!-- /SCALE-BENCH -->"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

Run = tuple[Path, dict[str, Any]]


def run_script(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Run the quick benchmark once, publishing into a copy of ``docs/scale.md``."""
    out = tmp_path_factory.mktemp("scale")
    docs = out / "docs"
    docs.mkdir()
    shutil.copyfile(ROOT / "docs" / "scale.md", docs / "scale.md")
    run_script("--quick", "--out", str(out), "--docs", str(docs))
    return out, json.loads((out / "scale.json").read_text())


def test_every_locker_cycled_without_a_failure(quick_run: Run) -> None:
    _, report = quick_run
    settings = report["settings"]
    assert settings["masters"] == [3]
    lockers = report["lockers"]
    assert [(r["masters"], r["clients"]) for r in lockers] == [(3, 1), (3, settings["clients"])]
    for r in lockers:
        assert r["failures"] == {}
        assert r["cycles"] > 0
        assert r["cycle"]["iterations"] == r["cycles"]
        assert r["counters"]["releases"] >= r["cycles"]
        assert r["server_commands_per_cycle"] > 0
        assert len(r["server_cpu_s_per_1000_by_master"]) == 3
        # a command connection per client, and a subscriber one if it ever waited
        assert all(r["clients"] <= c <= 2 * r["clients"] for c in r["connections_by_master"])


def test_held_locks_leave_only_their_fence_counters(quick_run: Run) -> None:
    _, report = quick_run
    n = report["settings"]["resources"]
    fenced, plain = report["resources"]
    assert (fenced["fencing"], plain["fencing"]) == (True, False)
    for r in (fenced, plain):
        assert r["failures"] == {}
        assert r["held"] == r["resources"] == n
        assert r["other_keys_left"] == [0, 0, 0], r["other_keys_sample"]
        assert r["released"]["dbsize"] == r["fence_keys_left"]
        assert all(b > 0 for b in r["bytes_per_held_lock"])
        assert r["client_bytes_per_held_lock"] > 0
    assert fenced["holding"]["dbsize"] == [2 * n] * 3  # lock keys and fence counters
    assert plain["holding"]["dbsize"] == [n] * 3
    assert fenced["fence_keys_left"] == [n] * 3
    assert plain["fence_keys_left"] == [0] * 3
    assert set(fenced["memory_usage"]) == {"lock key", "fence counter"}
    assert set(plain["memory_usage"]) == {"lock key"}
    # a counter is left per resource with fencing, nothing without
    for counter, nothing in zip(
        fenced["bytes_left_per_resource"], plain["bytes_left_per_resource"], strict=True
    ):
        assert counter > nothing


def test_files_and_the_docs_section_are_written(quick_run: Run) -> None:
    out, report = quick_run
    table = (out / "scale.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 + len(report["lockers"]) + len(report["resources"])  # 2 headers
    assert (out / "scale.png").read_bytes().startswith(PNG_MAGIC)
    assert (out / "docs" / "img" / "scale.png").read_bytes().startswith(PNG_MAGIC)
    page = (out / "docs" / "scale.md").read_text()
    published = page.split(START, 1)[1].split(END, 1)[0]
    assert "Not yet measured" not in published
    assert published.strip() == table.removeprefix("# Scale\n").strip()
    original = (ROOT / "docs" / "scale.md").read_text()
    assert page.split(END, 1)[1] == original.split(END, 1)[1]  # the plan is kept
    assert {"python", "redis_py", "server", "date"} <= report["environment"].keys()


def test_the_report_step_writes_the_same_files(quick_run: Run, tmp_path: Path) -> None:
    out, _ = quick_run
    run_script("--report", str(out / "scale.json"), "--out", str(tmp_path))
    for name in ("scale.json", "scale.md"):
        assert (tmp_path / name).read_text() == (out / name).read_text()
