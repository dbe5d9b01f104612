"""Where the client CPU of scenario c (throughput) of ``peers.py`` goes.

Scenario c: 200 workers, each on its own key, run acquire + release cycles for a fixed
time over N masters (real servers, connected to directly; with ``--via-proxy`` each
behind a ``FaultProxy`` hosted in a separate process, which caps the rate at what the
proxy forwards), reusing ``peers.py``'s warm-up and timed loop as they are.
Configurations:

- **asyncredlock** with its defaults (fencing on, auto-extension on), then with
  ``fencing=False``, with ``auto_extend=False``, and with both off (the ablations);
- **pottery** and **aioredlock**, set up exactly as in ``peers.py`` (each only if it
  imports; otherwise the output says why).

Three kinds of pass, each on a fresh session after a warm-up cycle per worker:

1. **timed** (``--reps`` per configuration, configurations interleaved): cycles/s and
   client CPU per 1,000 cycles (``time.process_time()``), the CPU spent inside the
   garbage collector and the collections per generation (``gc.callbacks``; the
   ``gc.collect()`` that ``peers.throughput`` runs before its window is left out), and
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

``--quick`` is a smoke run (one rep, 1 s windows, one master unless ``--n`` says
otherwise). It writes ``profile_throughput.json`` (every number, the settings and the
environment) and ``profile_throughput.md`` (the tables) to ``--out``, and stops every
server and the proxy process at the end, also on error. It asserts no timing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import dataclasses
import functools
import gc
import importlib
import inspect
import logging
import os
import selectors
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import peers
import redis.asyncio
from lockbench.adapters import (
    PEERS,
    AsyncredlockHandle,
    Handle,
    LibraryInfo,
    Mode,
    Peer,
    defaults,
    describe,
    probe,
)
from lockbench.harness import (
    ProxyHost,
    add_report_option,
    environment,
    read_report,
    servers_behind_proxies,
    write_json,
    write_text,
)
from lockbench.settings import POOL, SERVERS, THROUGHPUT_WORKERS, TTL, WAIT

from asyncredlock import AsyncRedlock
from asyncredlock.testing import ServerGroup

HERE = Path(__file__).resolve().parent
WORKERS = THROUGHPUT_WORKERS
SETTLE = 0.3  # seconds for background calls (the rest of a release round) to finish
SCRIPT_COMMANDS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"})
PROFILED = ("asyncredlock", "pottery")  # the configurations --profile profiles
TOP_FUNCTIONS = 25  # functions by own time kept per profile (10 in the markdown)
# Seconds a window may outlast its duration (the cycles under way finish) before it
# counts as hung: peers.py's own guard, with room for the profiler's slowdown.
GUARD = 30.0
MODE = Mode("uncontended", waiting=False, workers=WORKERS)


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
        return AsyncredlockHandle(self._redlock, key)

    def settings(self) -> dict[str, Any]:
        constructor = defaults(AsyncRedlock.__init__, ttl=TTL, timeout=WAIT, **self._given)
        constructor.pop("clock", None)
        return {"AsyncRedlock": constructor}

    def statistics(self) -> dict[str, Any]:
        return dataclasses.asdict(self._redlock.statistics())

    async def aclose(self) -> None:
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


@dataclass(frozen=True, slots=True)
class Plan:
    """What one run does."""

    n: int
    duration: float
    reps: int
    count_duration: float
    profile: bool
    quick: bool
    # Straight to the servers (the default): at RTT 0 a proxy process forwarding
    # every command would cap the rate, and measure itself instead of the client.
    via_proxy: bool = False


# --- garbage collection ------------------------------------------------------------------


class GcMeter:
    """Collections per generation and the time spent in them, from ``gc.callbacks``.

    While installed, ``gc.collect()`` is wrapped so that explicit collections (the one
    ``peers.throughput`` runs before its window) are timed but not counted.

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

    def record(self, cycles: int) -> dict[str, Any]:
        """Per 1,000 cycles."""
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


