"""Scale benchmark: how asyncredlock's cost grows with the masters, the lockers and the
resources.

For each N in 3, 5, 7, 9 (fresh valkey servers for each, straight on loopback: this
measures how cost grows, not network latency):

1. **100,000 distinct resources**, with fencing on and off: one ``AsyncRedlock`` takes
   100,000 distinct locks with 500 concurrent tasks (long TTL, no auto-extension) and
   holds them all; each master's ``INFO memory`` ``used_memory`` (read until it stops
   moving, no ``MEMORY PURGE``) and ``DBSIZE`` against the emptied server give the bytes
   per held lock on a master. Then every lock is released and the masters are read
   again: with fencing, what is left is one fence counter per resource (``{K}:fence``,
   never expiring, by design), and each master is scanned for any other key. Takes
   and releases per second and the client CPU for them are measured too.
2. **1,000 concurrent lockers**: 1,000 tasks, each looping acquire + release of its own
   key for a fixed window, on one ``AsyncRedlock`` (defaults: fencing and
   auto-extension on), then spread over 10 of them: cycles/s, client CPU
   (``time.process_time()``) per 1,000 cycles, the cycle's p50/p99, the masters' CPU
   (``INFO cpu``) and commands per cycle summed over the masters, the connections open
   on each master, and every failure by exception type.

Run ``python benchmarks/scale.py`` (about 10 minutes; ``--quick`` for a smoke run:
N = 3, 100 lockers, 2,000 resources, 0.4 s windows). It writes ``scale.json``,
``scale.md`` and ``scale.png`` to ``--out`` (default ``benchmarks/results``); ``--docs
docs`` also writes the tables into ``docs/scale.md`` and the plot into ``docs/img``.
That report step is ``lockbench.scale_report``, and ``--report JSON`` runs it alone on
results already written. Every server is stopped at the end, also on error. It asserts
no timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from lockbench.harness import (
    add_report_option,
    environment,
    read_report,
    redlock_counters,
    summarize,
)
from lockbench.scale_report import (
    LockersResult,
    MemoryProbe,
    ResourcesResult,
    ScaleReport,
    Settings,
    write_outputs,
)
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease, Lock
from asyncredlock.testing import ServerGroup

HERE = Path(__file__).resolve().parent
T = TypeVar("T")

FULL = Settings(
    masters=[3, 5, 7, 9],
    lockers=1000,
    clients=10,
    window_s=10.0,
    resources=100_000,
    takers=500,
    hold_ttl_s=600.0,
    client_leases=5000,
)
QUICK = Settings(
    masters=[3],
    lockers=100,
    clients=10,
    window_s=0.4,
    resources=2000,
    takers=500,
    hold_ttl_s=600.0,
    client_leases=500,
)
GUARD = 120.0  # seconds past its planned length a phase may run before it is cancelled
SETTLE_READS = 30  # at most this many reads of used_memory, SETTLE_PAUSE apart
SETTLE_PAUSE = 0.2
# Each INFO adds a few bytes on an idle server (16 measured): not the keys' doing.
SETTLE_SLACK = 1024
SCAN_COUNT = 10_000


# --- the masters, read from the side ----------------------------------------------------


@contextlib.asynccontextmanager
async def probes(urls: list[str]) -> AsyncIterator[list[Redis]]:
    """One plain connection per master for INFO, DBSIZE, SCAN and FLUSHALL."""
    clients = [Redis.from_url(url, protocol=2) for url in urls]
    try:
        yield clients
    finally:
        for client in clients:
            await client.aclose()


async def server_stats(masters: list[Redis]) -> list[dict[str, Any]]:
    """Each master's ``INFO cpu stats clients memory``, parsed (one command per master)."""
    sections = ("cpu", "stats", "clients", "memory")
    return list(await asyncio.gather(*(m.info(*sections) for m in masters)))


def cpu_seconds(info: dict[str, Any]) -> float:
    """The server's CPU time so far (system + user)."""
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def settled_memory(master: Redis) -> tuple[int, bool]:
    """``used_memory`` once two reads `SETTLE_PAUSE` apart differ by less than
    `SETTLE_SLACK` (rehashing and buffer resizing done), or the last read after
    `SETTLE_READS`; and whether it settled."""
    used = await used_memory(master)
    for _ in range(SETTLE_READS):
        await asyncio.sleep(SETTLE_PAUSE)
        last, used = used, await used_memory(master)
        if abs(used - last) < SETTLE_SLACK:
            return used, True
    return used, False


async def used_memory(master: Redis) -> int:
    """The master's ``INFO memory`` ``used_memory``."""
    return int((await master.info("memory"))["used_memory"])


