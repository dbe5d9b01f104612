"""The transport benchmark's report: from its results (``transport.json``, or
``transport-uvloop.json`` under uvloop) to the markdown table and the docs page.

``transport.py`` measures and writes the JSON through `write_outputs`; ``python
benchmarks/transport.py --report results/transport.json`` runs this step alone on
results already written. The types here are the JSON's shape, for both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NotRequired, TypedDict

from .harness import Environment, Spread, publish_between, write_json, write_text


class Throughput(TypedDict):
    """200 workers on distinct keys for the window."""

    cycles_per_s: float
    cpu_s_per_1000: float  # client CPU s per 1,000 cycles
    refused: int  # acquisitions that did not take their quorum


class Latency(TypedDict):
    """One worker's cycles, in milliseconds."""

    p50_ms: float
    p99_ms: float


class ColdStart(TypedDict):
    """A fresh client and 200 callers at once."""

    first_200_ms: float  # until all 200 first cycles are done
    connections_per_master: int  # opened by the client


class Sample(Throughput, Latency, ColdStart):
    """One rep of one candidate: every measure, in that order."""


class _Candidate(TypedDict):
    label: str
    reps: list[Sample]


class Measured(_Candidate):
    """A candidate that ran every rep, and its spread per measure (`Sample`'s keys)."""

    status: Literal["ok"]
    summary: dict[str, Spread]


class Unavailable(_Candidate):
    """A candidate that did not import or failed (its reps up to then are kept)."""

    status: Literal["unavailable"]
    reason: str


CandidateRecord = Measured | Unavailable


class Plan(TypedDict):
    """How the run was made."""

    duration: float  # seconds per throughput window
    reps: int
    count: int  # one worker's cycles
    quick: bool
    loop: NotRequired[str]  # "asyncio" or "uvloop"; results from before --loop: asyncio


class TransportReport(TypedDict):
    """``transport.json``: what was run, on what, and what came out."""

    benchmark: str
    command: str
    plan: Plan
    environment: Environment
    candidates: dict[str, CandidateRecord]  # by candidate id, in the order they ran
    keys_left: int  # lock keys found on the servers afterwards (0: every release landed)


def loop_of(report: TransportReport) -> str:
    """The event loop the report's numbers were measured on."""
    return report["plan"].get("loop", "asyncio")


def cell(spread: Spread, digits: int = 0) -> str:
    """``median (min-max)`` with ``digits`` decimals."""
    low, high = spread["min"], spread["max"]
    return f"{spread['median']:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def row(record: CandidateRecord) -> str:
    """One candidate's row of the table."""
    if record["status"] != "ok":
        return f"| {record['label']} | unavailable: {record['reason']} |||||||"
    s = record["summary"]
    return (
        f"| {record['label']} | {cell(s['cycles_per_s'])} | {cell(s['cpu_s_per_1000'], 3)} "
        f"| {cell(s['p50_ms'], 3)} | {cell(s['p99_ms'], 3)} | {cell(s['first_200_ms'], 1)} "
        f"| {s['connections_per_master']['median']:g} |"
    )


def markdown(report: TransportReport) -> str:
    """The results page: title, how it was measured, the table and the machine."""
    plan, env = report["plan"], report["environment"]
    quick = "\n**Quick run: too short to mean anything.**\n" if plan["quick"] else ""
    return (
        f"# The transport: candidates side by side (N = 5, loopback, no proxy, "
        f"{loop_of(report)})\n\n"
        f"Each candidate runs the same cycle (acquire script on 5 masters decided at 3, "
        f"then release decided at 3; the other replies awaited too). {plan['reps']} "
        f"reps, candidates taking turns; 200 workers for {plan['duration']:g} s; "
        f"one worker for {plan['count']} cycles; a cold burst of 200. "
        f"Median (min-max). Keys left on the servers afterwards: {report['keys_left']}.\n"
        + quick
        + "\n| candidate | cycles/s, 200 workers | client CPU s/1000 | 1 worker p50 (ms) "
        "| 1 worker p99 (ms) | cold burst of 200 (ms) | connections per master |\n"
        "|---|--:|--:|--:|--:|--:|--:|\n"
        + "\n".join(row(record) for record in report["candidates"].values())
        + f"\n\nPython {env['python']}, redis-py {env['redis_py']}, hiredis {env['hiredis']}, "
        f"{env['server']}, {env['cpu_count']} CPUs ({env['cpu_model']}), {env['date']}. "
        f"Command: `{report['command']}`.\n"
    )


def write_outputs(report: TransportReport, out: Path, docs: Path | None) -> None:
    """JSON and markdown into ``out``, the table into ``docs``' transport page if given:
    the files and section of the report's event loop (``transport-uvloop.*`` and
    ``TRANSPORT-TABLE-uvloop`` under uvloop)."""
    loop = loop_of(report)
    suffix = "" if loop == "asyncio" else f"-{loop}"
    text = markdown(report)
    write_json(out / f"transport{suffix}.json", report)
    write_text(out / f"transport{suffix}.md", text)
    if docs is not None:
        marker = f"TRANSPORT-TABLE{suffix}"
        table = text.split("\n\n", 2)[2]  # after the title and the prose
        publish_between(docs / "transport.md", f"<!-- {marker} -->", f"<!-- /{marker} -->", table)
