"""What ``peers.py`` and ``profile_throughput.py`` both run: the guards, a library's
session for one case, the counting of failures and of asyncio's task errors, and the
cycles of scenario c (one warm-up cycle per worker, then the timed run).

``peers.py`` builds its scenarios on them; ``profile_throughput.py`` takes scenario c's
warm-up and timed run from here as they are, so that it dissects the same loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Awaitable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from asyncredlock.testing import ServerGroup

from .adapters import Handle, LibraryInfo, Mode, Peer, Session, describe
from .peers_records import FailureCount, Outcome, Status, ThroughputRun, WithStatistics
from .settings import THROUGHPUT_WORKERS

__all__ = [
    "CLOSE_GUARD",
    "QUIET_LOGGERS",
    "THROUGHPUT_MODE",
    "WARMUP_GUARD",
    "Failures",
    "HungError",
    "LoopErrors",
    "Run",
    "bounded",
    "cycle",
    "failure",
    "flush",
    "guarded",
    "library_statistics",
    "outcome",
    "quiet_loggers",
    "throughput_run",
    "warm_all",
]

T = TypeVar("T")

CLOSE_GUARD = 5.0  # seconds a session may take to close before it is abandoned
# The first cycle of 200 workers at once opens 200 connections per master and loads
# scripts: seconds of CPU on a small machine, not a hang.
WARMUP_GUARD = 30.0
# The library loggers report every failed master call (pottery with a traceback);
# silenced so that a fault measures the libraries, not the terminal.
QUIET_LOGGERS = ("aioredlock", "aioredis", "pottery", "redis_lock")
#: Scenario c's sessions: every worker on its own key, none waits for another.
THROUGHPUT_MODE = Mode("uncontended", waiting=False, workers=THROUGHPUT_WORKERS)


def quiet_loggers() -> None:
    """Silence the loggers of `QUIET_LOGGERS`."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


# --- guards ------------------------------------------------------------------------------


class HungError(Exception):
    """An operation or a whole case outlasted its guard."""


_abandoned: set[asyncio.Task[Any]] = set()


async def guarded(op: Awaitable[T], seconds: float, what: str) -> T:
    """``await op``, cancelled after ``seconds`` (then `HungError`)."""
    scope = asyncio.timeout(seconds)
    try:
        async with scope:
            return await op
    except TimeoutError:
        if scope.expired():
            raise HungError(f"{what}: no result within {seconds:g} s") from None
        raise


async def bounded(coro: Coroutine[Any, Any, T], seconds: float, what: str) -> T:
    """Run ``coro`` as a task; after ``seconds`` cancel it and move on without waiting
    for it (a library that ignores cancellation cannot hold the script up)."""
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        _abandoned.add(task)
        task.add_done_callback(_abandoned.discard)
        raise HungError(f"{what}: still running after {seconds:g} s, abandoned")
    return task.result()


def outcome(status: Status, reason: str) -> Outcome:
    """A result without numbers: hung, failed, unavailable, not applicable."""
    return {"status": status, "reason": reason}


def failure(exc: BaseException) -> Outcome:
    """The record of a library run that stopped on ``exc``."""
    if isinstance(exc, HungError):
        return outcome("hung", str(exc))
    return outcome("failed", describe(exc))


# --- failures ----------------------------------------------------------------------------


@dataclass(slots=True)
class Failures:
    """Failed operations of a run: how many, and a few distinct messages."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, what: str, exc: BaseException) -> None:
        """Count one failed ``what``."""
        self.note(f"{what}: {describe(exc)}")

    def note(self, message: str) -> None:
        """Count one failure described by ``message``."""
        self.count += 1
        if len(self.examples) < 3 and message not in self.examples:
            self.examples.append(message)

    def counts(self) -> FailureCount:
        """For the JSON."""
        return {"failures": self.count, "failure_examples": self.examples}


@dataclass(slots=True)
class LoopErrors:
    """asyncio's reports of a task error nobody retrieved, or of a task destroyed while
    pending: counted for whoever ran at the time, not printed.

    Attributes:
        idle: Who is charged while nobody runs.
        by_who: The reports, per library or configuration (or ``idle``).
    """

    idle: str
    by_who: dict[str, Failures] = field(default_factory=dict)
    _current: str | None = field(default=None, init=False, repr=False)

    def handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The loop's exception handler (``loop.set_exception_handler``)."""
        exc = context.get("exception")
        message = str(context.get("message", "")) + (f": {describe(exc)}" if exc else "")
        self.by_who.setdefault(self._current or self.idle, Failures()).note(message)

    @contextlib.contextmanager
    def charged_to(self, who: str) -> Iterator[None]:
        """Charge the reports to ``who`` while the block runs. Reports come when a task
        is collected, so ``gc.collect()`` runs on the way in and on the way out."""
        gc.collect()
        self._current = who
        try:
            yield
        finally:
            gc.collect()
            self._current = None

    def counts(self) -> dict[str, FailureCount]:
        """For the JSON."""
        return {who: failures.counts() for who, failures in self.by_who.items()}


