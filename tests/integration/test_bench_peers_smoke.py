"""Smoke test of ``benchmarks/peers.py --quick``: it runs, and writes what it promises;
and the harness's own measuring (scenario d's waits and hold counter, scenario e's
wake-up) on made-up holds and locks.

Timings are never asserted: only that every scenario has a result for every library,
numbers where it ran and a reason where it did not, and that every file is written.
Skipped when a peer library is not installed (``pip install -e '.[bench]'`` and
``pip install --no-deps redlock-ng``, see ``benchmarks/requirements-peers.txt``).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from redis.asyncio import Redis

from asyncredlock.testing import ServerGroup

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "peers.py"
MARKER = "<!-- PEERS-TABLE -->"
SUMMARY_START = "<!-- PEERS-SUMMARY -->"
SUMMARY_END = "<!-- /PEERS-SUMMARY -->"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# distribution -> the module it installs
PEER_MODULES = {
    "aioredlock": "aioredlock",
    "pottery": "pottery",
    "redlock-ng": "redlock",
    "python-redis-lock": "redis_lock",
}
MISSING = [
    name for name, module in PEER_MODULES.items() if importlib.util.find_spec(module) is None
]
LIBRARIES = {
    "asyncredlock",
    "asyncredlock-unfenced",
    "asyncredlock-fair",
    "asyncredlock-nopoll",
    "aioredlock",
    "pottery",
    "redlock-ng",
    "redis-py",
    "python-redis-lock",
}
SINGLE_SERVER = {"redis-py", "python-redis-lock"}
STATUSES = {"ok", "hung", "failed", "unavailable", "not_applicable"}
EXPECTED_CASES = {
    "a": {(1, 0.0), (5, 0.0), (1, 2.0), (5, 2.0)},
    "b": {(5, 2.0)},
    "c": {(5, 0.0), (1, 0.0)},
    "d": {(5, 0.0), (1, 0.0)},
    "e": {(1, 0.0), (5, 0.0)},
}
# the numbers each scenario's ok result must hold
OK_FIELDS = {
    "a": ("total", "acquire", "release"),
    "b": ("acquire", "failures"),
    "c": ("cycles_per_s", "cpu_s_per_1000", "failures"),
    "d": ("acquisitions_per_s", "wait", "busy_fraction", "same_worker_again", "failures"),
    "e": ("wake",),
}

# Peers that are not installed (CI installs only the test extra) are not skipped:
# the script must mark them unavailable, with the import error as the reason.


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Run the quick benchmark once, publishing to copies of the docs page and the
    README; its output directory (with ``docs/`` and ``README.md`` inside) and parsed
    JSON."""
    out = tmp_path_factory.mktemp("peers")
    docs = out / "docs"
    docs.mkdir()
    shutil.copyfile(ROOT / "docs" / "peers.md", docs / "peers.md")
    readme = out / "README.md"
    shutil.copyfile(ROOT / "README.md", readme)
    shutil.copyfile(readme, out / "README.before.md")  # README.md may change meanwhile
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--out",
            str(out),
            "--docs",
            str(docs),
            "--readme",
            str(readme),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "peers.json").read_text())


