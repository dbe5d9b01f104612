"""What asyncredlock's OpenTelemetry instrumentation costs on the throughput workload.

Scenario c of ``peers.py`` (200 workers, each on its own key, acquire + release cycles
of asyncredlock with its defaults for a fixed time over N masters), run in a fresh
interpreter for each of three setups:

- **absent**: the ``opentelemetry`` package made unimportable before asyncredlock is
  imported, as for a user without the ``otel`` extra: every hook returns at once;
- **api**: the OpenTelemetry API importable and no SDK configured, as for a library
  user who never sets OpenTelemetry up (the API's no-op tracer and meter). The
  promise: under 3 % fewer cycles/s than **absent**;
- **sdk**: the SDK configured, every span sampled: a ``TracerProvider`` with a
  ``BatchSpanProcessor`` into an exporter that counts and drops the spans, and a
  ``MeterProvider`` with an in-memory reader collected once at the end. What tracing
  every lock operation costs (the spans are made, batched and handed over; nothing is
  serialized or sent).

The setups alternate (``--reps`` rounds of all three, each round in a shuffled order,
after one unmeasured warm-up run of each), so that the machine's drift spreads over
all of them. Per setup: cycles/s and client CPU per 1,000 cycles, the median and
spread of the reps; the ratio of each median to **absent**'s; and, for **sdk**, the
spans and metric points made per cycle (proof the instrumentation ran).

Run from the repository root, after ``pip install -e '.[bench,otel]' opentelemetry-sdk``::

    python benchmarks/otel_overhead.py [--n 5] [--duration 5] [--reps 5] [--quick]
        [--out benchmarks/results] [--docs docs]

``--quick`` is a smoke run (one master, 0.3 s windows, one rep). It writes
``otel_overhead.json`` (every number, the settings and the environment) and
``otel_overhead.md`` (the table) to ``--out``; with ``--docs`` also the table into
``DOCS/observability.md`` (between its ``<!-- OTEL-OVERHEAD -->`` lines).
``--report JSON`` writes the markdown again from results already written. Every
server is stopped at the end, also on error. It asserts no timing.
"""

from __future__ import annotations

import sys

# Setup "absent" hides the API before anything imports asyncredlock (lockbench and
# asyncredlock.testing do, below): its interpreter is started with these arguments first.
if sys.argv[1:3] == ["--child", "absent"]:
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, TypedDict

from lockbench.harness import (
    Environment,
    add_report_option,
    environment,
    machine_line,
    publish_between,
    read_report,
    write_json,
    write_text,
)
from lockbench.settings import THROUGHPUT_WORKERS

from asyncredlock.testing import ServerGroup

SETUPS = ("absent", "api", "sdk")
CHILD_GUARD = 300.0  # seconds one measuring interpreter may take before it is stopped


class Run(TypedDict):
    """One measured window of one setup."""

    cycles: int
    seconds: float
    cycles_per_s: float
    cpu_s_per_1000: float
    failures: int
    telemetry: bool  # whether asyncredlock found the OpenTelemetry API
    spans_per_cycle: float | None  # sdk only
    points_per_cycle: float | None  # sdk only


def _configure(setup: str) -> Any:
    """Set up the SDK (setup ``sdk``); the API was hidden at the start for ``absent``."""
    if setup != "sdk":
        return None
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropping(SpanExporter):
        spans = 0

        def export(self, spans: Any) -> SpanExportResult:
            Dropping.spans += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return provider, reader, Dropping


def _points(reader: Any) -> int:
    """How many measurements asyncredlock's instruments took (histogram counts and
    counter sums)."""
    data = reader.get_metrics_data()
    total = 0
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            if scope.scope.name == "asyncredlock":
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        total += int(getattr(point, "count", getattr(point, "value", 0)))
    return total


async def _measure(urls: list[str], duration: float, workers: int) -> Run:
    from asyncredlock import AsyncRedlock
    from asyncredlock._telemetry import ENABLED

    failures = 0
    async with AsyncRedlock(urls) as redlock:
        locks = [redlock.lock(f"otel:{i}") for i in range(workers)]
        for lease in await asyncio.gather(*(lock.acquire() for lock in locks)):
            await lease.release()  # warm: connections, scripts
        cycles = 0

        async def worker(i: int) -> None:
            nonlocal cycles, failures
            lock = locks[i]
            while time.perf_counter() < deadline:
                try:
                    lease = await lock.acquire()
                    await lease.release()
                except Exception:
                    failures += 1
                    continue
                cycles += 1

        cpu, start = time.process_time(), time.perf_counter()
        deadline = start + duration
        await asyncio.gather(*(worker(i) for i in range(workers)))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return Run(
        cycles=cycles,
        seconds=round(seconds, 3),
        cycles_per_s=round(cycles / seconds, 1),
        cpu_s_per_1000=round(cpu / max(cycles, 1) * 1000, 4),
        failures=failures,
        telemetry=ENABLED,
        spans_per_cycle=None,
        points_per_cycle=None,
    )


