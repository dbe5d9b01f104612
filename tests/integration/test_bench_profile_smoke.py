"""Smoke test of ``benchmarks/profile_throughput.py --quick``: it runs, and writes what
it promises.

Timings are never asserted: only that every configuration ran (or, for a peer library
that is not installed, is marked unavailable with the reason, as in the peers smoke
test), that the counts are there, and that every file is written.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "profile_throughput.py"
OURS = ("asyncredlock", "asyncredlock-nofence", "asyncredlock-noextend", "asyncredlock-plain")
# distribution -> the module it installs
PEER_MODULES = {"pottery": "pottery", "aioredlock": "aioredlock"}
MISSING = {
    name for name, module in PEER_MODULES.items() if importlib.util.find_spec(module) is None
}
CONFIGS = (*OURS, *PEER_MODULES)
PROFILED = ("asyncredlock", "pottery")
GC_FIELDS = ("cpu_s_per_1000", "gen0_per_1000", "gen1_per_1000", "gen2_per_1000")
LAYERS = ("redis-py", "asyncredlock", "asyncio", "other", "gc (collector, from gc.callbacks)")

# Peers that are not installed are not skipped: the script must mark them
# unavailable, with the import error as the reason.


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Run the quick benchmark (with its profile) once; its output directory and JSON."""
    out = tmp_path_factory.mktemp("profile_throughput")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--profile", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "written to" in proc.stderr
    return out, json.loads((out / "profile_throughput.json").read_text())


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.parametrize("config", CONFIGS)
def test_every_configuration_has_cycles_and_cpu(
    quick_run: tuple[Path, dict[str, Any]], config: str
) -> None:
    _, report = quick_run
    record = report["configs"][config]
    if config in MISSING:
        assert record["status"] == "unavailable", record
        assert record["reason"].strip()
        return
    assert record["status"] == "ok", record.get("reason")
    assert len(record["reps"]) == report["plan"]["reps"] == 1
    for rep in record["reps"]:
        assert rep["status"] == "ok", rep
        assert positive(rep["cycles"]), rep
        assert positive(rep["cpu_s_per_1000"]), rep
        for name in GC_FIELDS:
            assert rep["gc"][name] >= 0, (name, rep["gc"])
    summary = record["summary"]
    assert summary["reps_ok"] == 1
    for name in ("cycles_per_s", "cpu_s_per_1000"):
        assert positive(summary[name]["median"]), name
        assert summary[name]["min"] <= summary[name]["median"] <= summary[name]["max"]


@pytest.mark.parametrize("config", CONFIGS)
def test_counts_are_recorded(quick_run: tuple[Path, dict[str, Any]], config: str) -> None:
    _, report = quick_run
    if config in MISSING:  # not installed: marked unavailable, and nothing counted
        record = report["configs"][config]
        assert record["status"] == "unavailable", record
        assert "counts" not in record.get("counting", {})
        return
    n = report["settings"]["n"]
    counting = report["configs"][config]["counting"]
    assert counting["status"] == "ok", counting.get("reason")
    counts = counting["counts"]
    assert positive(counts["cycles"])
    assert counts["commands"] >= 2 * n  # an acquire and a release on each master, at least
    for name in ("commands_per_master", "script_commands", "loop_callbacks"):
        assert positive(counts[name]), name
    assert counts["commands_by_name"]
    if config in OURS:
        assert counts["script_commands"] >= 2 * n  # acquire.lua and release.lua
        assert counts["master_calls"] >= 2 * n
        assert counts["commands_per_master_call"] >= 1
        # calls are futures on one connection per master: no task per call
        assert not any(key.startswith("Node.call") for key in counts["tasks_by_coroutine"])
        assert counts["tasks"] >= 0
        assert counts["commands_per_write"] > 1  # commands of an iteration share a write
    else:
        assert positive(counts["tasks"])
        assert counts["tasks_by_coroutine"]


def test_profile_is_grouped_by_layer(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    assert report["plan"]["profile"] is True
    for config in PROFILED:
        record = report["configs"][config]
        if config in MISSING:
            assert record["status"] == "unavailable"
            continue
        window = record["profile"]
        assert window["status"] == "ok", window.get("reason")
        profile = window["profile"]
        assert positive(profile["cycles"])
        assert positive(profile["profiled_ms_per_cycle"])
        layers = profile["layers_ms_per_cycle"]
        assert set(LAYERS) <= layers.keys()
        assert all(v >= 0 for v in layers.values()), layers
        if config not in OURS:  # asyncredlock's calls do not go through redis-py
            assert positive(layers["redis-py"])
        assert positive(layers["asyncio"])
        assert positive(layers[config])  # the lock library's own code
        assert profile["top_functions"]
    for config in set(CONFIGS) - set(PROFILED) - MISSING:
        assert report["configs"][config]["profile"] is None


def test_environment_and_settings_are_recorded(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    env = report["environment"]
    assert {"python", "redis_py", "server", "cpu_count", "date"} <= env.keys()
    assert report["plan"]["quick"] is True
    assert report["settings"]["workers"] == 200
    assert report["command"].startswith("python benchmarks/profile_throughput.py")


def test_markdown_has_the_tables(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, report = quick_run
    text = (out / "profile_throughput.md").read_text()
    for heading in (
        "## Throughput, client CPU and garbage collection",
        "## Per-cycle counts",
        "### Tasks per cycle by coroutine",
        "## Profile by layer",
        "Quick run",
    ):
        assert heading in text, heading
    assert "| configuration | cycles/s | client CPU s/1000 |" in text
    assert "| configuration | cycles counted | tasks | commands |" in text
    assert "| layer | asyncredlock (defaults) ms/cycle |" in text
    ran = [c for c in report["configs"].values() if c["status"] == "ok"]
    for config in ran:
        assert text.count(f"| {config['label']} |") >= 2, config["label"]  # timed + counts
    for config in MISSING:
        assert f"{report['configs'][config]['label']}: not run (unavailable)" in text
