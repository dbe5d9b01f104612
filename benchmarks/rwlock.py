"""Read-write lock benchmark: readers per second, and writer wait under reader load.

Five valkey masters on loopback (no proxies). Two measurements:

1. **readers**: C concurrent tasks of one ``AsyncRedlock`` each read-lock one resource
   and release it, over and over, for a fixed time: read cycles per second and
   acquire latency. The same tasks on the exclusive ``lock()`` of the resource (which
   serialises them, with hand-offs inside the process) give the baseline.
2. **writer wait**: readers of one ``AsyncRedlock`` keep the resource read (each
   holds a few ms; the holds overlap), while a writer of another ``AsyncRedlock``
   writes again and again. Per mode (readers first,
   default patience, patience 0.1 s, fair): the writer's wait from ``acquire()`` to
   its lease, writes done, writes timed out, and reads per second meanwhile.

Run ``python benchmarks/rwlock.py`` (about 2 minutes; ``--quick`` for a smoke run);
``--docs docs`` also writes the table into ``docs/rwlock.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from pathlib import Path
from typing import Any, TypedDict

import anyio
from lockbench.harness import (
    Environment,
    Summary,
    add_report_option,
    environment,
    publish_section,
    pyplot,
    read_report,
    summarize,
    write_json,
    write_text,
)

from asyncredlock import AsyncRedlock, LockTimeoutError
from asyncredlock.testing import ServerGroup

HERE = Path(__file__).resolve().parent
MARKER = "<!-- RWLOCK-BENCH -->"
N = 5
MODES: dict[str, dict[str, Any]] = {
    "readers first (patience=inf)": {"patience": math.inf},
    "default (patience=1 s)": {},
    "patience=0.1 s": {"patience": 0.1},
    "fair": {"fair": True},
}


class ReadRate(TypedDict):
    """Locks of one resource per second, by ``concurrency`` tasks of one client."""

    concurrency: int
    cycles: int
    cycles_per_s: float
    cpu_s_per_1000: float
    acquire: Summary
    handoffs: int


class WriterWait(TypedDict):
    """A writer among readers that keep the lock read without a gap."""

    options: dict[str, Any]  # the rwlock's fairness options
    writes: int
    writer_timeouts: int
    writer_wait: Summary | None  # None: it never wrote
    reads: int
    reads_per_s: float


class RWLockReport(TypedDict):
    """``rwlock.json``."""

    environment: Environment
    masters: int
    seconds_per_case: float
    quick: bool
    readers: dict[str, ReadRate]  # by "read xN" / "exclusive xN"
    writer_wait: dict[str, WriterWait]  # by mode


async def readers_per_second(
    urls: list[str], concurrency: int, seconds: float, *, exclusive: bool
) -> ReadRate:
    """``concurrency`` tasks lock one resource (read side, or exclusive) in a loop."""
    async with AsyncRedlock(urls) as redlock:
        rw = redlock.rwlock("bench:read")
        # warm up: open connections, load the scripts
        async with anyio.create_task_group() as tg:
            for i in range(concurrency):
                tg.start_soon(_cycle, redlock.lock(f"warm:{i}"))
        latencies: list[float] = []
        stop = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < stop:
                lock = redlock.lock("bench:read") if exclusive else rw.read()
                started = time.perf_counter()
                lease = await lock.acquire()
                latencies.append(time.perf_counter() - started)
                await lease.release()

        cpu, wall = time.process_time(), time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        stats = redlock.statistics()
        return ReadRate(
            concurrency=concurrency,
            cycles=len(latencies),
            cycles_per_s=round(len(latencies) / wall, 1),
            cpu_s_per_1000=round(1000 * cpu / max(1, len(latencies)), 3),
            acquire=summarize(latencies),
            handoffs=stats.handoffs,
        )


async def _cycle(lock: Any) -> None:
    async with lock:
        pass


async def writer_wait(
    urls: list[str], options: dict[str, Any], seconds: float, readers: int, hold: float
) -> WriterWait:
    """A writer writes again and again while readers keep the lock read without a gap."""
    async with (
        AsyncRedlock(urls, retry_delay=0.05) as reading,
        AsyncRedlock(urls, retry_delay=0.05) as writing,
    ):
        reads = 0
        waits: list[float] = []
        timeouts = 0
        stop = time.monotonic() + seconds
        read_rw = reading.rwlock("bench:rw", **options)
        write_rw = writing.rwlock("bench:rw", **options)
        for lock in (read_rw.read(), write_rw.write()):  # warm up
            await _cycle(lock)

        async def reader(offset: float) -> None:
            nonlocal reads
            await anyio.sleep(offset)  # stagger, so that holds overlap
            while time.monotonic() < stop:
                try:
                    async with read_rw.read(timeout=seconds):
                        reads += 1
                        await anyio.sleep(hold)
                except LockTimeoutError:
                    pass

        async def writer() -> None:
            nonlocal timeouts
            while time.monotonic() < stop:
                started = time.perf_counter()
                try:
                    async with write_rw.write(timeout=max(0.0, stop - time.monotonic())):
                        waits.append(time.perf_counter() - started)
                        await anyio.sleep(0.001)
                except LockTimeoutError:
                    timeouts += 1

        wall = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(readers):
                tg.start_soon(reader, hold * i / readers)
            await anyio.sleep(hold)  # the writer arrives while the lock is read
            tg.start_soon(writer)
        wall = time.perf_counter() - wall
        return WriterWait(
            options={k: (str(v) if isinstance(v, float) else v) for k, v in options.items()},
            writes=len(waits),
            writer_timeouts=timeouts,
            writer_wait=summarize(waits) if waits else None,
            reads=reads,
            reads_per_s=round(reads / wall, 1),
        )


async def run(quick: bool) -> RWLockReport:
    seconds = 1.0 if quick else 8.0
    with ServerGroup(N) as servers:
        urls = servers.urls
        readers: dict[str, ReadRate] = {}
        for concurrency in (1, 10, 50) if not quick else (4,):
            for exclusive in (False, True):
                name = f"{'exclusive' if exclusive else 'read'} x{concurrency}"
                readers[name] = await readers_per_second(
                    urls, concurrency, seconds, exclusive=exclusive
                )
                print(f"{name:<16} {readers[name]['cycles_per_s']:>9,.1f} cycles/s", flush=True)
        writers: dict[str, WriterWait] = {}
        for mode, options in MODES.items():
            result = await writer_wait(urls, options, seconds, readers=8, hold=0.005)
            writers[mode] = result
            wait = result["writer_wait"]
            p50 = "-" if wait is None else f"{wait['p50_ms']:.1f} ms"
            print(
                f"{mode:<30} writes {result['writes']:>4}  timeouts {result['writer_timeouts']}"
                f"  wait p50 {p50}  reads/s {result['reads_per_s']:,.0f}",
                flush=True,
            )
    return RWLockReport(
        environment=environment(),
        masters=N,
        seconds_per_case=seconds,
        quick=quick,
        readers=readers,
        writer_wait=writers,
    )


def table(results: RWLockReport) -> str:
    env = results["environment"]
    lines = [
        "### Readers per second",
        "",
        f"N = {results['masters']} masters on loopback; each case runs"
        f" {results['seconds_per_case']:g} s. A cycle is acquire + release of one"
        " resource; `read` cycles run together, `exclusive` ones (the same tasks on"
        " `lock()`) one at a time, passed on inside the process.",
        "",
        "| Case | cycles/s | acquire p50 (ms) | acquire p99 (ms) | CPU s / 1,000 cycles |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, r in results["readers"].items():
        lines.append(
            f"| {name} | {r['cycles_per_s']:,.0f} | {r['acquire']['p50_ms']:.2f}"
            f" | {r['acquire']['p99_ms']:.2f} | {r['cpu_s_per_1000']:.3f} |"
        )
    lines += [
        "",
        "### Writer wait under reader load",
        "",
        "8 readers of one client keep the resource read (each holds 5 ms, staggered so"
        " that their holds overlap); a writer of another client writes (1 ms) again and"
        " again, each `acquire()` waiting at most until the end of the case (so the last"
        " one of each case times out).",
        "",
        "| Mode | writes | writer timeouts | writer wait p50 (ms) | p99 (ms) | reads/s |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for mode, w in results["writer_wait"].items():
        wait = w["writer_wait"]
        p50 = "-" if wait is None else f"{wait['p50_ms']:.1f}"
        p99 = "-" if wait is None else f"{wait['p99_ms']:.1f}"
        lines.append(
            f"| {mode} | {w['writes']} | {w['writer_timeouts']} | {p50} | {p99}"
            f" | {w['reads_per_s']:,.0f} |"
        )
    lines += [
        "",
        f"Measured {env['date']} on {env['cpu_count']} CPUs ({env['cpu_model']}),"
        f" {env['platform']}; Python {env['python']}, redis-py {env['redis_py']},"
        f" {env['server']}, asyncredlock {env['asyncredlock']}."
        + (" Quick run: too short to compare." if results["quick"] else ""),
        "",
        "![read-write lock benchmark](img/rwlock.png)",
        "",
        "Rerun (about 2 minutes): `python benchmarks/rwlock.py --docs docs`.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: RWLockReport, path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(results["readers"])
    left.bar(names, [results["readers"][n]["cycles_per_s"] for n in names], color="#4477aa")
    left.set_ylabel("cycles/s")
    left.set_title(f"read vs exclusive, N={results['masters']}")
    left.tick_params(axis="x", rotation=30)
    modes = list(results["writer_wait"])
    waits = [w["p50_ms"] if (w := results["writer_wait"][m]["writer_wait"]) else 0.0 for m in modes]
    right.bar(modes, waits, color="#cc6677")
    right.set_yscale("log")
    right.set_ylabel("writer wait p50 (ms, log scale)")
    right.set_title("writer under a stream of readers")
    right.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny runs (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    parser.add_argument("--docs", type=Path, help="also write the table into DOCS/rwlock.md")
    add_report_option(parser, "rwlock.json")
    args = parser.parse_args()
    started = time.monotonic()
    results = read_report(args.report) if args.report else asyncio.run(run(args.quick))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "rwlock.json", results)
    text = table(results)
    write_text(args.out / "rwlock.md", text)
    plot(results, args.out / "rwlock.png")
    if args.docs is not None:
        plot(results, args.docs / "img" / "rwlock.png")
        publish_section(args.docs / "rwlock.md", MARKER, text)
    print(f"\nwritten to {args.out} in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