def child(setup: str, urls: list[str], duration: float, workers: int) -> Run:
    """One measured window in this interpreter (``--child``)."""
    sdk = _configure(setup)
    before = 0 if sdk is None else _points(sdk[1])
    result = asyncio.run(_measure(urls, duration, workers))
    if sdk is not None:
        provider, reader, dropping = sdk
        provider.force_flush()
        total = result["cycles"] + workers  # the warm-up cycles made spans too
        result["spans_per_cycle"] = round(dropping.spans / total, 3)
        result["points_per_cycle"] = round((_points(reader) - before) / total, 3)
    return result


def _spawn(setup: str, urls: list[str], duration: float, workers: int) -> Run:
    command = [sys.executable, __file__, "--child", setup, "--urls", ",".join(urls)]
    command += ["--duration", str(duration), "--workers", str(workers)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_GUARD, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {setup} run failed:\n{done.stderr[-3000:]}")
    run: Run = json.loads(done.stdout.strip().splitlines()[-1])
    return run


def measure(n: int, duration: float, reps: int, workers: int) -> dict[str, Any]:
    """Every setup, interleaved; the results as JSON data."""
    runs: dict[str, list[Run]] = {setup: [] for setup in SETUPS}
    with ServerGroup(n) as servers:
        for setup in SETUPS:  # warm-up: page cache, server allocations
            _spawn(setup, servers.urls, min(duration, 1.0), workers)
        for rep in range(reps):
            order = list(SETUPS)
            random.shuffle(order)
            for setup in order:
                runs[setup].append(_spawn(setup, servers.urls, duration, workers))
                servers.flushall()
            print(f"round {rep + 1}/{reps} done", file=sys.stderr)
        env: Environment = environment()
    return {
        "settings": {"masters": n, "duration_s": duration, "reps": reps, "workers": workers},
        "environment": env,
        "runs": runs,
    }


def _medians(runs: list[Run]) -> tuple[float, float]:
    """The median cycles/s and CPU s per 1,000 cycles of ``runs``."""
    rate = statistics.median(run["cycles_per_s"] for run in runs)
    return rate, statistics.median(run["cpu_s_per_1000"] for run in runs)


def report(data: dict[str, Any]) -> str:
    """The markdown table of a run's results."""
    runs: dict[str, list[Run]] = data["runs"]
    base_rate, base_cpu = _medians(runs["absent"])
    settings = data["settings"]
    lines = [
        "# OpenTelemetry overhead",
        "",
        f"Scenario c (throughput): {settings['workers']} workers on distinct keys, "
        f"N={settings['masters']} masters, {settings['duration_s']:g} s windows, "
        f"{settings['reps']} reps per setup, interleaved; medians, range in brackets.",
        machine_line(data["environment"]),
        "",
        "| setup | cycles/s | ratio to absent | CPU s / 1,000 cycles | ratio to absent "
        "| spans / cycle | metric points / cycle | failures |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for setup in SETUPS:
        rate, cpu = _medians(runs[setup])
        rates = [run["cycles_per_s"] for run in runs[setup]]
        sdk = runs[setup][0]
        spans = "" if sdk["spans_per_cycle"] is None else f"{sdk['spans_per_cycle']:g}"
        points = "" if sdk["points_per_cycle"] is None else f"{sdk['points_per_cycle']:g}"
        lines.append(
            f"| {setup} | {rate:,.0f} [{min(rates):,.0f} to {max(rates):,.0f}] "
            f"| {rate / base_rate:.3f} | {cpu:.3f} | {cpu / base_cpu:.3f} "
            f"| {spans} | {points} | {sum(run['failures'] for run in runs[setup])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5, help="masters (default 5)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per window")
    parser.add_argument("--reps", type=int, default=5, help="windows per setup")
    parser.add_argument("--workers", type=int, default=THROUGHPUT_WORKERS)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 master, 0.3 s, 1 rep")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--docs", type=Path, help="also publish the table in DOCS")
    parser.add_argument("--child", choices=SETUPS, help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    add_report_option(parser, "otel_overhead.json")
    args = parser.parse_args()
    if args.child:
        run = child(args.child, args.urls.split(","), args.duration, args.workers)
        print(json.dumps(run))
        return
    if args.report:
        data = read_report(args.report)
    else:
        if args.quick:
            args.n, args.duration, args.reps = 1, 0.3, 1
        data = measure(args.n, args.duration, args.reps, args.workers)
        write_json(args.out / "otel_overhead.json", data)
    text = report(data)
    write_text(args.out / "otel_overhead.md", text)
    if args.docs:
        table = text.split("\n", 2)[2]  # without the title
        page = args.docs / "observability.md"
        publish_between(page, "<!-- OTEL-OVERHEAD -->", "<!-- /OTEL-OVERHEAD -->", table)
    print(f"written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