# --- a library's session -----------------------------------------------------------------


def library_statistics(session: Session) -> WithStatistics:
    """The library's own counters after a case, where it keeps any (asyncredlock:
    acquisitions, hand-offs, wake-ups, extensions; warm-up included)."""
    stats = getattr(session, "statistics", None)
    return {"library_statistics": stats()} if callable(stats) else {}


class Run:
    """Opens and closes a library's session for one case; records its settings."""

    def __init__(self, peer: Peer, info: LibraryInfo, urls: Sequence[str], mode: Mode) -> None:
        self.peer, self._info, self._urls, self._mode = peer, info, urls, mode
        self.session: Session | None = None

    async def __aenter__(self) -> Session:
        self.session = self.peer.opener(self._urls, self._mode)
        self._info["settings"].setdefault(self._mode.name, self.session.settings())
        return self.session

    async def __aexit__(self, *exc_info: object) -> None:
        if self.session is not None:
            with contextlib.suppress(Exception):
                await bounded(self.session.aclose(), CLOSE_GUARD, "close")


def flush(servers: ServerGroup) -> None:
    """Empty every running server: each case starts from nothing."""
    for server in servers:
        if server.running:
            server.flushall()


# --- cycles ------------------------------------------------------------------------------


async def cycle(handle: Handle, guard: float) -> tuple[float, float]:
    """Acquire then release; the seconds each took."""
    t0 = time.perf_counter()
    await guarded(handle.acquire(), guard, "acquire")
    t1 = time.perf_counter()
    await guarded(handle.release(), guard, "release")
    return t1 - t0, time.perf_counter() - t1


async def warm_all(handles: Sequence[Handle]) -> Failures:
    """One cycle on every handle at once (connections open, scripts cached), within
    `WARMUP_GUARD`. A library may fail some of them under this load; the timed run
    counts its own failures."""

    async def all_at_once() -> list[tuple[float, float] | BaseException]:
        cycles = (cycle(h, WARMUP_GUARD) for h in handles)
        return await asyncio.gather(*cycles, return_exceptions=True)

    failures = Failures()
    for result in await bounded(all_at_once(), WARMUP_GUARD + 1, "warm-up"):
        if isinstance(result, HungError):
            raise result
        if isinstance(result, BaseException):
            failures.add("warm-up cycle", result)
    return failures


async def throughput_run(
    handles: Sequence[Handle], duration: float, failures: Failures
) -> ThroughputRun:
    """Every handle cycles until ``duration`` is over; cycles/s and CPU per cycle. The
    operations that fail are counted in ``failures``."""
    cycles = 0

    async def worker(handle: Handle) -> None:
        nonlocal cycles
        while time.perf_counter() < deadline:
            try:
                await handle.acquire()
            except Exception as exc:
                failures.add("acquire", exc)
                continue
            try:
                await handle.release()
            except Exception as exc:
                failures.add("release", exc)
                continue
            cycles += 1

    gc.collect()
    cpu, start = time.process_time(), time.perf_counter()
    deadline = start + duration
    await asyncio.gather(*(worker(h) for h in handles))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "status": "ok" if cycles else "failed",
        "workers": len(handles),
        "cycles": cycles,
        "seconds": round(seconds, 3),
        "cycles_per_s": round(cycles / seconds, 1),
        "cpu_s": round(cpu, 3),
        "cpu_s_per_1000": round(cpu / cycles * 1000, 4) if cycles else None,
    }