async def memory_probe(masters: list[Redis]) -> MemoryProbe:
    """Every master's settled ``used_memory`` and its ``DBSIZE``."""
    memory = await asyncio.gather(*(settled_memory(m) for m in masters))
    sizes = await asyncio.gather(*(m.dbsize() for m in masters))
    return MemoryProbe(
        used_memory=[used for used, _ in memory],
        dbsize=[int(size) for size in sizes],
        settled=[ok for _, ok in memory],
    )


async def prime(masters: list[Redis], fencing: bool) -> None:
    """Run every probe command once on every master before the empty server is read:
    a command's first call allocates its statistics there (latency histograms), which
    would otherwise count as the locks' memory."""
    for master in masters:
        await memory_usage(master, "scale:warm:0", fencing)
        await keys_left(master, set())


async def flush(masters: list[Redis]) -> None:
    """Empty every master now (``SYNC``: valkey frees a user's flush lazily by default)."""
    commands: list[Callable[..., Awaitable[object]]] = [m.execute_command for m in masters]
    await asyncio.gather(*(command("FLUSHALL", "SYNC") for command in commands))


async def keys_left(master: Redis, fences: set[str]) -> tuple[int, int, list[str]]:
    """The fence counters in ``fences`` left on ``master``, the other keys, and a few
    of those by name."""
    fence = other = 0
    sample: list[str] = []
    async for raw in master.scan_iter(count=SCAN_COUNT):
        key = raw.decode()
        if key in fences:
            fence += 1
        else:
            other += 1
            if len(sample) < 5:
                sample.append(key)
    return fence, other, sample


# --- 1,000 concurrent lockers ------------------------------------------------------------


@dataclass
class Tally:
    """What the lockers of one case did before ``deadline`` (``time.perf_counter()``)."""

    deadline: float
    samples: list[float] = field(default_factory=list)  # seconds per cycle
    failures: Counter[str] = field(default_factory=Counter)


async def locker(lock: Lock, tally: Tally) -> None:
    """Acquire and release ``lock`` until the deadline; every exception is counted."""
    while time.perf_counter() < tally.deadline:
        started = time.perf_counter()
        try:
            lease = await lock.acquire()
            await lease.release()
        except Exception as exc:
            tally.failures[type(exc).__name__] += 1
            continue
        tally.samples.append(time.perf_counter() - started)


async def guarded(work: Awaitable[T], seconds: float) -> T:
    """``await work``, cancelled (``TimeoutError``) after ``seconds`` + `GUARD`."""
    async with asyncio.timeout(seconds + GUARD):
        return await work


async def warm(locks: list[Lock]) -> None:
    """One cycle of every lock: connections open, scripts loaded, fence counters made."""
    for lease in await guarded(asyncio.gather(*(lock.acquire() for lock in locks)), 0):
        await lease.release()


async def lockers_case(
    urls: list[str], masters: list[Redis], settings: Settings, clients: int
) -> LockersResult:
    """``settings['lockers']`` tasks over ``clients`` clients, each on its own key."""
    async with contextlib.AsyncExitStack() as stack:
        redlocks = [await stack.enter_async_context(AsyncRedlock(urls)) for _ in range(clients)]
        locks = [redlocks[i % clients].lock(f"scale:c:{i}") for i in range(settings["lockers"])]
        await warm(locks)
        window = settings["window_s"]
        before, counted = await server_stats(masters), added_up(redlocks)
        cpu, wall = time.process_time(), time.perf_counter()
        tally = Tally(deadline=wall + window)
        await guarded(asyncio.gather(*(locker(lock, tally) for lock in locks)), window)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        await guarded(asyncio.gather(*(r.settle() for r in redlocks)), 0)
        after, counters = await server_stats(masters), added_up(redlocks)
    counters.subtract(counted)
    return lockers_result(settings, clients, tally, wall, cpu, before, after, dict(counters))


def added_up(redlocks: list[AsyncRedlock]) -> Counter[str]:
    """The clients' ``statistics()`` counters, added up."""
    total: Counter[str] = Counter()
    for redlock in redlocks:
        total.update(redlock_counters(redlock))
    return total


