"""Smoke test of ``benchmarks/otel_overhead.py --quick``: every setup ran in its own
interpreter, found (or did not find) the OpenTelemetry API as it should, made spans and
metric points only with the SDK, and the files are written. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "otel_overhead.py"


def test_quick_run_measures_every_setup(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "otel_overhead.json").read_text())
    runs = data["runs"]
    assert set(runs) == {"absent", "api", "sdk"}
    for setup, (run,) in runs.items():
        assert run["cycles"] > 0, setup
        assert run["failures"] == 0, setup
        assert run["telemetry"] is (setup != "absent"), setup
    sdk = runs["sdk"][0]
    # acquire and release spans, acquire and hold durations: two of each per cycle
    assert sdk["spans_per_cycle"] == 2
    assert sdk["points_per_cycle"] == 2
    assert runs["api"][0]["spans_per_cycle"] is None
    table = (tmp_path / "otel_overhead.md").read_text()
    assert all(f"| {setup} |" in table for setup in runs)
