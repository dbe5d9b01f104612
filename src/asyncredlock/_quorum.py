"""Concurrent fan-out to every master, decided at quorum, with tracked background calls.

Each operation (acquire, extend, release, inspect) becomes a `Round`: one call per
master, each in its own task. The caller waits only until the outcome is decided: a
quorum said yes, or a quorum can no longer say yes (counting masters given up on).
Acquisition gives up on a master that stayed silent for ``node_timeout``; release
and extension wait for every master up to a bound of their own. Calls still running
then go on in the background under the `TaskTracker`, and whoever needs their
result (cleanup, release) awaits them later. A call is never cancelled to meet a
deadline: a cancelled ``SET`` could still land after the undo meant to follow it.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ._errors import NodeOutcome
from ._node import Node, Reply

__all__ = ["Decision", "NodeSkippedError", "Round", "TaskTracker", "Timing", "Verdict"]

logger = logging.getLogger("asyncredlock")

_T = TypeVar("_T")

#: A silent master with this many overdue calls (still out after ``node_timeout``
#: while it answered nothing, or cut off by a round's maximum wait) gets no new
#: acquisition calls until it answers again: a hung master costs one timeout, not
#: one connection per attempt.
MAX_OVERDUE = 8


class NodeSkippedError(Exception):
    """The call was not sent: the master has too many calls unanswered."""


class Verdict(enum.Enum):
    """How one master's reply counts toward the quorum."""

    YES = "yes"
    NO = "no"
    FAILED = "failed"


Classify = Callable[[Reply], tuple[Verdict, str]]
MakeCall = Callable[[int, Node], "Coroutine[Any, Any, Reply] | Reply"]