def lockers_result(
    settings: Settings,
    clients: int,
    tally: Tally,
    wall: float,
    cpu: float,
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    counters: dict[str, int],
) -> LockersResult:
    """The record of one lockers case, from what was counted and the servers' INFO."""
    cycles = len(tally.samples)
    per_1000 = 1000 / max(cycles, 1)
    server_cpu = [
        (cpu_seconds(a) - cpu_seconds(b)) * per_1000 for a, b in zip(after, before, strict=True)
    ]
    commands = sum(
        a["total_commands_processed"] - b["total_commands_processed"]
        for a, b in zip(after, before, strict=True)
    )
    return LockersResult(
        masters=len(after),
        clients=clients,
        lockers=settings["lockers"],
        seconds=round(wall, 3),
        cycles=cycles,
        cycles_per_s=round(cycles / wall, 1),
        client_cpu_s_per_1000=round(cpu * per_1000, 4),
        cycle=summarize(tally.samples) if tally.samples else None,
        server_cpu_s_per_1000=round(sum(server_cpu), 4),
        server_cpu_s_per_1000_by_master=[round(v, 4) for v in server_cpu],
        server_commands_per_cycle=round(commands / max(cycles, 1), 2),
        connections_by_master=[int(a["connected_clients"]) - 1 for a in after],
        bytes_per_connection=[
            round(a["mem_clients_normal"] / a["connected_clients"], 1) for a in after
        ],
        failures=dict(tally.failures),
        counters=counters,
    )


# --- 100,000 distinct resources ----------------------------------------------------------


async def each(items: Iterator[T], tasks: int, step: Callable[[T], Awaitable[None]]) -> float:
    """Run ``step`` on every item, ``tasks`` at a time (they share the iterator, so each
    item is taken once); the client CPU seconds it took."""

    async def worker() -> None:
        for item in items:
            await step(item)

    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return time.process_time() - cpu


@dataclass
class Holding:
    """The leases of one resources case, and every failure by exception type."""

    leases: list[Lease] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)

    async def take(self, lock: Lock) -> None:
        """Acquire ``lock`` and keep its lease."""
        try:
            self.leases.append(await lock.acquire())
        except Exception as exc:
            self.failures[type(exc).__name__] += 1

    async def give_back(self, lease: Lease) -> None:
        """Release ``lease``."""
        try:
            await lease.release()
        except Exception as exc:
            self.failures[type(exc).__name__] += 1


@dataclass
class Timed:
    """Wall and client CPU seconds of one phase."""

    wall: float
    cpu: float


async def timed_each(
    items: Iterator[T], tasks: int, step: Callable[[T], Awaitable[None]], plan: float
) -> Timed:
    """`each`, under a guard of ``plan`` seconds + `GUARD`, with its wall time."""
    wall = time.perf_counter()
    cpu = await guarded(each(items, tasks, step), plan)
    return Timed(wall=time.perf_counter() - wall, cpu=cpu)


async def resources_case(
    urls: list[str], masters: list[Redis], settings: Settings, fencing: bool
) -> ResourcesResult:
    """Take ``settings['resources']`` distinct locks, hold them, release them; the
    masters' memory and keys at each stage."""
    n, ttl = settings["resources"], settings["hold_ttl_s"]
    names = [f"scale:r:{i}" for i in range(n)]
    holding = Holding()
    async with AsyncRedlock(urls, fencing=fencing, auto_extend=False, ttl=ttl) as redlock:
        await warm([redlock.lock(f"scale:warm:{i}") for i in range(settings["takers"])])
        await guarded(redlock.settle(), 0)
        await prime(masters, fencing)
        await flush(masters)
        empty = await memory_probe(masters)
        locks = (redlock.lock(name) for name in names)
        took = await timed_each(locks, settings["takers"], holding.take, ttl / 2)
        await guarded(redlock.settle(), 0)
        held = await memory_probe(masters)
        sizes = await memory_usage(masters[0], names[0], fencing)
        gave = await timed_each(iter(holding.leases), settings["takers"], holding.give_back, ttl)
        await guarded(redlock.settle(), 0)
        released = await memory_probe(masters)
        fences = fence_keys(names, fencing)
        left = await asyncio.gather(*(keys_left(m, fences) for m in masters))
        client = await client_bytes_per_lease(
            redlock, settings["client_leases"], settings["takers"]
        )
    return ResourcesResult(
        masters=len(masters),
        fencing=fencing,
        resources=n,
        takers=settings["takers"],
        held=len(holding.leases),
        take_seconds=round(took.wall, 3),
        takes_per_s=round(len(holding.leases) / took.wall, 1),
        take_client_cpu_s_per_1000=round(took.cpu * 1000 / n, 4),
        release_seconds=round(gave.wall, 3),
        releases_per_s=round(len(holding.leases) / gave.wall, 1),
        release_client_cpu_s_per_1000=round(gave.cpu * 1000 / n, 4),
        failures=dict(holding.failures),
        empty=empty,
        holding=held,
        released=released,
        bytes_per_held_lock=per_item(held, empty, len(holding.leases)),
        bytes_left_per_resource=per_item(released, empty, n),
        memory_usage=sizes,
        fence_keys_left=[fence for fence, _, _ in left],
        other_keys_left=[other for _, other, _ in left],
        other_keys_sample=[key for _, _, sample in left for key in sample][:10],
        client_bytes_per_held_lock=round(client, 1),
    )


