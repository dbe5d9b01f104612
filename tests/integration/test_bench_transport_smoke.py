"""Smoke test of ``benchmarks/transport.py --quick``: it runs every candidate (or says
why one is unavailable) and writes its files. Timings are never asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "transport.py"
ALWAYS = ("link-redispy", "link-plain", "redis-py")  # what the test extra installs
OPTIONAL = {"glide": "glide", "coredis": "coredis"}  # candidate -> module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("transport")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--duration", "0.2", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads((out / "transport.json").read_text())


def test_every_candidate_ran_or_says_why_not(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    candidates = report["candidates"]
    assert set(candidates) == {*ALWAYS, *OPTIONAL}
    for name, module in OPTIONAL.items():
        if importlib.util.find_spec(module) is None:
            assert candidates[name]["status"] == "unavailable"
            assert candidates[name]["reason"].strip()
    for name, record in candidates.items():
        if name in ALWAYS:
            assert record["status"] == "ok", record.get("reason")
        if record["status"] != "ok":
            continue
        (rep,) = record["reps"]
        assert rep["cycles_per_s"] > 0
        assert rep["cpu_s_per_1000"] > 0
        assert 0 < rep["p50_ms"] <= rep["p99_ms"]
        assert rep["refused"] == 0  # distinct keys: every acquisition took its quorum


def test_one_connection_per_master_for_the_link(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    for name in ("link-redispy", "link-plain"):
        (rep,) = report["candidates"][name]["reps"]
        assert rep["connections_per_master"] == 1


def test_nothing_left_and_files_written(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, report = quick_run
    assert report["keys_left"] == 0
    assert report["plan"]["quick"] is True
    text = (out / "transport.md").read_text()
    assert "| candidate |" in text
    assert "Quick run" in text
