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

Run ``python benchmarks/rwlock.py`` (about 2 minutes; ``--quick`` for a smoke run).
It writes ``rwlock.json``, ``rwlock.md`` and ``rwlock.png`` to ``--out`` (default
``benchmarks/results``); ``--docs docs`` also writes the table into ``docs/rwlock.md``
and the plot into ``docs/img``. That report step is ``lockbench.rwlock_report``, and
``--report JSON`` runs it alone on results already written.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import anyio
from lockbench.harness import add_report_option, environment, read_report, summarize
from lockbench.rwlock_report import ReadRate, RWLockReport, WriterWait, write_outputs

from asyncredlock import AsyncRedlock, Lock, LockTimeoutError, RWLock
from asyncredlock.testing import ServerGroup

HERE = Path(__file__).resolve().parent
N = 5


class Fairness(TypedDict, total=False):
    """The options of ``AsyncRedlock.rwlock()`` a writer-wait mode sets."""

    patience: float
    fair: bool


MODES: dict[str, Fairness] = {
    "readers first (patience=inf)": {"patience": math.inf},
    "default (patience=1 s)": {},
    "patience=0.1 s": {"patience": 0.1},
    "fair": {"fair": True},
}


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


async def _cycle(lock: Lock) -> None:
    async with lock:
        pass


@dataclass
class Tally:
    """What the readers and the writer of one writer-wait case did, until ``stop``."""

    stop: float  # time.monotonic() at the end of the case
    reads: int = 0
    waits: list[float] = field(default_factory=list)  # the writer's, in seconds
    timeouts: int = 0


async def reader(rw: RWLock, tally: Tally, offset: float, hold: float, longest: float) -> None:
    """From ``offset`` s on, read-lock ``rw`` for ``hold`` s again and again, each
    acquire waiting at most ``longest`` s."""
    await anyio.sleep(offset)  # stagger, so that holds overlap
    while time.monotonic() < tally.stop:
        try:
            async with rw.read(timeout=longest):
                tally.reads += 1
                await anyio.sleep(hold)
        except LockTimeoutError:
            pass


async def writer(rw: RWLock, tally: Tally) -> None:
    """Write-lock ``rw`` for 1 ms again and again, each wait lasting at most until the end."""
    while time.monotonic() < tally.stop:
        started = time.perf_counter()
        try:
            async with rw.write(timeout=max(0.0, tally.stop - time.monotonic())):
                tally.waits.append(time.perf_counter() - started)
                await anyio.sleep(0.001)
        except LockTimeoutError:
            tally.timeouts += 1


async def writer_wait(
    urls: list[str], options: Fairness, seconds: float, readers: int, hold: float
) -> WriterWait:
    """A writer writes again and again while readers keep the lock read without a gap."""
    async with (
        AsyncRedlock(urls, retry_delay=0.05) as reading,
        AsyncRedlock(urls, retry_delay=0.05) as writing,
    ):
        tally = Tally(stop=time.monotonic() + seconds)
        read_rw = reading.rwlock("bench:rw", **options)
        write_rw = writing.rwlock("bench:rw", **options)
        for lock in (read_rw.read(), write_rw.write()):  # warm up
            await _cycle(lock)
        wall = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(readers):
                tg.start_soon(reader, read_rw, tally, hold * i / readers, hold, seconds)
            await anyio.sleep(hold)  # the writer arrives while the lock is read
            tg.start_soon(writer, write_rw, tally)
        wall = time.perf_counter() - wall
        return WriterWait(
            options={k: v if isinstance(v, bool) else str(v) for k, v in options.items()},
            writes=len(tally.waits),
            writer_timeouts=tally.timeouts,
            writer_wait=summarize(tally.waits) if tally.waits else None,
            reads=tally.reads,
            reads_per_s=round(tally.reads / wall, 1),
        )


async def run(quick: bool) -> RWLockReport:
    """Start the servers and measure every case: readers per second (read against
    exclusive), then the writer's wait in each mode."""
    seconds = 0.5 if quick else 8.0
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


def main() -> None:
    """Measure (or, with ``--report``, read results already written) and write the outputs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny runs (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    parser.add_argument("--docs", type=Path, help="also write the table into DOCS/rwlock.md")
    add_report_option(parser, "rwlock.json")
    args = parser.parse_args()
    started = time.monotonic()
    results = read_report(args.report) if args.report else asyncio.run(run(args.quick))
    write_outputs(results, args.out, args.docs)
    print(f"\nwritten to {args.out} in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