async def client_bytes_per_lease(redlock: AsyncRedlock, count: int, tasks: int) -> float:
    """The Python memory (``tracemalloc``) that a held lease and its lock keep in the
    client, from ``count`` more locks taken (by ``tasks`` tasks) after the measured
    phases, then released."""
    holding = Holding()
    locks = (redlock.lock(f"scale:m:{i}") for i in range(count))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await timed_each(locks, tasks, holding.take, 0)
        await guarded(redlock.settle(), 0)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    await timed_each(iter(holding.leases), tasks, holding.give_back, 0)
    if holding.failures:
        raise RuntimeError(f"taking the client-memory sample failed: {dict(holding.failures)}")
    return (held - before) / max(1, count)


def fence_keys(names: list[str], fencing: bool) -> set[str]:
    """The fence counters of ``names`` (``{K}:fence``; the names hold no hash tag)."""
    return {"{" + name + "}:fence" for name in names} if fencing else set()


def per_item(now: MemoryProbe, empty: MemoryProbe, items: int) -> list[float]:
    """Each master's ``used_memory`` growth since ``empty``, per item."""
    pairs = zip(now["used_memory"], empty["used_memory"], strict=True)
    return [round((used - base) / max(1, items), 1) for used, base in pairs]


async def memory_usage(master: Redis, name: str, fencing: bool) -> dict[str, int]:
    """``MEMORY USAGE`` of one held lock key and of its fence counter, on ``master``."""
    keys = {"lock key": name} | ({"fence counter": "{" + name + "}:fence"} if fencing else {})
    return {label: int(await master.memory_usage(key) or 0) for label, key in keys.items()}


# --- the run -----------------------------------------------------------------------------


async def measure_n(
    n: int, settings: Settings
) -> tuple[list[ResourcesResult], list[LockersResult]]:
    """Every case on ``n`` fresh servers."""
    with ServerGroup(n) as servers:
        async with probes(servers.urls) as masters:
            resources = []
            for fencing in (True, False):
                resources.append(await resources_case(servers.urls, masters, settings, fencing))
                await flush(masters)
                print(describe_resources(resources[-1]), flush=True)
            lockers = []
            for clients in (1, settings["clients"]):
                lockers.append(await lockers_case(servers.urls, masters, settings, clients))
                await flush(masters)
                print(describe_lockers(lockers[-1]), flush=True)
    return resources, lockers


def describe_resources(r: ResourcesResult) -> str:
    """One progress line for a resources case."""
    return (
        f"N={r['masters']} fencing={'on ' if r['fencing'] else 'off'}"
        f" takes/s {r['takes_per_s']:>9,.0f}  bytes/held lock {r['bytes_per_held_lock']}"
        f"  bytes left/resource {r['bytes_left_per_resource']}  failures {r['failures']}"
    )


def describe_lockers(r: LockersResult) -> str:
    """One progress line for a lockers case."""
    return (
        f"N={r['masters']} clients={r['clients']:<3} cycles/s {r['cycles_per_s']:>9,.0f}"
        f"  server CPU s/1000 {r['server_cpu_s_per_1000']:.3f}  failures {r['failures']}"
    )


async def run(settings: Settings, quick: bool) -> ScaleReport:
    """Every N in turn, each on fresh servers."""
    resources: list[ResourcesResult] = []
    lockers: list[LockersResult] = []
    for n in settings["masters"]:
        more_resources, more_lockers = await measure_n(n, settings)
        resources += more_resources
        lockers += more_lockers
    return ScaleReport(
        environment=environment(),
        quick=quick,
        settings=settings,
        lockers=lockers,
        resources=resources,
    )


def masters_list(text: str) -> list[int]:
    """``--masters``: comma-separated numbers of masters, each at least 1."""
    try:
        ns = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not ns or min(ns) < 1:
        raise argparse.ArgumentTypeError(f"every N must be at least 1: {text!r}")
    return ns


def main() -> None:
    """Measure (or, with ``--report``, read results already written) and write the outputs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="N=3, 100 lockers, 2,000 resources, 0.4 s windows"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    parser.add_argument("--docs", type=Path, help="also write the tables into DOCS/scale.md")
    parser.add_argument(
        "--masters", type=masters_list, help="the N to measure, e.g. 3,5 (default 3,5,7,9)"
    )
    add_report_option(parser, "scale.json")
    args = parser.parse_args()
    started = time.monotonic()
    if args.report:
        results: ScaleReport = read_report(args.report)
    else:
        settings = Settings(**(QUICK if args.quick else FULL))
        settings["masters"] = args.masters or settings["masters"]
        results = asyncio.run(run(settings, args.quick))
    write_outputs(results, args.out, args.docs)
    print(f"\nwritten to {args.out} in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