class Counter:
    """Counts per event while installed (see the module docstring, pass 2)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.tasks: collections.Counter[str] = collections.Counter()
        self.commands: collections.Counter[str] = collections.Counter()

    def command(self, name: object) -> None:
        text = name.decode() if isinstance(name, bytes) else str(name)
        self.commands[text.upper()] += 1

    @contextlib.contextmanager
    def installed(self) -> Iterator[Counter]:
        loop = asyncio.get_running_loop()
        counts, counter = self.counts, self

        def task_factory(
            loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
        ) -> asyncio.Task[Any]:
            name = getattr(coro, "__qualname__", type(coro).__name__)
            code = getattr(coro, "cr_code", None)
            if code is not None and code.co_filename.startswith(_HARNESS_DIR):
                counts["harness tasks"] += 1  # the timed loop's own workers
            else:
                counter.tasks[f"{name} <- {creator(sys._getframe(1))}"] += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

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

        with contextlib.ExitStack() as stack:
            old_factory = loop.get_task_factory()
            loop.set_task_factory(task_factory)
            stack.callback(loop.set_task_factory, old_factory)
            stack.enter_context(patched(redis.asyncio.Redis, "execute_command", execute_command))
            stack.enter_context(patched(asyncio.Handle, "_run", run))
            stack.enter_context(patched(socket.socket, "send", send))
            stack.enter_context(patched(loop, "_run_once", run_once))
            for owner, name, wrapper in self._optional_wrappers():
                stack.enter_context(patched(owner, name, wrapper))
            yield self

    def _optional_wrappers(self) -> list[tuple[object, str, Callable[..., Any]]]:
        """aioredis' and asyncredlock's hooks, where they exist (each is private)."""
        out: list[tuple[object, str, Callable[..., Any]]] = []
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

    def record(self, cycles: int, n: int) -> dict[str, Any]:
        """Per cycle."""
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


POLL = "loop poll (epoll; idle included)"
GC_LAYER = "gc (collector, from gc.callbacks)"
LAYER_ORDER = (
    "redis-py",
    "aioredis",
    "asyncredlock",
    "pottery",
    "aioredlock",
    "asyncio",
    POLL,
    "benchmark harness",
    "other",
    GC_LAYER,
)
Label = tuple[str, int, str]


def is_poll(label: Label) -> bool:
    name = label[2]
    return label[0] == "~" and ("'select." in name or "select.select" in name) and "poll" in name


def by_layer(profile: cProfile.Profile) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Own time per layer (C functions charged to their callers' layers), and the
    functions by own time."""
    profile.create_stats()
    stats = profile.stats
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
    top = sorted(stats.items(), key=lambda item: -item[1][2])[:TOP_FUNCTIONS]
    functions = [
        {"function": short(label), "calls": calls, "own_s": own, "cumulative_s": cumulative}
        for label, (_, calls, own, cumulative, _) in top
    ]
    return dict(layers), functions


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
) -> dict[str, Any]:
    """ms per cycle per layer, the collector's among them, and the top functions."""
    layers, functions = by_layer(profile)
    layers[GC_LAYER] = meter.seconds
    per = 1000 / max(1, cycles)
    ordered = {k: round(layers.get(k, 0.0) * per, 4) for k in LAYER_ORDER}
    return {
        "cycles": cycles,
        "profiled_ms_per_cycle": round(sum(layers.values()) * per, 4),
        "cpu_ms_per_cycle_while_profiled": round(cpu_s * per, 4),
        "layers_ms_per_cycle": ordered,
        "top_functions": [
            {
                "function": f["function"],
                "calls_per_cycle": round(f["calls"] / max(1, cycles), 3),
                "own_ms_per_cycle": round(f["own_s"] * per, 4),
                "cumulative_ms_per_cycle": round(f["cumulative_s"] * per, 4),
            }
            for f in functions
        ],
    }