def test_every_scenario_has_every_library(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    assert [s["id"] for s in report["scenarios"]] == list(EXPECTED_CASES)
    for scenario in report["scenarios"]:
        cases = {(c["n"], c["rtt_ms"]) for c in scenario["cases"]}
        assert cases == EXPECTED_CASES[scenario["id"]], scenario["id"]
        for case in scenario["cases"]:
            assert set(case["results"]) == LIBRARIES, (scenario["id"], case["name"])


def test_contention_is_measured_with_shared_clients_separate_clients_and_processes(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _, report = quick_run
    (contention,) = [s for s in report["scenarios"] if s["id"] == "d"]
    assert {c["clients"] for c in contention["cases"]} == {"shared", "each", "processes"}
    processes = [c for c in contention["cases"] if c["clients"] == "processes"]
    # 4 processes of 5 tasks, and 10 of one task each (as web workers are)
    assert report["settings"]["process_cases"] == [[4, 5], [10, 1]]
    assert len(processes) == 2
    for case, (count, tasks) in zip(processes, report["settings"]["process_cases"], strict=True):
        for lib in ("asyncredlock", "asyncredlock-fair"):
            result = case["results"][lib]
            assert result["status"] == "ok", (case["name"], result)
            assert result["processes"] == count
            assert result["workers"] == count * tasks
            # every hold of every process was counted on the separate server: no lost update
            assert result["counter"]["counted"] == result["counter"]["holds"] > 0
            assert result["exclusion_violations"] == 0


def test_each_result_has_numbers_or_a_reason(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    for scenario in report["scenarios"]:
        for case in scenario["cases"]:
            for lib, result in case["results"].items():
                where = (scenario["id"], case["name"], lib)
                assert result["status"] in STATUSES, where
                if result["status"] == "ok":
                    assert result.keys() >= set(OK_FIELDS[scenario["id"]]), where
                    assert_finite_numbers(result, where)
                else:
                    assert isinstance(result["reason"], str), where
                    assert result["reason"].strip(), where


def assert_finite_numbers(result: dict[str, Any], where: object) -> None:
    """Every number in ``result`` (nested summaries too) is finite."""
    for key, value in result.items():
        if isinstance(value, dict):
            assert_finite_numbers(value, where)
        elif isinstance(value, float):
            assert math.isfinite(value), (where, key)


def test_peers_not_installed_are_marked_unavailable(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _, report = quick_run
    for scenario in report["scenarios"]:
        for case in scenario["cases"]:
            for lib in MISSING:
                result = case["results"][lib]
                if result["status"] != "not_applicable":
                    assert result["status"] == "unavailable", (case["name"], lib)
                    assert result["reason"].strip()


def test_single_server_locks_and_the_unfenced_row_are_marked(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _, report = quick_run
    for scenario in report["scenarios"]:
        for case in scenario["cases"]:
            results = case["results"]
            for lib in SINGLE_SERVER:
                if case["n"] > 1:
                    assert results[lib]["status"] == "not_applicable", (case["name"], lib)
            if scenario["id"] in ("c", "d"):
                assert results["asyncredlock-unfenced"]["status"] == "not_applicable"
            if scenario["id"] in ("b", "c", "e"):
                assert results["asyncredlock-nopoll"]["status"] == "not_applicable"


def test_asyncredlock_completes_every_healthy_case(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _, report = quick_run
    for scenario in report["scenarios"]:
        for case in scenario["cases"]:
            assert case["results"]["asyncredlock"]["status"] == "ok", (
                scenario["id"],
                case["name"],
                case["results"]["asyncredlock"],
            )


def test_libraries_versions_and_settings_are_recorded(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _, report = quick_run
    libraries = report["libraries"]
    assert set(libraries) == LIBRARIES
    for lib, info in libraries.items():
        assert info["versions"], lib
        if info["available"]:
            # the fair variant runs in the contention scenario only
            modes = {"contended"} if lib == "asyncredlock-fair" else {"uncontended", "contended"}
            assert info["settings"].keys() >= modes, lib
        else:
            assert info["reason"], lib
    env = report["environment"]
    assert {"python", "redis_py", "server", "cpu_count", "date"} <= env.keys()
    assert report["plan"]["quick"] is True
    assert set(report["measured_rtt"]) == {"0", "2"}


def test_ratio_lines_are_computed_per_case(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _, report = quick_run
    for scenario in report["scenarios"]:
        lines = report["ratios"][scenario["id"]]
        assert len(lines) == len(scenario["cases"])
        for line, case in zip(lines, scenario["cases"], strict=True):
            assert line.startswith(f"{case['name']}: ")


def test_markdown_plot_and_docs_are_written(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, report = quick_run
    table = (out / "peers.md").read_text()
    for scenario in report["scenarios"]:
        assert f"## {scenario['id']}. {scenario['title']}" in table
    assert table.count("**asyncredlock ÷ best peer**") == len(report["scenarios"])
    assert (out / "peers.png").read_bytes().startswith(PNG_MAGIC)
    page = (out / "docs" / "peers.md").read_text()
    head, _, section = page.partition(MARKER + "\n")
    assert head.startswith("# Compared with other libraries")
    assert "### a. " in section
    assert "No results yet" not in section
    assert (out / "docs" / "img" / "peers.png").read_bytes().startswith(PNG_MAGIC)


def test_targets_are_checked_from_the_results(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, report = quick_run
    rows = report["targets"]
    assert {row["target"][0] for row in rows} == {"a", "b", "c", "d", "e"}
    for row in rows:
        assert row["met"] in (True, False, None), row
        assert row["measured"].strip(), row
        if row["met"] is None:
            assert row["value"] is None, row
            assert row["measured"].startswith("not in the results"), row
        else:
            assert isinstance(row["value"], float), row
            assert math.isfinite(row["value"]), row
        if row["met"] is False:
            assert row["result"].startswith("missed: "), row
            assert row["shortfall"] > 0, row
    for page in (out / "peers.md", out / "docs" / "peers.md"):
        text = page.read_text()
        assert "Targets" in text
        assert "| Target | Case | Measured | Result |" in text


def test_rtt_0_cases_run_without_a_proxy(quick_run: tuple[Path, dict[str, Any]]) -> None:
    """A proxy process forwarding every command would cap the rates at RTT 0."""
    _, report = quick_run
    for scenario in report["scenarios"]:
        for case in scenario["cases"]:
            expected = "proxy" if case["rtt_ms"] > 0 or case["fault"] else "direct"
            assert case["via"] == expected, (scenario["id"], case["name"])


def test_readme_summary_is_written_between_its_markers(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    out, report = quick_run
    original = (out / "README.before.md").read_text()
    page = (out / "README.md").read_text()
    head, _, rest = page.partition(SUMMARY_START + "\n")
    summary, _, tail = rest.partition(SUMMARY_END + "\n")
    assert head == original.partition(SUMMARY_START + "\n")[0]
    assert tail == original.partition(SUMMARY_END + "\n")[2]
    assert "| Scenario, metric | Case | asyncredlock | Best peer |" in summary
    rows = [line for line in summary.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + sum(len(s["cases"]) for s in report["scenarios"])
    assert "python benchmarks/peers.py --docs docs --readme README.md" in summary
    assert "Quick run" in summary


def peers(*args: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """``benchmarks/peers.py`` run with ``args`` from the repository root."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_only_rejects_an_unknown_library() -> None:
    proc = peers("--only", "asyncredlock,nosuchlock")
    assert proc.returncode == 2
    assert "nosuchlock" in proc.stderr


def test_a_run_on_uvloop_is_written_apart(tmp_path: Path) -> None:
    """``--loop uvloop``: every library runs on uvloop (the child processes of d too:
    one on another loop fails its case), and the files are ``peers-uvloop.*``."""
    proc = peers(
        *("--quick", "--loop", "uvloop", "--scenarios", "d"),
        *("--only", "asyncredlock", "--out", str(tmp_path)),
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "peers-uvloop.json",
        "peers-uvloop.md",
        "peers-uvloop.png",
    ]
    report = json.loads((tmp_path / "peers-uvloop.json").read_text())
    assert report["environment"]["event_loop"] == "uvloop"
    (contention,) = report["scenarios"]
    results = {c["name"]: c["results"]["asyncredlock"] for c in contention["cases"]}
    assert {name: r["status"] for name, r in results.items()} == dict.fromkeys(results, "ok")
    assert "processes" in {c["clients"] for c in contention["cases"]}
    title = (tmp_path / "peers-uvloop.md").read_text().splitlines()[0]
    assert title == "# asyncredlock and its peers on uvloop"


def test_a_run_on_uvloop_is_not_published() -> None:
    proc = peers("--loop", "uvloop", "--docs", "docs")
    assert proc.returncode == 2
    assert "not with --loop uvloop" in proc.stderr
    uvloop_run = ROOT / "benchmarks" / "results" / "peers-uvloop.json"
    proc = peers("--report", str(uvloop_run), "--readme", "README.md")
    assert proc.returncode == 2
    assert proc.stderr == "peers.py: a run on uvloop is not published: no --docs or --readme\n"


# --- the harness's measuring, without a run ---------------------------------------------


@pytest.fixture
def peers_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("peers")


def test_contention_wait_counts_a_waiter_served_after_the_window(
    peers_module: ModuleType,
) -> None:
    """d's wait counts every acquire() called in the window, not only those that
    returned in it: a waiter that asked at the start and was served only after the
    deadline (a barging lock's starved waiter) waited the whole window, and its wait is
    the longest, though its acquisition is not in the rate."""
    Hold = peers_module.Hold
    start, end = 0.0, 10.0
    # worker 0 barges: takes the lock back every 2 ms for the whole window
    holds = [
        Hold(0, t / 1000, t / 1000, t / 1000 + 0.001, t / 1000 + 0.0011)
        for t in range(0, 10_000, 2)
    ]
    # worker 1 asked at the start and got the lock only after the deadline
    holds.append(Hold(1, 0.0, 10.2, 10.201, 10.2011))
    result = peers_module.contention_result(holds, start, end, workers=2)
    assert result["wait"]["max_ms"] == 10_200
    assert result["wait"]["iterations"] == len(holds)
    assert result["acquisitions"] == len(holds) - 1
    assert result["waits"] == {
        "acquired": len(holds) - 1,
        "acquired_after_window": 1,
        "failed": 0,
        "unfinished": 0,
    }


def test_contention_wait_counts_failed_and_unfinished_acquires(
    peers_module: ModuleType,
) -> None:
    """A failed acquire's wait runs to its error, an unfinished one's to the stop;
    both are in the wait summary and counted apart."""
    Hold, Miss = peers_module.Hold, peers_module.Miss
    holds = [Hold(0, 0.0, 0.001, 0.002, 0.003)]
    misses = [Miss(1, 0.0, 5.0, True), Miss(2, 1.0, 20.0, False)]
    result = peers_module.contention_result(holds, 0.0, 10.0, 3, misses)
    assert result["wait"]["iterations"] == 3
    assert result["wait"]["max_ms"] == 19_000
    assert result["waits"]["failed"] == 1
    assert result["waits"]["unfinished"] == 1


class NeverLock:
    """A "lock" whose acquire() never returns."""

    async def acquire(self) -> None:
        await asyncio.Event().wait()

    async def release(self) -> None:  # pragma: no cover - never acquired
        pass


@pytest.mark.anyio
async def test_the_contention_run_stops_a_wait_that_outlasts_it(
    peers_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acquire() still waiting ``STOP_AFTER`` past the deadline is cancelled and
    recorded as unfinished, its wait running to the stop; it is not a failure."""
    monkeypatch.setattr(peers_module, "STOP_AFTER", 0.05)
    failures = peers_module.Failures()
    deadline = time.monotonic() + 0.01
    holds, misses = await peers_module.contention_holds([NeverLock()], deadline, failures)
    assert holds == []
    (miss,) = misses
    assert not miss.failed
    assert miss.ended >= deadline + 0.05
    assert failures.count == 0


class NoLock:
    """A "lock" that excludes nothing: acquire() returns after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def acquire(self) -> None:
        await asyncio.sleep(self.delay)

    async def release(self) -> None:
        pass


@pytest.mark.anyio
async def test_the_hold_counter_loses_an_update_when_two_holds_overlap(
    peers_module: ModuleType, servers: ServerGroup
) -> None:
    """Scenario d's processes count each hold on a separate server: the count is read
    as the hold begins and written back plus one as it ends, so two holds that overlap
    at all lose an update (a GET and a SET back to back after the hold saw it only if
    those two short read-modify-writes interleaved). Here two workers of a lock that
    excludes nothing take it at once: both read before either hold ends. (With the
    second 0.6 ms after the first, asyncio's millisecond sleeps could end both waits
    in one loop step, the first hold's write then going out before the second's
    read: counted 2 once in a full run.)"""
    counter = Redis.from_url(servers.urls[0])
    try:
        await counter.delete(peers_module.COUNTER_KEY)
        failures = peers_module.Failures()
        holds, misses = await peers_module.contention_holds(
            [NoLock(0.0), NoLock(0.0)],
            time.monotonic() + 0.0002,  # each worker asks once
            failures,
            counter=counter,
        )
        counted = int(await counter.get(peers_module.COUNTER_KEY) or 0)
    finally:
        await counter.aclose()
    assert (len(holds), misses, failures.count) == (2, [], 0)
    a, b = sorted(holds, key=lambda h: h.got)
    assert b.got < a.releasing, "the setup must make the two holds overlap"
    assert counted == 1


class HandingHolder:
    """A holder whose release() hands the lock over at once, then takes a while to
    return (as a release that returns only once every master answered)."""

    def __init__(self, handed: asyncio.Event) -> None:
        self.handed = handed

    async def acquire(self) -> None:
        self.handed.clear()

    async def release(self) -> None:
        self.handed.set()
        await asyncio.sleep(0.005)


class HandedWaiter:
    """A waiter whose acquire() returns as soon as the holder hands the lock over."""

    def __init__(self, handed: asyncio.Event) -> None:
        self.handed = handed

    async def acquire(self) -> None:
        await self.handed.wait()

    async def release(self) -> None:
        pass


@pytest.mark.anyio
async def test_the_wake_up_is_timed_from_the_release_call(peers_module: ModuleType) -> None:
    """Scenario e times the waiter from the holder's release() call, the same point for
    every library: a release that hands over first and returns later (as the Redlock
    peers' wait for every master, and asyncredlock's returns at a quorum) no longer
    moves the start. Timed from release() returning, this wake-up read below zero."""
    handed = asyncio.Event()
    wake, release = await peers_module.wake_trial(
        HandingHolder(handed), HandedWaiter(handed), 0.001, 1.0
    )
    assert 0 <= wake <= release
