"""Where the client CPU of scenario c (throughput) of ``peers.py`` goes.

Scenario c: 200 workers, each on its own key, run acquire + release cycles for a fixed
time over N masters (real servers, connected to directly; with ``--via-proxy`` each
behind a ``FaultProxy`` hosted in a separate process, which caps the rate at what the
proxy forwards), with ``peers.py``'s warm-up and timed run as they are
(`lockbench.workloads`).
Configurations:

- **asyncredlock** with its defaults (fencing on, auto-extension on), then with
  ``fencing=False``, with ``auto_extend=False``, and with both off (the ablations);
- **pottery** and **aioredlock**, set up exactly as in ``peers.py`` (each only if it
  imports; otherwise the output says why).

Three kinds of pass, each on a fresh session after a warm-up cycle per worker:

1. **timed** (``--reps`` per configuration, configurations interleaved): cycles/s and
   client CPU per 1,000 cycles (``time.process_time()``), the CPU spent inside the
   garbage collector and the collections per generation (``gc.callbacks``; the
   ``gc.collect()`` that ``throughput_run`` runs before its window is left out), and
   the CPU of the proxy process and of the servers (``/proc``, Linux only);
2. **counting** (one per configuration; counting distorts timing, so its rate is not
   reported): per cycle, the asyncio tasks created (by coroutine, and by the function
   that created them), the commands sent (redis-py ``Redis.execute_command``,
   aioredis ``RedisConnection.execute``), the script commands among them (``EVAL``,
   ``EVALSHA``, ``FCALL``), asyncredlock's calls to a master (``Node.call``), and the
   event-loop callbacks run and loop iterations;
3. **profile** (``--profile``; asyncredlock defaults and pottery): a cProfile of the
   timed window, its time per cycle grouped by layer (redis-py, the lock library,
   asyncio, the loop's poll, the benchmark harness, other), C functions charged to
   the layer of their caller, and the garbage collector as a layer of its own (the
   profiler's clock stops while the collector runs; the collector's time is measured
   with ``gc.callbacks``). Profiled time is wall-clock and inflated by the profiler.

Run from the repository root, after ``pip install -e '.[bench]'``::

    python benchmarks/profile_throughput.py [--n 5] [--duration 5] [--reps 3]
        [--count-duration 3] [--profile] [--only asyncredlock,pottery] [--quick]
        [--out benchmarks/results]

``--quick`` is a smoke run (one rep, 0.4 s windows and a 0.25 s counting window, one
master unless ``--n`` says otherwise). It writes ``profile_throughput.json`` (every
number, the settings and the environment) and ``profile_throughput.md`` (the tables) to
``--out``, and stops every server and the proxy process at the end, also on error. It
asserts no timing.

The JSON's shape and the markdown are `lockbench.profile_report`'s: ``--report JSON``
writes the markdown again from results already written, measuring nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import functools
import gc
import importlib
import inspect
import os
import selectors
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar, cast

import redis.asyncio
from lockbench.adapters import (
    PEERS,
    AsyncredlockHandle,
    Handle,
    LibraryInfo,
    Mode,
    Peer,
    defaults,
    probe,
)
from lockbench.harness import (
    ProxyHost,
    Spread,
    add_report_option,
    environment,
    process_cpu,
    read_report,
    redlock_counters,
    servers_behind_proxies,
    spread,
)
from lockbench.profile_report import (
    GC_LAYER,
    LAYER_ORDER,
    POLL,
    Counts,
    CountWindow,
    GcRecord,
    Measured,
    Plan,
    ProfiledWindow,
    ProfileRecord,
    ProfileReport,
    RepSummary,
    Stopped,
    Throughput,
    TimedWindow,
    TopFunction,
    Unavailable,
    write_outputs,
)
from lockbench.settings import POOL, SERVERS, THROUGHPUT_WORKERS, TTL, WAIT
from lockbench.workloads import (
    QUIET_LOGGERS,
    THROUGHPUT_MODE,
    Failures,
    LoopErrors,
    Run,
    bounded,
    failure,
    flush,
    library_statistics,
    quiet_loggers,
    throughput_run,
    warm_all,
)

from asyncredlock import AsyncRedlock
from asyncredlock.testing import ServerGroup

HERE = Path(__file__).resolve().parent
WORKERS = THROUGHPUT_WORKERS
SETTLE = 0.3  # seconds for background calls (the rest of a release round) to finish
SCRIPT_COMMANDS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"})
PROFILED = ("asyncredlock", "pottery")  # the configurations --profile profiles
TOP_FUNCTIONS = 25  # functions by own time kept per profile
# Seconds a window may outlast its duration (the cycles under way finish) before it
# counts as hung: peers.py's own guard, with room for the profiler's slowdown.
GUARD = 30.0


# --- the configurations ----------------------------------------------------------------


class AblatedSession:
    """asyncredlock as in ``peers.py`` (same TTL, wait and handle), with fencing and
    auto-extension chosen."""

    def __init__(
        self, urls: Sequence[str], mode: Mode, *, fencing: bool, auto_extend: bool
    ) -> None:
        self._redlock = AsyncRedlock(
            list(urls), ttl=TTL, timeout=WAIT, fencing=fencing, auto_extend=auto_extend
        )
        self._given = {"fencing": fencing, "auto_extend": auto_extend}

    def handle(self, key: str) -> Handle:
        """A lock on ``key`` for one worker."""
        return AsyncredlockHandle(self._redlock, key)

    def settings(self) -> dict[str, Any]:
        """Every setting in force, passed or default (the ``Session`` protocol's)."""
        constructor = defaults(AsyncRedlock.__init__, ttl=TTL, timeout=WAIT, **self._given)
        constructor.pop("clock", None)
        return {"AsyncRedlock": constructor}

    def statistics(self) -> dict[str, Any]:
        """``AsyncRedlock.statistics()``: its counters so far."""
        return redlock_counters(self._redlock)

    async def aclose(self) -> None:
        """Close the client."""
        await self._redlock.aclose()


def ours(config_id: str, label: str, *, fencing: bool, auto_extend: bool) -> Peer:
    """An asyncredlock configuration, as a ``Peer``."""
    opener = functools.partial(AblatedSession, fencing=fencing, auto_extend=auto_extend)
    note = f"fencing={fencing}, auto_extend={auto_extend}"
    return Peer(config_id, label, ("asyncredlock",), ("asyncredlock",), False, opener, note=note)


_PEERS = {peer.id: peer for peer in PEERS}
CONFIGS = (
    ours("asyncredlock", "asyncredlock (defaults)", fencing=True, auto_extend=True),
    ours("asyncredlock-nofence", "asyncredlock fencing=False", fencing=False, auto_extend=True),
    ours(
        "asyncredlock-noextend", "asyncredlock auto_extend=False", fencing=True, auto_extend=False
    ),
    ours("asyncredlock-plain", "asyncredlock both off", fencing=False, auto_extend=False),
    _PEERS["pottery"],
    _PEERS["aioredlock"],
)


# --- garbage collection ------------------------------------------------------------------


class GcMeter:
    """Collections per generation and the time spent in them, from ``gc.callbacks``.

    While installed, ``gc.collect()`` is wrapped so that explicit collections (the one
    ``throughput_run`` runs before its window) are timed but not counted.

    Args:
        clock: What the collector's time is measured with.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._started: float | None = None
        self._explicit = False
        self.total = 0.0  # every collection, explicit ones included
        self.seconds = 0.0  # automatic collections only
        self.collections = [0, 0, 0]
        self.collected = 0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        """The ``gc.callbacks`` hook: times each collection, counts the automatic ones."""
        if phase == "start":
            self._started = self._clock()
            return
        if self._started is None:
            return
        elapsed = self._clock() - self._started
        self.total += elapsed
        self._started = None
        if not self._explicit:
            self.seconds += elapsed
            self.collections[info["generation"]] += 1
            self.collected += info["collected"]

    def timer(self) -> float:
        """``perf_counter`` that stands still while the collector runs (for cProfile)."""
        started = self._started
        if started is not None:
            return started - self.total
        return time.perf_counter() - self.total

    @contextlib.contextmanager
    def installed(self) -> Iterator[GcMeter]:
        """Measure while the block runs (the hook installed, ``gc.collect`` wrapped)."""
        real_collect = gc.collect

        def collect(generation: int = 2) -> int:
            self._explicit = True
            try:
                return real_collect(generation)
            finally:
                self._explicit = False

        with patched(gc, "collect", collect):
            gc.callbacks.append(self.callback)
            try:
                yield self
            finally:
                gc.callbacks.remove(self.callback)

    def record(self, cycles: int) -> GcRecord:
        """The automatic collections so far, per 1,000 of ``cycles``."""
        per = 1000 / max(1, cycles)
        return {
            "cpu_s_per_1000": round(self.seconds * per, 4),
            "gen0_per_1000": round(self.collections[0] * per, 1),
            "gen1_per_1000": round(self.collections[1] * per, 1),
            "gen2_per_1000": round(self.collections[2] * per, 1),
            "collected_objects_per_1000": round(self.collected * per, 1),
        }


@contextlib.contextmanager
def patched(owner: object, name: str, value: object) -> Iterator[None]:
    """``owner.name = value`` for the duration of the block."""
    old = owner.__dict__.get(name, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT
    setattr(owner, name, value)
    try:
        yield
    finally:
        if old is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, old)


_ABSENT = object()


# --- counting ----------------------------------------------------------------------------


_ASYNCIO_DIR = str(Path(asyncio.__file__).resolve().parent)
_HARNESS_DIR = str(HERE)


def creator(frame: FrameType | None) -> str:
    """The first function outside asyncio on the stack: who created a task."""
    while frame is not None and frame.f_code.co_filename.startswith(_ASYNCIO_DIR):
        frame = frame.f_back
    return "?" if frame is None else frame.f_code.co_qualname


Wrapper = tuple[object, str, Callable[..., Any]]  # what is patched: owner, name, wrapper


class Counter:
    """Counts per event while installed (see the module docstring, pass 2)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.tasks: collections.Counter[str] = collections.Counter()
        self.commands: collections.Counter[str] = collections.Counter()

    def command(self, name: object) -> None:
        """Count one command sent, by its name."""
        text = name.decode() if isinstance(name, bytes) else str(name)
        self.commands[text.upper()] += 1

    @contextlib.contextmanager
    def installed(self) -> Iterator[Counter]:
        """Count while the block runs: the loop's task factory and every hook installed."""
        loop = asyncio.get_running_loop()
        with contextlib.ExitStack() as stack:
            old_factory = loop.get_task_factory()
            loop.set_task_factory(self._task_factory)
            stack.callback(loop.set_task_factory, old_factory)
            for owner, name, wrapper in (*self._wrappers(loop), *self._optional_wrappers()):
                stack.enter_context(patched(owner, name, wrapper))
            yield self

    def _task_factory(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Task[Any]:
        """Count a task by its coroutine and creator; the timed loop's workers apart."""
        name = getattr(coro, "__qualname__", type(coro).__name__)
        code = getattr(coro, "cr_code", None)
        if code is not None and code.co_filename.startswith(_HARNESS_DIR):
            self.counts["harness tasks"] += 1  # the timed loop's own workers
        else:
            self.tasks[f"{name} <- {creator(sys._getframe(1))}"] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    def _wrappers(self, loop: asyncio.AbstractEventLoop) -> list[Wrapper]:
        """redis-py's commands, socket writes, loop callbacks and loop iterations."""
        counts, counter = self.counts, self
        real_execute: Callable[..., Awaitable[Any]] = redis.asyncio.Redis.execute_command

        async def execute_command(self: Any, *args: Any, **options: Any) -> Any:
            counter.command(args[0])
            return await real_execute(self, *args, **options)

        real_send = socket.socket.send

        def send(self: socket.socket, data: Any, *args: Any) -> int:
            counts["socket writes"] += 1
            return real_send(self, data, *args)

        real_run = asyncio.Handle._run

        def run(self: asyncio.Handle) -> None:
            counts["loop callbacks"] += 1
            real_run(self)

        real_run_once: Callable[[], None] = loop._run_once  # type: ignore[attr-defined]

        def run_once() -> None:
            counts["loop iterations"] += 1
            real_run_once()

        return [
            (redis.asyncio.Redis, "execute_command", execute_command),
            (asyncio.Handle, "_run", run),
            (socket.socket, "send", send),
            (loop, "_run_once", run_once),
        ]

    def _optional_wrappers(self) -> list[Wrapper]:
        """aioredis' and asyncredlock's hooks, where they exist (each is private)."""
        out: list[Wrapper] = []
        counts, counter = self.counts, self
        try:
            connection = importlib.import_module("aioredis.connection").RedisConnection
        except Exception:  # not installed, or does not import on this Python
            connection = None
        if connection is not None:
            real_aexecute = connection.execute

            def aexecute(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
                counter.command(command)
                return real_aexecute(self, command, *args, **kwargs)

            out.append((connection, "execute", aexecute))
        link = getattr(importlib.import_module("asyncredlock._transport"), "Link", None)
        real_link_call = getattr(link, "call", None)
        if link is not None and real_link_call is not None:
            # asyncredlock's own connection per master: every command goes through here

            def link_call(self: Any, args: tuple[Any, ...], *rest: Any, **kwargs: Any) -> Any:
                counter.command(args[0])
                return real_link_call(self, args, *rest, **kwargs)

            out.append((link, "call", link_call))
        node = getattr(importlib.import_module("asyncredlock._node"), "Node", None)
        real_call = getattr(node, "call", None)
        if node is not None and real_call is not None:

            def call(*args: Any, **kwargs: Any) -> Any:
                counts["master calls"] += 1
                return real_call(*args, **kwargs)

            out.append((node, "call", call))
        return out

    def record(self, cycles: int, n: int) -> Counts:
        """What was counted, per one of ``cycles`` (over ``n`` masters)."""
        per = 1 / max(1, cycles)
        commands = sum(self.commands.values())
        scripts = sum(v for k, v in self.commands.items() if k in SCRIPT_COMMANDS)
        calls = self.counts.get("master calls")
        return {
            "cycles": cycles,
            "tasks": round(sum(self.tasks.values()) * per, 3),
            "commands": round(commands * per, 3),
            "commands_per_master": round(commands * per / n, 3),
            "master_calls": round(calls * per, 3) if calls else None,
            "commands_per_master_call": round(commands / calls, 3) if calls else None,
            "socket_writes": round(self.counts["socket writes"] * per, 3),
            "commands_per_write": (
                round(commands / self.counts["socket writes"], 3)
                if self.counts["socket writes"]
                else None
            ),
            "script_commands": round(scripts * per, 3),
            "loop_callbacks": round(self.counts["loop callbacks"] * per, 2),
            "loop_iterations": round(self.counts["loop iterations"] * per, 2),
            "tasks_by_coroutine": per_cycle(self.tasks, per),
            "harness_tasks_not_counted": self.counts["harness tasks"],
            "commands_by_name": per_cycle(self.commands, per),
        }


def per_cycle(counts: collections.Counter[str], per: float) -> dict[str, float]:
    """Each count times ``per``, most common first."""
    return {k: round(v * per, 3) for k, v in counts.most_common()}


# --- profile -------------------------------------------------------------------------------


def package_dir(module: str) -> str | None:
    """The directory of an importable package, or None."""
    try:
        file = importlib.import_module(module).__file__
    except Exception:
        return None
    return None if file is None else str(Path(file).resolve().parent)


def layer_roots() -> list[tuple[str, str]]:
    """(directory, layer) pairs, most specific first."""
    named = {
        "asyncredlock": "asyncredlock",
        "pottery": "pottery",
        "aioredlock": "aioredlock",
        "aioredis": "aioredis",
        "redis": "redis-py",
        "asyncio": "asyncio",
    }
    roots = [(d, layer) for m, layer in named.items() if (d := package_dir(m)) is not None]
    roots.append((str(Path(inspect.getfile(selectors)).resolve()), "asyncio"))
    roots.append((str(HERE), "benchmark harness"))
    return sorted(roots, key=lambda r: -len(r[0]))


Label = tuple[str, int, str]  # cProfile's: file, line, function
Stats = Mapping[Label, tuple[int, int, float, float, Mapping[Label, tuple[int, int, float, float]]]]
"""cProfile's statistics: per function, (primitive calls, calls, own s, cumulative s,
the same per caller)."""


def is_poll(label: Label) -> bool:
    """Whether a C function is the selector's poll (``epoll.poll``, ``select``)."""
    name = label[2]
    return label[0] == "~" and ("'select." in name or "select.select" in name) and "poll" in name


def by_layer(stats: Stats) -> dict[str, float]:
    """Own time per layer (C functions charged to their callers' layers)."""
    roots = layer_roots()

    def layer_of(label: Label) -> str:
        path = label[0]
        if path == "~":
            return "other"
        resolved = str(Path(path).resolve()) if path.startswith(os.sep) else path
        return next((layer for root, layer in roots if resolved.startswith(root)), "other")

    layers: dict[str, float] = collections.defaultdict(float)
    for label, (_, _, own, _, callers) in stats.items():
        if label[0] != "~":
            layers[layer_of(label)] += own
        elif is_poll(label):
            layers[POLL] += own
        elif not callers:
            layers["other"] += own
        else:
            edges = {caller: edge[2] for caller, edge in callers.items()}
            total = sum(edges.values()) or 1.0
            for caller, seconds in edges.items():
                layers[layer_of(caller)] += own * seconds / total
    return dict(layers)


def top_functions(stats: Stats, cycles: int) -> list[TopFunction]:
    """The functions by own time, per one of ``cycles``."""
    per = 1000 / max(1, cycles)
    top = sorted(stats.items(), key=lambda item: -item[1][2])[:TOP_FUNCTIONS]
    return [
        {
            "function": short(label),
            "calls_per_cycle": round(calls / max(1, cycles), 3),
            "own_ms_per_cycle": round(own * per, 4),
            "cumulative_ms_per_cycle": round(cumulative * per, 4),
        }
        for label, (_, calls, own, cumulative, _) in top
    ]


def short(label: Label) -> str:
    """``redis/asyncio/connection.py:123(pack_command)``."""
    path, line, name = label
    if path == "~":
        return name
    for cut in ("site-packages/", "/src/", f"python{sys.version_info[0]}.{sys.version_info[1]}/"):
        if cut in path:
            path = path.rsplit(cut, 1)[1]
            break
    return f"{path}:{line}({name})"


def profile_record(
    profile: cProfile.Profile, meter: GcMeter, cycles: int, cpu_s: float
) -> ProfileRecord:
    """ms per cycle per layer, the collector's among them, and the top functions."""
    profile.create_stats()
    layers = by_layer(profile.stats)
    layers[GC_LAYER] = meter.seconds
    per = 1000 / max(1, cycles)
    return {
        "cycles": cycles,
        "profiled_ms_per_cycle": round(sum(layers.values()) * per, 4),
        "cpu_ms_per_cycle_while_profiled": round(cpu_s * per, 4),
        "layers_ms_per_cycle": {k: round(layers.get(k, 0.0) * per, 4) for k in LAYER_ORDER},
        "top_functions": top_functions(profile.stats, cycles),
    }


# --- one window ------------------------------------------------------------------------------


def other_cpu(servers: ServerGroup, proxies: ProxyHost, n: int) -> dict[str, float | None]:
    """CPU seconds so far of the proxy process and of the first ``n`` servers."""
    proxy = process_cpu(proxies.pid)
    used = [process_cpu(server.pid) for server in list(servers)[:n]]
    return {"proxy": proxy, "servers": None if None in used else sum(u or 0.0 for u in used)}


def per_1000(before: float | None, after: float | None, cycles: int) -> float | None:
    """CPU seconds between two readings per 1,000 cycles; None if either is missing."""
    if before is None or after is None or not cycles:
        return None
    return round((after - before) / cycles * 1000, 4)


async def throughput(handles: Sequence[Handle], duration: float) -> Throughput:
    """`throughput_run` with its failed operations, abandoned as hung if it outlasts
    its ``duration`` by `GUARD`."""
    failures = Failures()
    timed = throughput_run(handles, duration, failures)
    run = await bounded(timed, duration + GUARD, "throughput run")
    # A cast: mypy cannot tell that neither part holds the keys `Harness.window` adds.
    return cast(Throughput, {**run, **failures.counts()})


W = TypeVar("W", bound=Throughput)
T = TypeVar("T")
Window = TimedWindow | CountWindow | ProfiledWindow | Stopped


@dataclass(slots=True)
class Harness:
    """The servers, proxies and plan of a run; where loop errors are counted."""

    servers: ServerGroup
    proxies: ProxyHost
    plan: Plan
    loop_errors: LoopErrors = field(default_factory=lambda: LoopErrors("between configurations"))

    async def timed(self, peer: Peer, info: LibraryInfo) -> TimedWindow | Stopped:
        """A timed window (pass 1) on a fresh session."""
        return await self.window(peer, info, "timed", self.plan["duration"], self._timed)

    async def counted(self, peer: Peer, info: LibraryInfo) -> CountWindow | Stopped:
        """A counting window (pass 2) on a fresh session."""
        return await self.window(peer, info, "count", self.plan["count_duration"], self._counted)

    async def profiled(self, peer: Peer, info: LibraryInfo) -> ProfiledWindow | Stopped:
        """A profiled window (pass 3) on a fresh session."""
        return await self.window(peer, info, "profile", self.plan["duration"], self._profiled)

    async def window(
        self,
        peer: Peer,
        info: LibraryInfo,
        kind: str,
        duration: float,
        measure: Callable[[Sequence[Handle], float], Awaitable[W]],
    ) -> W | Stopped:
        """One session: warm-up, then one window of ``kind``, measured by ``measure``."""
        n = self.plan["n"]
        urls = self.proxies.urls(n) if self.plan["via_proxy"] else self.servers.urls[:n]
        try:
            with self.loop_errors.charged_to(peer.id):
                async with Run(peer, info, urls, THROUGHPUT_MODE) as session:
                    keys = [f"profile:c:{kind}:{peer.id}:{i}" for i in range(WORKERS)]
                    handles = [session.handle(key) for key in keys]
                    warm = await warm_all(handles)
                    await asyncio.sleep(SETTLE)
                    before = library_statistics(session).get("library_statistics")
                    result = await measure(handles, duration)
                    after = library_statistics(session).get("library_statistics")
        except Exception as exc:
            return failure(exc)
        finally:
            flush(self.servers)
        result["warmup_failures"] = warm.count
        if before is not None and after is not None:
            attempts = after["attempts"] - before["attempts"]
            result["attempts_per_cycle"] = round(attempts / max(1, result["cycles"]), 4)
        if result["status"] != "ok":
            result["reason"] = "no cycle completed; " + "; ".join(result["failure_examples"])
        return result

    async def _timed(self, handles: Sequence[Handle], duration: float) -> TimedWindow:
        """Pass 1: the rate, the client's CPU and collections, the others' CPU."""
        run = throughput(handles, duration)
        meter = GcMeter(time.process_time)
        gc.collect()
        objects = len(gc.get_objects())
        before = other_cpu(self.servers, self.proxies, self.plan["n"])
        with meter.installed():
            result = await run
        after = other_cpu(self.servers, self.proxies, self.plan["n"])
        cycles = result["cycles"]
        return {
            **result,
            "proxy_cpu_s_per_1000": per_1000(before["proxy"], after["proxy"], cycles),
            "servers_cpu_s_per_1000": per_1000(before["servers"], after["servers"], cycles),
            "gc": meter.record(cycles),
            "tracked_objects": objects,
        }

    async def _counted(self, handles: Sequence[Handle], duration: float) -> CountWindow:
        """Pass 2: what the cycles did, counted (the rate is not reported)."""
        run = throughput(handles, duration)
        counter = Counter()
        with counter.installed():
            result = await run
            await asyncio.sleep(SETTLE)  # the calls still out belong to these cycles
        return {**result, "counts": counter.record(result["cycles"], self.plan["n"])}

    async def _profiled(self, handles: Sequence[Handle], duration: float) -> ProfiledWindow:
        """Pass 3: a cProfile of the window, by layer."""
        run = throughput(handles, duration)
        meter = GcMeter(time.perf_counter)
        profile = cProfile.Profile(meter.timer)
        with meter.installed():
            profile.enable()
            try:
                result = await run
            finally:
                profile.disable()
        record = profile_record(profile, meter, result["cycles"], result["cpu_s"])
        return {**result, "profile": record}


# --- the run ---------------------------------------------------------------------------------


def gc_share(window: TimedWindow) -> float | None:
    """The part of a window's client CPU spent in the garbage collector."""
    cpu = window["cpu_s_per_1000"]
    return None if cpu is None else window["gc"]["cpu_s_per_1000"] / cpu


def summary(reps: Sequence[TimedWindow | Stopped]) -> RepSummary:
    """Median and range of every timed metric over the reps that completed."""
    ok = [r for r in reps if "gc" in r and r["status"] == "ok"]

    def over(get: Callable[[TimedWindow], float | None]) -> Spread | None:
        there = [value for r in ok if (value := get(r)) is not None]
        return spread(there, 4) if there else None

    return {
        "reps_ok": len(ok),
        "cycles_per_s": over(lambda r: r["cycles_per_s"]),
        "cpu_s_per_1000": over(lambda r: r["cpu_s_per_1000"]),
        "gc_cpu_s_per_1000": over(lambda r: r["gc"]["cpu_s_per_1000"]),
        "gc_share": over(gc_share),
        "gen0_per_1000": over(lambda r: r["gc"]["gen0_per_1000"]),
        "gen1_per_1000": over(lambda r: r["gc"]["gen1_per_1000"]),
        "gen2_per_1000": over(lambda r: r["gc"]["gen2_per_1000"]),
        "proxy_cpu_s_per_1000": over(lambda r: r["proxy_cpu_s_per_1000"]),
        "servers_cpu_s_per_1000": over(lambda r: r["servers_cpu_s_per_1000"]),
        "attempts_per_cycle": over(lambda r: r.get("attempts_per_cycle")),
        "failures": over(lambda r: r["failures"]),
    }


def window_line(result: Window) -> str:
    """What one window measured, in a line."""
    if result["status"] == "ok":
        if "counts" in result:
            c = result["counts"]
            return (
                f"{c['cycles']} cycles: {c['tasks']:g} tasks, {c['commands']:g} commands, "
                f"{c['script_commands']:g} scripts, {c['loop_callbacks']:g} callbacks per cycle"
            )
        if "profile" in result:
            p = result["profile"]
            return f"{p['cycles']} cycles, {p['profiled_ms_per_cycle']:.2f} ms/cycle profiled"
        if "gc" in result:
            g = result["gc"]
            return (
                f"{result['cycles_per_s']:8,.1f} cycles/s  "
                f"{result['cpu_s_per_1000']:.3f} CPU s/1000  "
                f"GC {g['cpu_s_per_1000']:.3f} s/1000  gen0 {g['gen0_per_1000']:.0f}/1000"
            )
    return f"{result['status']}: {result.get('reason', '')}"[:110]


def progress(what: str, label: str, result: Window) -> None:
    """One line per window on stderr."""
    print(f"{what:<10} {label:<32} {window_line(result)}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class Passes:
    """Every window of a run, per configuration id."""

    timed: dict[str, list[TimedWindow | Stopped]] = field(default_factory=dict)
    counted: dict[str, CountWindow | Stopped] = field(default_factory=dict)
    profiled: dict[str, ProfiledWindow | Stopped] = field(default_factory=dict)


async def run_passes(
    harness: Harness, runnable: Sequence[Peer], infos: dict[str, LibraryInfo]
) -> Passes:
    """Timed reps (configurations interleaved), then counting, then profiles."""
    plan, passes = harness.plan, Passes({c.id: [] for c in runnable})
    for rep in range(plan["reps"]):
        for config in runnable:
            timed = await harness.timed(config, infos[config.id])
            passes.timed[config.id].append(timed)
            progress(f"rep {rep + 1}/{plan['reps']}", config.label, timed)
    for config in runnable:
        counted = passes.counted[config.id] = await harness.counted(config, infos[config.id])
        progress("count", config.label, counted)
    if plan["profile"]:
        for config in (c for c in runnable if c.id in PROFILED):
            profiled = passes.profiled[config.id] = await harness.profiled(config, infos[config.id])
            progress("profile", config.label, profiled)
    return passes


def config_record(config: Peer, info: LibraryInfo, passes: Passes) -> Measured | Unavailable:
    """A configuration's record: unavailable and why, or its windows and their summary."""
    if not info["available"]:
        return {
            "label": config.label,
            "note": config.note,
            "available": info["available"],
            "status": "unavailable",
            "reason": info["reason"],
        }
    reps = passes.timed[config.id]
    record: Measured = {
        "label": config.label,
        "note": config.note,
        "available": info["available"],
        "status": "ok" if any(r["status"] == "ok" for r in reps) else "failed",
        "summary": summary(reps),
        "reps": reps,
        "counting": passes.counted[config.id],
        "profile": passes.profiled.get(config.id),
    }
    if record["status"] != "ok":
        record["reason"] = "; ".join(r.get("reason", "") for r in reps)
    return record


async def run_all(
    harness: Harness, configs: Sequence[Peer], infos: dict[str, LibraryInfo]
) -> dict[str, Measured | Unavailable]:
    """Every pass over the configurations that run here; a record per configuration."""
    asyncio.get_running_loop().set_exception_handler(harness.loop_errors.handler)
    for config in configs:
        if not infos[config.id]["available"]:
            print(f"skipped    {config.label:<32} {infos[config.id]['reason']}", file=sys.stderr)
    passes = await run_passes(harness, [c for c in configs if infos[c.id]["available"]], infos)
    return {c.id: config_record(c, infos[c.id], passes) for c in configs}


def run(configs: Sequence[Peer], plan: Plan) -> ProfileReport:
    """Start servers and proxies, measure, stop everything (also on error)."""
    quiet_loggers()
    infos = {config.id: probe(config) for config in configs}
    started = time.perf_counter()
    with servers_behind_proxies(plan["n"]) as (servers, proxies):
        harness = Harness(servers, proxies, plan)
        results = asyncio.run(run_all(harness, configs, infos))
    return {
        "benchmark": "profile_throughput",
        "command": " ".join(["python", "benchmarks/profile_throughput.py", *sys.argv[1:]]),
        "settings": {
            "n": plan["n"],
            "workers": WORKERS,
            "ttl_s": TTL,
            "wait_s": WAIT,
            "pool": POOL,
            "settle_s": SETTLE,
            "silenced_loggers": list(QUIET_LOGGERS),
        },
        "plan": plan,
        "environment": environment() | {"event_loop": "asyncio"},
        "libraries": infos,
        "configs": results,
        "loop_errors": harness.loop_errors.counts(),
        "seconds": round(time.perf_counter() - started, 1),
    }


# --- main ----------------------------------------------------------------------------------


def select(names: str) -> tuple[Peer, ...]:
    """The configurations named in ``--only``, in the usual order."""
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    unknown = wanted - {c.id for c in CONFIGS}
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(sorted(unknown)) or 'empty list'}; "
            f"choose from {', '.join(c.id for c in CONFIGS)}"
        )
    return tuple(c for c in CONFIGS if c.id in wanted)


def parser() -> argparse.ArgumentParser:
    """The command line's options."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, choices=range(1, 6), help="masters (default 5; 1 quick)")
    parser.add_argument("--duration", type=float, help="seconds per timed window (default 5)")
    parser.add_argument("--reps", type=int, help="timed windows per configuration (default 3)")
    parser.add_argument(
        "--count-duration", type=float, help="seconds of the counting window (default 3)"
    )
    parser.add_argument("--profile", action="store_true", help="also profile (cProfile)")
    parser.add_argument(
        "--via-proxy",
        action="store_true",
        help="each master behind a proxy process (default: straight to the servers)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny runs (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
    add_report_option(parser, "profile_throughput.json")
    parser.add_argument(
        "--only",
        type=select,
        default=CONFIGS,
        help="comma-separated configurations: " + ",".join(c.id for c in CONFIGS),
    )
    return parser


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Plan]:
    """The command line, and the plan it asks for."""
    options = parser()
    args = options.parse_args(argv)
    quick = bool(args.quick)

    def pick(given: T | None, full: T, small: T) -> T:
        return given if given is not None else small if quick else full

    plan = Plan(
        n=pick(args.n, SERVERS, 1),
        duration=pick(args.duration, 5.0, 0.4),
        reps=pick(args.reps, 3, 1),
        count_duration=pick(args.count_duration, 3.0, 0.25),
        profile=bool(args.profile),
        quick=quick,
        via_proxy=bool(args.via_proxy),
    )
    if plan["duration"] <= 0 or plan["count_duration"] <= 0 or plan["reps"] < 1:
        options.error("--duration and --count-duration must be > 0, --reps >= 1")
    return args, plan


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or read its results, ``--report``) and write its outputs."""
    args, plan = parse_args(argv)
    report: ProfileReport
    if args.report is not None:
        report = read_report(args.report)
    else:
        try:
            report = run(args.only, plan)
        except KeyboardInterrupt:
            print("interrupted; servers and proxies stopped", file=sys.stderr)
            return 130
    print(write_outputs(report, args.out))
    print(f"written to {args.out} in {report['seconds']:g} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