class TaskTracker:
    """Owns every background task of one ``AsyncRedlock``; none is left behind.

    ``calls`` are short per-master calls (they end when the master answers or the
    socket times out) and finite jobs; ``loops`` are lease extenders, which run
    until stopped.
    """

    def __init__(self) -> None:
        self._calls: set[asyncio.Task[Any]] = set()
        self._loops: set[asyncio.Task[Any]] = set()

    def call(self, coro: Coroutine[Any, Any, Reply]) -> asyncio.Task[Reply]:
        """Start a per-master call in the background."""
        return self._spawn(coro, self._calls)

    def job(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a finite piece of background work (a release nobody awaits);
        `settle` waits for it like for a call."""
        return self._spawn(coro, self._calls)

    def loop(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a long-running background loop (a lease extender)."""
        return self._spawn(coro, self._loops)

    def _spawn(
        self, coro: Coroutine[Any, Any, _T], into: set[asyncio.Task[Any]]
    ) -> asyncio.Task[_T]:
        task = asyncio.get_running_loop().create_task(coro)
        into.add(task)
        task.add_done_callback(into.discard)
        task.add_done_callback(_log_crash)
        return task

    @property
    def pending(self) -> int:
        """How many background tasks are running."""
        return len(self._calls) + len(self._loops)

    async def settle(self) -> None:
        """Wait until every per-master call and job, including those started
        meanwhile, ended."""
        while self._calls:
            await asyncio.wait(set(self._calls))

    async def aclose(self) -> None:
        """Cancel every background task and wait for them to finish."""
        tasks = self._calls | self._loops
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def _log_crash(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("asyncredlock background task failed", exc_info=task.exception())


@dataclass(frozen=True, slots=True)
class Decision:
    """The counted replies of one round when its caller stopped waiting.

    Attributes:
        yes: Masters where the operation took effect.
        no: Masters that answered that it could not take effect.
        failed: Masters that failed, were skipped, or were given up on.
        outcomes: Per-master accounts, in the order of the masters.
        pending: Masters whose reply was still on its way when the round was
            decided without it (counted neither as yes, no nor failed).
    """

    yes: int
    no: int
    failed: int
    outcomes: tuple[NodeOutcome, ...]
    pending: int = 0

    def unavailable(self, quorum: int) -> bool:
        """Whether failures alone made the quorum unreachable (an outage)."""
        return self.failed > len(self.outcomes) - quorum


class Round:
    """One operation sent to every master at once.

    Args:
        tracker: Runs the per-master calls.
        nodes: The masters.
        make: For master ``i``, the coroutine to run there, or an already known
            `Reply` when no call is needed.
        patience: If given (acquisition), a master with too many calls given up
            on that has been silent this long gets no new call, and calls still
            out after ``patience`` on a silent master are counted as given up
            even when the round was decided without them.
    """

    def __init__(
        self,
        tracker: TaskTracker,
        nodes: Sequence[Node],
        make: MakeCall,
        patience: float | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.nodes = nodes
        self.tasks: list[asyncio.Future[Reply]] = []
        self._overdue: set[int] = set()
        for i, node in enumerate(nodes):
            reply: Coroutine[Any, Any, Reply] | Reply
            if patience is not None and _tripped(node, patience):
                reply = Reply(error=NodeSkippedError(f"{node.overdue} calls unanswered"))
            else:
                reply = make(i, node)
            if isinstance(reply, Reply):
                done: asyncio.Future[Reply] = loop.create_future()
                done.set_result(reply)
                self.tasks.append(done)
            else:
                self.tasks.append(tracker.call(reply))
        if patience is not None:
            # Not cancelled when the round is decided: a round that reached its
            # quorum without a hung master must still count that master's call.
            due = time.monotonic() + patience
            loop.call_later(patience, self._mark_silent, patience, due)

    def _mark_silent(self, patience: float, due: float) -> None:
        now = time.monotonic()
        if now - due > patience / 2:
            return  # our event loop is late: silence proves nothing about a master
        for i, node in enumerate(self.nodes):
            if not self.tasks[i].done() and node.silent(now, patience):
                self.mark_overdue(i)

    def mark_overdue(self, i: int) -> None:
        """Count call ``i`` against its master until it completes (once per call)."""
        if i in self._overdue or self.tasks[i].done():
            return
        self._overdue.add(i)
        node = self.nodes[i]
        node.overdue += 1
        self.tasks[i].add_done_callback(functools.partial(_release_overdue, node))

    async def decide(self, quorum: int, classify: Classify, timing: Timing) -> Decision:
        """Wait until the outcome is decided.

        A call counts as failed once its master has been silent (answered nothing
        at all) for ``timing.node_timeout``. A master that keeps answering other
        calls is waited for, up to ``timing.max_wait``: then a busy client (its own
        event loop late) is not mistaken for a dead master. Cancelling this await
        leaves the calls running; they stay in ``tasks``.
        """
        waiter = _Waiter(self, quorum, classify, timing)
        try:
            await waiter.run()
        finally:
            waiter.stop()
        return self._snapshot(classify, waiter.given_up)

    def _snapshot(self, classify: Classify, given_up: dict[int, str]) -> Decision:
        counts = dict.fromkeys(Verdict, 0)
        pending = 0
        outcomes = []
        for i, (node, task) in enumerate(zip(self.nodes, self.tasks, strict=True)):
            verdict: Verdict | None = None
            if task.done():
                verdict, detail = classify(task.result())
                counts[verdict] += 1
            elif i in given_up:
                detail = given_up[i]
                counts[Verdict.FAILED] += 1
            else:
                detail = "not answered yet (the round was decided without it)"
                pending += 1
            outcomes.append(NodeOutcome(node.name, verdict is Verdict.YES, detail))
        return Decision(
            counts[Verdict.YES],
            counts[Verdict.NO],
            counts[Verdict.FAILED],
            tuple(outcomes),
            pending,
        )


@dataclass(frozen=True, slots=True)
class Timing:
    """How long a round waits: for a silent master, and at most."""

    node_timeout: float
    max_wait: float


class _Waiter:
    """Counts one round's replies as they arrive and says when it is decided."""

    def __init__(self, rnd: Round, quorum: int, classify: Classify, timing: Timing) -> None:
        self.rnd = rnd
        self.quorum = quorum
        self.classify = classify
        self.timing = timing
        self.given_up: dict[int, str] = {}
        self.loop = asyncio.get_running_loop()
        self.decided: asyncio.Future[None] = self.loop.create_future()
        self.started = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        self.due = 0.0

    async def run(self) -> None:
        for task in self.rnd.tasks:
            task.add_done_callback(self.check)
        self.check()
        self.schedule()
        await self.decided

    def schedule(self) -> None:
        if not self.decided.done():
            self.due = time.monotonic() + self.timing.node_timeout
            self.timer = self.loop.call_later(self.timing.node_timeout, self.expire)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for task in self.rnd.tasks:
            task.remove_done_callback(self.check)

    def check(self, _: object = None) -> None:
        if self.decided.done():
            return
        yes = no = failed = 0
        for i, task in enumerate(self.rnd.tasks):
            if task.done():
                verdict = self.classify(task.result())[0]
                yes += verdict is Verdict.YES
                no += verdict is Verdict.NO
                failed += verdict is Verdict.FAILED
            elif i in self.given_up:
                failed += 1
        n = len(self.rnd.tasks)
        if yes >= self.quorum or no + failed > n - self.quorum or yes + no + failed == n:
            self.decided.set_result(None)

    def expire(self) -> None:
        """Give up on silent masters; keep waiting for the ones still answering."""
        now = time.monotonic()
        out_of_time = now - self.started >= self.timing.max_wait
        # A timer that fires late means this process's event loop is overloaded:
        # replies may be sitting unread, so silence proves nothing about a master.
        overloaded = now - self.due > self.timing.node_timeout / 2
        for i, (node, task) in enumerate(zip(self.rnd.nodes, self.rnd.tasks, strict=True)):
            if task.done() or i in self.given_up:
                continue
            if out_of_time:
                self.given_up[i] = f"no reply within {self.timing.max_wait:g} s"
            elif not overloaded and node.silent(now, self.timing.node_timeout):
                self.given_up[i] = f"master silent for over {self.timing.node_timeout:g} s"
            else:
                continue
            self.rnd.mark_overdue(i)
        self.check()
        self.schedule()


def _tripped(node: Node, patience: float) -> bool:
    return node.overdue >= MAX_OVERDUE and node.silent(time.monotonic(), patience)


def _release_overdue(node: Node, _: object) -> None:
    node.overdue -= 1


def describe_error(reply: Reply) -> str:
    """A short account of a failed call, for `NodeOutcome`."""
    error = reply.error
    assert error is not None
    text = str(error) or "no message"
    return f"{type(error).__name__}: {text}"
