"""Every benchmark script's report step (``--report JSON``): it measures nothing and,
from the results it published, writes the same files again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def report(script: str, results: str, out: Path) -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / script)]
    proc = subprocess.run(
        [*command, "--report", str(RESULTS / results), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize(
    ("script", "name"),
    [
        ("peers.py", "peers"),
        ("fanout.py", "fanout"),
        ("rwlock.py", "rwlock"),
        ("profile_throughput.py", "profile_throughput"),
    ],
)
def test_the_report_step_writes_the_published_files_again(
    tmp_path: Path, script: str, name: str
) -> None:
    report(script, f"{name}.json", tmp_path)
    assert (tmp_path / f"{name}.json").read_text() == (RESULTS / f"{name}.json").read_text()
    assert (tmp_path / f"{name}.md").read_text() == (RESULTS / f"{name}.md").read_text()


@pytest.mark.parametrize("name", ["transport", "transport-uvloop"])
def test_the_transport_report_keeps_its_event_loop(tmp_path: Path, name: str) -> None:
    """Each event loop's results go to its own files (the asyncio results were written
    before the title named the loop: only the table is compared)."""
    report("transport.py", f"{name}.json", tmp_path)
    assert (tmp_path / f"{name}.json").read_text() == (RESULTS / f"{name}.json").read_text()
    ours = (tmp_path / f"{name}.md").read_text().split("\n", 1)[1]
    published = (RESULTS / f"{name}.md").read_text().split("\n", 1)[1]
    assert ours == published