# --- one window ------------------------------------------------------------------------------


def process_cpu(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (Linux ``/proc``), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def other_cpu(servers: ServerGroup, proxies: ProxyHost, n: int) -> dict[str, float | None]:
    """CPU seconds so far of the proxy process and of the first ``n`` servers."""
    process = proxies._process
    proxy = process_cpu(None if process is None else process.pid)
    used = [process_cpu(server.pid) for server in list(servers)[:n]]
    return {"proxy": proxy, "servers": None if None in used else sum(u or 0.0 for u in used)}


@dataclass(slots=True)
class Harness:
    """The servers, proxies and plan of a run; where loop errors are counted."""

    servers: ServerGroup
    proxies: ProxyHost
    plan: Plan
    loop_errors: dict[str, peers.Failures] = field(default_factory=dict)
    current: str = "between configurations"

    def on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """A task error nobody retrieved: counted for the configuration running."""
        exc = context.get("exception")
        message = str(context.get("message", "")) + (f": {describe(exc)}" if exc else "")
        self.loop_errors.setdefault(self.current, peers.Failures()).note(message)

    async def window(self, peer: Peer, info: LibraryInfo, kind: str) -> dict[str, Any]:
        """One session: warm-up, then one timed, counting or profiled window."""
        plan = self.plan
        duration = plan.count_duration if kind == "count" else plan.duration
        urls = self.proxies.urls(plan.n) if plan.via_proxy else self.servers.urls[: plan.n]
        gc.collect()  # loop errors of the last window are reported before this one's
        self.current = peer.id
        try:
            async with peers.Run(peer, info, urls, MODE) as session:
                keys = [f"profile:c:{kind}:{peer.id}:{i}" for i in range(WORKERS)]
                handles = [session.handle(key) for key in keys]
                warm = await peers.bounded(
                    peers.warm_all(handles, peers.WARMUP_GUARD),
                    peers.WARMUP_GUARD + 1,
                    "warm-up",
                )
                await asyncio.sleep(SETTLE)
                before = peers.library_statistics(session).get("library_statistics")
                result = await self._measure(kind, handles, duration)
                after = peers.library_statistics(session).get("library_statistics")
        except Exception as exc:
            return peers.failure(exc)
        finally:
            gc.collect()
            self.current = "between configurations"
            peers.flush(self.servers)
        result["warmup_failures"] = warm.count
        if before is not None and after is not None:
            cycles = max(1, result["cycles"])
            result["attempts_per_cycle"] = round(
                (after["attempts"] - before["attempts"]) / cycles, 4
            )
        if result["status"] != "ok":
            result["reason"] = "no cycle completed; " + "; ".join(result["failure_examples"])
        return result

    async def _measure(
        self, kind: str, handles: Sequence[Handle], duration: float
    ) -> dict[str, Any]:
        guard = duration + GUARD
        run = peers.throughput(handles, duration)
        if kind == "count":
            counter = Counter()
            with counter.installed():
                result = await peers.bounded(run, guard, "throughput run")
                await asyncio.sleep(SETTLE)  # the calls still out belong to these cycles
            return result | {"counts": counter.record(result["cycles"], self.plan.n)}
        if kind == "profile":
            meter = GcMeter(time.perf_counter)
            profile = cProfile.Profile(meter.timer)
            with meter.installed():
                profile.enable()
                try:
                    result = await peers.bounded(run, guard, "throughput run")
                finally:
                    profile.disable()
            record = profile_record(profile, meter, result["cycles"], result["cpu_s"])
            return result | {"profile": record}
        meter = GcMeter(time.process_time)
        gc.collect()
        objects = len(gc.get_objects())
        cpu_before = other_cpu(self.servers, self.proxies, self.plan.n)
        with meter.installed():
            result = await peers.bounded(run, guard, "throughput run")
        cpu_after = other_cpu(self.servers, self.proxies, self.plan.n)
        for who in ("proxy", "servers"):
            was, now = cpu_before[who], cpu_after[who]
            result[f"{who}_cpu_s_per_1000"] = (
                None
                if was is None or now is None or not result["cycles"]
                else round((now - was) / result["cycles"] * 1000, 4)
            )
        return result | {"gc": meter.record(result["cycles"]), "tracked_objects": objects}


# --- the run ---------------------------------------------------------------------------------


def spread(values: Sequence[float | None]) -> dict[str, Any] | None:
    """Median, min and max of the values that are there."""
    there = [v for v in values if v is not None]
    if not there:
        return None
    return {
        "median": round(statistics.median(there), 4),
        "min": round(min(there), 4),
        "max": round(max(there), 4),
    }


SUMMARIZED: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "cycles_per_s": lambda r: r["cycles_per_s"],
    "cpu_s_per_1000": lambda r: r["cpu_s_per_1000"],
    "gc_cpu_s_per_1000": lambda r: r["gc"]["cpu_s_per_1000"],
    "gc_share": lambda r: r["gc"]["cpu_s_per_1000"] / r["cpu_s_per_1000"],
    "gen0_per_1000": lambda r: r["gc"]["gen0_per_1000"],
    "gen1_per_1000": lambda r: r["gc"]["gen1_per_1000"],
    "gen2_per_1000": lambda r: r["gc"]["gen2_per_1000"],
    "proxy_cpu_s_per_1000": lambda r: r["proxy_cpu_s_per_1000"],
    "servers_cpu_s_per_1000": lambda r: r["servers_cpu_s_per_1000"],
    "attempts_per_cycle": lambda r: r.get("attempts_per_cycle"),
    "failures": lambda r: r["failures"],
}


def summary(reps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median and range of every timed metric over the reps that completed."""
    ok = [r for r in reps if r["status"] == "ok"]
    return {"reps_ok": len(ok)} | {
        name: spread([get(r) for r in ok]) for name, get in SUMMARIZED.items()
    }


def progress(what: str, label: str, result: dict[str, Any]) -> None:
    """One line per window on stderr."""
    if result["status"] != "ok":
        text = f"{result['status']}: {result.get('reason', '')}"[:110]
    elif "counts" in result:
        c = result["counts"]
        text = (
            f"{c['cycles']} cycles: {c['tasks']:g} tasks, {c['commands']:g} commands, "
            f"{c['script_commands']:g} scripts, {c['loop_callbacks']:g} callbacks per cycle"
        )
    elif "profile" in result:
        p = result["profile"]
        text = f"{p['cycles']} cycles, {p['profiled_ms_per_cycle']:.2f} ms/cycle profiled"
    else:
        g = result["gc"]
        text = (
            f"{result['cycles_per_s']:8,.1f} cycles/s  {result['cpu_s_per_1000']:.3f} CPU s/1000"
            f"  GC {g['cpu_s_per_1000']:.3f} s/1000  gen0 {g['gen0_per_1000']:.0f}/1000"
        )
    print(f"{what:<10} {label:<32} {text}", file=sys.stderr, flush=True)


async def run_all(
    harness: Harness, configs: Sequence[Peer], infos: dict[str, Any]
) -> dict[str, Any]:
    """Timed reps (configurations interleaved), then counting, then profiles."""
    asyncio.get_running_loop().set_exception_handler(harness.on_loop_error)
    plan = harness.plan
    runnable = [c for c in configs if infos[c.id]["available"]]
    for config in configs:
        if not infos[config.id]["available"]:
            print(f"skipped    {config.label:<32} {infos[config.id]['reason']}", file=sys.stderr)
    timed: dict[str, list[dict[str, Any]]] = {c.id: [] for c in runnable}
    for rep in range(plan.reps):
        for config in runnable:
            result = await harness.window(config, infos[config.id], "timed")
            timed[config.id].append(result)
            progress(f"rep {rep + 1}/{plan.reps}", config.label, result)
    counted = {}
    for config in runnable:
        counted[config.id] = await harness.window(config, infos[config.id], "count")
        progress("count", config.label, counted[config.id])
    profiled = {}
    if plan.profile:
        for config in (c for c in runnable if c.id in PROFILED):
            profiled[config.id] = await harness.window(config, infos[config.id], "profile")
            progress("profile", config.label, profiled[config.id])
    out: dict[str, Any] = {}
    for config in configs:
        info = infos[config.id]
        record: dict[str, Any] = {
            "label": config.label,
            "note": config.note,
            "available": info["available"],
        }
        if not info["available"]:
            out[config.id] = record | {"status": "unavailable", "reason": info["reason"]}
            continue
        reps = timed[config.id]
        status = "ok" if any(r["status"] == "ok" for r in reps) else "failed"
        out[config.id] = record | {
            "status": status,
            "summary": summary(reps),
            "reps": reps,
            "counting": counted[config.id],
            "profile": profiled.get(config.id),
        }
        if status != "ok":
            out[config.id]["reason"] = "; ".join(r.get("reason", "") for r in reps)
    return out


def run(configs: Sequence[Peer], plan: Plan) -> dict[str, Any]:
    """Start servers and proxies, measure, stop everything (also on error)."""
    for name in peers.QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    infos = {config.id: probe(config) for config in configs}
    started = time.perf_counter()
    with servers_behind_proxies(plan.n) as (servers, proxies):
        harness = Harness(servers, proxies, plan)
        results = asyncio.run(run_all(harness, configs, infos))
    return {
        "benchmark": "profile_throughput",
        "command": " ".join(["python", "benchmarks/profile_throughput.py", *sys.argv[1:]]),
        "settings": {
            "n": plan.n,
            "workers": WORKERS,
            "ttl_s": TTL,
            "wait_s": WAIT,
            "pool": POOL,
            "settle_s": SETTLE,
            "silenced_loggers": list(peers.QUIET_LOGGERS),
        },
        "plan": dataclasses.asdict(plan),
        "environment": environment() | {"event_loop": "asyncio"},
        "libraries": infos,
        "configs": results,
        "loop_errors": {who: f.record() for who, f in harness.loop_errors.items()},
        "seconds": round(time.perf_counter() - started, 1),
    }


# --- markdown --------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 3) -> str:
    """A number with ``digits`` decimals (thousands separated), or a dash."""
    return "-" if value is None else f"{value:,.{digits}f}"


def ranged(stats: dict[str, Any] | None, digits: int = 3) -> str:
    """``median (min-max)``."""
    if stats is None:
        return "-"
    median, low, high = (fmt(stats[k], digits) for k in ("median", "min", "max"))
    return median if low == high else f"{median} ({low}-{high})"


def median_of(stats: dict[str, Any] | None) -> float | None:
    return None if stats is None else float(stats["median"])


def ok_configs(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(k, c) for k, c in report["configs"].items() if c["status"] == "ok"]


TIMED_HEADER = """\
Timed windows, one fresh session each after a warm-up cycle per worker; the
configurations take turns within each rep. Columns:

- **cycles/s**: completed acquire + release cycles per second, median (min-max) over
  the reps;
- **client CPU**: CPU seconds of the benchmark process (`time.process_time()`, all
  threads) per 1,000 cycles, median (min-max); **Δ vs defaults**: its median minus
  that of asyncredlock with its defaults;
- **GC CPU**: the part of the client CPU spent inside the garbage collector
  (`gc.callbacks`), s per 1,000 cycles, median (min-max); **GC share**: GC CPU over
  client CPU, median;
- **gen-0 / gen-1 / gen-2**: automatic collections per 1,000 cycles, median;
- **proxy**, **servers**: CPU seconds of the proxy process and of the N servers per
  1,000 cycles, median (`/proc`; "-" where unavailable);
- **attempts/cycle**: asyncredlock's acquisition rounds per cycle in the window
  (above 1: rounds that failed and were retried);
- **failures**: failed acquires or releases in the window, median.
"""

COUNT_HEADER = """\
One counting window per configuration (the counting hooks slow the client, so no rate
is reported from it). Per acquire + release cycle:

- **tasks**: asyncio tasks created (the loop's task factory);
- **commands**: commands sent to all masters (redis-py `Redis.execute_command`,
  aioredis `RedisConnection.execute`); **per master**: commands ÷ N;
- **master calls**: asyncredlock's calls to one master (`Node.call`); **per call**:
  commands ÷ master calls;
- **writes**: socket writes (`socket.send`) of the client, all masters together;
  **per write**: commands ÷ writes (above 1: commands joined into one write);
- **scripts**: the script commands among them (`EVAL`, `EVALSHA`, `FCALL`);
- **callbacks**: event-loop callbacks run (`Handle._run`); **iterations**: loop
  iterations (`_run_once`);
- **attempts/cycle**: asyncredlock's acquisition rounds per cycle in this window;
- **by name**: commands per cycle by command name.

The tasks exclude the timed loop's own worker tasks (one per worker and window).
"""

PROFILE_HEADER = """\
A cProfile of one timed window per profiled configuration: own time per cycle
(wall-clock, ms), grouped by the layer of the code; a C function's time is charged to
the layer of its caller. The profiler's clock stops while the garbage collector runs,
and the collector's time (`gc.callbacks`) is its own row. "loop poll" is the time in
`epoll` (waiting for I/O included). Profiling inflates Python-level time: compare the
rows with each other, and the total with the unprofiled client CPU below it. In the
top functions, the calls of a coroutine count its resumptions.
"""


def versus_defaults(config_id: str, delta: float | None) -> str:
    """The Δ vs defaults cell."""
    if config_id == "asyncredlock":
        return "baseline"
    return "-" if delta is None else f"{delta:+.3f}"


def timed_section(report: dict[str, Any]) -> str:
    rows = []
    base = report["configs"].get("asyncredlock", {}).get("summary", {})
    base_cpu = median_of(base.get("cpu_s_per_1000")) if base else None
    for config_id, config in ok_configs(report):
        s = config["summary"]
        cpu = median_of(s["cpu_s_per_1000"])
        delta = None if cpu is None or base_cpu is None else cpu - base_cpu
        share = median_of(s["gc_share"])
        cells = [
            config["label"],
            ranged(s["cycles_per_s"], 0),
            ranged(s["cpu_s_per_1000"]),
            versus_defaults(config_id, delta),
            ranged(s["gc_cpu_s_per_1000"]),
            "-" if share is None else f"{share:.0%}",
            *(fmt(median_of(s[f"gen{g}_per_1000"]), 0) for g in range(3)),
            fmt(median_of(s["proxy_cpu_s_per_1000"])),
            fmt(median_of(s["servers_cpu_s_per_1000"])),
            fmt(median_of(s["attempts_per_cycle"])),
            fmt(median_of(s["failures"]), 0),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return (
        "## Throughput, client CPU and garbage collection\n\n"
        + TIMED_HEADER
        + "\n| configuration | cycles/s | client CPU s/1000 | Δ vs defaults | GC CPU s/1000 "
        "| GC share | gen-0/1000 | gen-1/1000 | gen-2/1000 | proxy CPU s/1000 "
        "| servers CPU s/1000 | attempts/cycle | failures |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n" + "\n".join(rows) + "\n"
    )


def counts_section(report: dict[str, Any]) -> str:
    rows, labels, tasks = [], [], {}
    for config_id, config in ok_configs(report):
        counting = config["counting"]
        if counting["status"] != "ok":
            rows.append(f"| {config['label']} | {counting['status']}: {counting['reason']} |")
            continue
        c = counting["counts"]
        names = ", ".join(f"{k} {v:g}" for k, v in c["commands_by_name"].items())
        cells = [
            config["label"],
            str(c["cycles"]),
            fmt(c["tasks"], 2),
            fmt(c["commands"], 2),
            fmt(c["commands_per_master"], 2),
            fmt(c["master_calls"], 2),
            fmt(c["commands_per_master_call"], 2),
            fmt(c.get("socket_writes"), 2),
            fmt(c.get("commands_per_write"), 2),
            fmt(c["script_commands"], 2),
            fmt(c["loop_callbacks"], 1),
            fmt(c["loop_iterations"], 2),
            fmt(counting.get("attempts_per_cycle")),
            names,
        ]
        rows.append("| " + " | ".join(cells) + " |")
        labels.append(config_id)
        tasks[config_id] = c["tasks_by_coroutine"]
    keys = sorted(
        {k for t in tasks.values() for k in t},
        key=lambda k: (-max(t.get(k, 0.0) for t in tasks.values()), k),
    )
    task_rows = [
        f"| `{key}` | " + " | ".join(fmt(tasks[c].get(key), 2) for c in labels) + " |"
        for key in keys
        if max(t.get(key, 0.0) for t in tasks.values()) >= 0.01
    ]
    heads = " | ".join(report["configs"][c]["label"] for c in labels)
    return (
        "## Per-cycle counts\n\n"
        + COUNT_HEADER
        + "\n| configuration | cycles counted | tasks | commands | per master | master calls "
        "| per call | writes | per write | scripts | callbacks | iterations | attempts/cycle "
        "| by name |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n"
        + "\n".join(rows)
        + "\n\n### Tasks per cycle by coroutine\n\n"
        "Each row: the task's coroutine `<-` the first function outside asyncio that "
        "created it (rows under 0.01 per cycle left out).\n\n"
        f"| coroutine <- created by | {heads} |\n|---|"
        + "--:|" * len(labels)
        + "\n"
        + "\n".join(task_rows)
        + "\n"
    )


def profile_section(report: dict[str, Any]) -> str:
    profiled = [
        (config_id, c, c["profile"])
        for config_id, c in ok_configs(report)
        if c.get("profile") and c["profile"]["status"] == "ok"
    ]
    if not profiled:
        return "## Profile by layer\n\nNot run (`--profile`).\n"
    layers = [
        layer
        for layer in LAYER_ORDER
        if any(p["profile"]["layers_ms_per_cycle"][layer] >= 0.0005 for _, _, p in profiled)
    ]
    heads = " | ".join(f"{c['label']} ms/cycle | share" for _, c, _ in profiled)
    rows = []
    for layer in layers:
        cells = []
        for _, _, p in profiled:
            value = p["profile"]["layers_ms_per_cycle"][layer]
            total = p["profile"]["profiled_ms_per_cycle"] or 1.0
            cells += [fmt(value), f"{value / total:.0%}"]
        rows.append(f"| {layer} | " + " | ".join(cells) + " |")

    def extra(name: str, get: Callable[[dict[str, Any], dict[str, Any]], Any], digits: int) -> str:
        cells = [c for _, config, p in profiled for c in (fmt(get(config, p), digits), "")]
        return f"| {name} | " + " | ".join(cells) + " |\n"

    rows_text = (
        "\n".join(rows)
        + "\n"
        + extra("**total profiled**", lambda _, p: p["profile"]["profiled_ms_per_cycle"], 3)
        + extra(
            "client CPU while profiled",
            lambda _, p: p["profile"]["cpu_ms_per_cycle_while_profiled"],
            3,
        )
        + extra(
            "client CPU unprofiled (timed median)",
            lambda c, _: median_of(c["summary"]["cpu_s_per_1000"]),
            3,
        )
        + extra("attempts/cycle while profiled", lambda _, p: p.get("attempts_per_cycle"), 3)
        + extra("cycles profiled", lambda _, p: p["profile"]["cycles"], 0)
    )
    tops = []
    for _, config, p in profiled:
        lines = [
            f"| `{f['function']}` | {f['calls_per_cycle']:.2f} | {f['own_ms_per_cycle']:.3f} "
            f"| {f['cumulative_ms_per_cycle']:.3f} |"
            for f in p["profile"]["top_functions"][:10]
        ]
        tops.append(
            f"### {config['label']}: top functions by own time\n\n"
            "| function | calls/cycle | own ms/cycle | cumulative ms/cycle |\n"
            "|---|--:|--:|--:|\n" + "\n".join(lines) + "\n"
        )
    return (
        "## Profile by layer\n\n"
        + PROFILE_HEADER
        + f"\n| layer | {heads} |\n|---|"
        + "--:|--:|" * len(profiled)
        + "\n"
        + rows_text
        + "\n"
        + "\n".join(tops)
    )


def markdown(report: dict[str, Any]) -> str:
    """The tables, each under a short header saying what its columns are."""
    plan, env = report["plan"], report["environment"]
    skipped = [
        f"- {c['label']}: not run ({c['status']}): {c.get('reason', '')}"
        for c in report["configs"].values()
        if c["status"] != "ok"
    ]
    errors = [
        f"- {who}: {record['failures']} ({'; '.join(record['failure_examples'])})"
        for who, record in report["loop_errors"].items()
    ]
    quick = "\n**Quick run: too short to mean anything.**\n" if plan["quick"] else ""
    return (
        f"# Scenario c dissected: where the client CPU goes (N = {plan['n']})\n\n"
        f"{WORKERS} workers, each on its own key, run acquire + release cycles over "
        f"N = {plan['n']} masters ("
        + (
            "each behind a proxy in a separate process"
            if plan.get("via_proxy")
            else "straight to the servers, no proxy"
        )
        + "), as in "
        f"scenario c of `peers.py`: {plan['reps']} timed windows of {plan['duration']:g} s "
        f"per configuration, one counting window of {plan['count_duration']:g} s"
        + (", one profiled window" if plan["profile"] else "")
        + ". asyncredlock's defaults: fencing and auto-extension on. "
        f"Python {env['python']}, redis-py {env['redis_py']}, {env['server']}, "
        f"{env['cpu_count']} CPUs ({env['cpu_model']}), {env['date']}.\n"
        + quick
        + f"\nCommand: `{report['command']}` ({report['seconds']:g} s).\n\n"
        + ("Not measured:\n\n" + "\n".join(skipped) + "\n\n" if skipped else "")
        + ("Unretrieved task errors:\n\n" + "\n".join(errors) + "\n\n" if errors else "")
        + timed_section(report)
        + "\n"
        + counts_section(report)
        + "\n"
        + profile_section(report)
    )


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


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Plan]:
    """The command line, and the plan it asks for."""
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
    args = parser.parse_args(argv)
    quick = bool(args.quick)

    def pick(given: Any, full: Any, small: Any) -> Any:
        return given if given is not None else small if quick else full

    plan = Plan(
        n=pick(args.n, SERVERS, 1),
        duration=pick(args.duration, 5.0, 1.0),
        reps=pick(args.reps, 3, 1),
        count_duration=pick(args.count_duration, 3.0, 0.5),
        profile=bool(args.profile),
        quick=quick,
        via_proxy=bool(args.via_proxy),
    )
    if plan.duration <= 0 or plan.count_duration <= 0 or plan.reps < 1:
        parser.error("--duration and --count-duration must be > 0, --reps >= 1")
    return args, plan


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its outputs."""
    args, plan = parse_args(argv)
    if args.report is not None:
        report = read_report(args.report)
    else:
        try:
            report = run(args.only, plan)
        except KeyboardInterrupt:
            print("interrupted; servers and proxies stopped", file=sys.stderr)
            return 130
    write_json(args.out / "profile_throughput.json", report)
    text = markdown(report)
    write_text(args.out / "profile_throughput.md", text)
    print(text)
    print(f"written to {args.out} in {report['seconds']:g} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
