"""Concurrent fan-out to every master, decided at quorum, with tracked background work.

Each operation (acquire, extend, release, inspect) becomes a `Round`: one call per
master, each a future that the master's connection resolves (no task per call). The
caller waits only until the outcome is decided: a quorum said yes, or a quorum can
no longer say yes (counting masters given up on). Acquisition gives up on a master
once its connection reports it silent; release and extension wait for every master
up to a bound of their own. Calls still out then go on in the background, and
whoever needs their result (cleanup, release) finds them in the round. A call is
never cancelled to meet a deadline: a cancelled ``SET`` could still land after the
undo meant to follow it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from ._deadline import Timing
from ._errors import NodeOutcome
from ._node import Node, Reply

__all__ = [
    "Decision",
    "NodeSkippedError",
    "Round",
    "TaskTracker",
    "Timing",
    "Verdict",
    "quorum_of",
]

logger = logging.getLogger("asyncredlock")

_T = TypeVar("_T")


class NodeSkippedError(Exception):
    """The call was not sent: the master is silent (calls out, nothing heard back)."""


class Verdict(enum.Enum):
    """How one master's reply counts toward the quorum."""

    YES = "yes"
    NO = "no"
    FAILED = "failed"


Classify = Callable[[Reply], tuple[Verdict, str]]
MakeCall = Callable[[int, Node], "asyncio.Future[Reply] | Reply"]


class TaskTracker:
    """Owns the background work of one ``AsyncRedlock``; none is left behind.

    ``calls`` are per-master operations made of several steps (whose last step
    is sent only once an earlier reply is in) and finite jobs; ``loops`` are
    lease extenders, which run until stopped. Plain calls are owned by the
    masters' connections, not here.
    """

    def __init__(self) -> None:
        self._calls: set[asyncio.Future[Any]] = set()
        self._loops: set[asyncio.Future[Any]] = set()

    def follow(self, future: asyncio.Future[Reply]) -> asyncio.Future[Reply]:
        """Count a multi-step call as background work until it resolves."""
        if not future.done():
            self._calls.add(future)
            future.add_done_callback(self._calls.discard)
        return future

    def job(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a finite piece of background work (a release nobody awaits);
        `settle` waits for it like for a call."""
        return self._spawn(coro, self._calls)

    def loop(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a long-running background loop (a lease extender)."""
        return self._spawn(coro, self._loops)

    def _spawn(
        self, coro: Coroutine[Any, Any, _T], into: set[asyncio.Future[Any]]
    ) -> asyncio.Task[_T]:
        task = asyncio.get_running_loop().create_task(coro)
        into.add(task)
        task.add_done_callback(into.discard)
        task.add_done_callback(_log_crash)
        return task

    @property
    def busy(self) -> bool:
        """Whether a multi-step call or a job is still running."""
        return bool(self._calls)

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
            if isinstance(task, asyncio.Task):
                task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def _log_crash(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("asyncredlock background task failed", exc_info=task.exception())


def quorum_of(masters: int) -> int:
    """How many of ``masters`` must agree: a majority, ``masters // 2 + 1``."""
    return masters // 2 + 1


class Decision:
    """The counted replies of one round when its caller stopped waiting.

    Attributes:
        yes: Masters where the operation took effect.
        no: Masters that answered that it could not take effect.
        failed: Masters that failed, were skipped, or were given up on.
        outcomes: Per-master accounts, in the order of the masters (worked out
            when first read: only errors and failures need them).
        pending: Masters whose reply was still on its way when the round was
            decided without it (counted neither as yes, no nor failed).
        quorum: How many masters must agree (a majority of them, unless the
            round was decided with another quorum).
    """

    __slots__ = ("_describe", "_outcomes", "failed", "masters", "no", "pending", "quorum", "yes")

    def __init__(
        self,
        yes: int,
        no: int,
        failed: int,
        outcomes: tuple[NodeOutcome, ...] | Callable[[], tuple[NodeOutcome, ...]],
        pending: int = 0,
        *,
        masters: int | None = None,
        quorum: int | None = None,
    ) -> None:
        self.yes = yes
        self.no = no
        self.failed = failed
        self.pending = pending
        self._outcomes: tuple[NodeOutcome, ...] | None = None
        self._describe: Callable[[], tuple[NodeOutcome, ...]] | None = None
        if callable(outcomes):
            self._describe = outcomes
            self.masters = yes + no + failed + pending if masters is None else masters
        else:
            self._outcomes = outcomes
            self.masters = len(outcomes)
        self.quorum = quorum_of(self.masters) if quorum is None else quorum

    @property
    def outcomes(self) -> tuple[NodeOutcome, ...]:
        """Per-master accounts, in the order of the masters."""
        if self._outcomes is None:
            assert self._describe is not None
            self._outcomes, self._describe = self._describe(), None
        return self._outcomes

    def __repr__(self) -> str:
        return (
            f"Decision(yes={self.yes}, no={self.no}, failed={self.failed}, pending={self.pending})"
        )

    @property
    def reached(self) -> bool:
        """Whether a quorum of masters said yes."""
        return self.yes >= self.quorum

    def holds(self, expires_at: float, clock: Callable[[], float]) -> bool:
        """Redlock's success rule: a quorum granted, and the validity (the moment
        ``expires_at``, by ``clock``, read only once a quorum granted) has not run
        out."""
        return self.yes >= self.quorum and expires_at > clock()

    @property
    def unavailable(self) -> bool:
        """Whether failures alone made the quorum unreachable (an outage)."""
        return self.failed > self.masters - self.quorum

    @property
    def refuted(self) -> bool:
        """Whether too many masters said no for a quorum to say yes (fewer: it may)."""
        return self.no > self.masters - self.quorum


class Round:
    """One operation sent to every master at once.

    Args:
        nodes: The masters.
        make: For master ``i``, the call sent there (a future), or an already
            known `Reply` when no call is needed.
        skip_silent: Acquisition: a master that is silent right now (calls out
            there, nothing heard back for ``node_timeout``) gets no new call; it
            is readmitted the moment it answers anything.
    """

    __slots__ = ("nodes", "tasks")

    def __init__(self, nodes: Sequence[Node], make: MakeCall, *, skip_silent: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.nodes = nodes
        self.tasks: list[asyncio.Future[Reply]] = []
        for i, node in enumerate(nodes):
            reply: asyncio.Future[Reply] | Reply
            if skip_silent and node.silent:
                reply = Reply(error=NodeSkippedError(f"master silent, {node.in_flight} calls out"))
            else:
                reply = make(i, node)
            if isinstance(reply, Reply):
                done: asyncio.Future[Reply] = loop.create_future()
                done.set_result(reply)
                self.tasks.append(done)
            else:
                self.tasks.append(reply)

    async def decide(self, quorum: int, classify: Classify, timing: Timing) -> Decision:
        """Wait until the outcome is decided.

        With ``timing.give_up_silent`` (acquisition), a call counts as failed once
        its master is reported silent (its connection heard nothing for
        ``node_timeout`` with calls out; a master that answers slowly is alive).
        Every call counts as failed once ``timing.max_wait`` has passed.
        Cancelling this await leaves the calls running; they stay in ``tasks``.
        """
        waiter = _Tally(self, quorum, classify, timing)
        try:
            decided = waiter.start()
            if not decided.done():
                watch = self.nodes if timing.give_up_silent else None
                timing.rounds.add(waiter, decided.get_loop(), watch)
                await decided
        finally:
            waiter.stop()
        return waiter.decision()


class _Tally:
    """Counts one round's replies as they arrive and says when it is decided."""

    looks = 0  # how many times its deadline was looked at again (`Waiting`)
    started = 0.0  # when it began to wait, once looked at again (`Waiting`)

    def __init__(self, rnd: Round, quorum: int, classify: Classify, timing: Timing) -> None:
        self.rnd = rnd
        self.quorum = quorum
        self.classify = classify
        self.timing = timing
        self.given_up: dict[int, str] = {}
        self.replies: list[Reply | None] = [None] * len(rnd.tasks)
        self.yes = self.no = self.failed = 0
        self.decided: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def start(self) -> asyncio.Future[None]:
        """Count the replies in, hear of the others as they come; the future that
        is done once the round is decided."""
        nodes, arrived = self.rnd.nodes, self.arrived
        for i, task in enumerate(self.rnd.tasks):
            if task.done():
                arrived(i, task.result())
            elif not nodes[i].listen(task, arrived, i):
                task.add_done_callback(self.done)
        if self.timing.give_up_silent:
            self.on_silent()
        self.check()
        return self.decided

    def stop(self) -> None:
        self.timing.rounds.discard(self)
        nodes = self.rnd.nodes
        for i, task in enumerate(self.rnd.tasks):
            if self.replies[i] is None:
                nodes[i].unlisten(task)
                task.remove_done_callback(self.done)

    def done(self, task: asyncio.Future[Reply]) -> None:
        """A call not hooked (see `Node.listen`) is done."""
        self.arrived(self.rnd.tasks.index(task), task.result())

    def arrived(self, i: int, reply: Reply) -> None:
        """Count the reply of call ``i`` (once; a call given up on counts by its
        reply now)."""
        if self.replies[i] is not None:
            return
        self.replies[i] = reply
        if self.given_up.pop(i, None) is not None:
            self.failed -= 1
        try:
            verdict = self.classify(reply)[0]
        except Exception:  # a reply it cannot read (see _judge)
            verdict = Verdict.FAILED
        if verdict is Verdict.YES:
            self.yes += 1
        elif verdict is Verdict.NO:
            self.no += 1
        else:
            self.failed += 1
        self.check()

    def give_up(self, i: int, why: str) -> None:
        if self.replies[i] is None and i not in self.given_up:
            self.given_up[i] = why
            self.failed += 1

    def check(self) -> None:
        if self.decided.done():
            return
        yes, no, failed, quorum = self.yes, self.no, self.failed, self.quorum
        n = len(self.replies)
        if yes >= quorum or no + failed > n - quorum or yes + no + failed == n:
            self.decided.set_result(None)

    def on_silent(self) -> None:
        """Give up on the calls to masters reported silent."""
        why = f"master silent for over {self.timing.node_timeout:g} s"
        for i, node in enumerate(self.rnd.nodes):
            if node.silent:
                self.give_up(i, why)
        self.check()

    def unread(self) -> bool:
        """Whether a master not counted yet has bytes unread in its socket."""
        nodes, replies = self.rnd.nodes, self.replies
        return any(replies[i] is None and node.unread() for i, node in enumerate(nodes))

    def out_of_time(self, waited: float | None = None) -> None:
        """Give up on every call still out; ``waited``: how long it waited, when its
        deadline was looked at again (the loop busy past it), said in the outcomes."""
        why = f"no reply within {self.timing.max_wait:g} s"
        if waited is not None:
            why += f" ({waited:.3g} s waited, the loop busy)"
        for i in range(len(self.replies)):
            self.give_up(i, why)
        self.check()

    def decision(self) -> Decision:
        """The counts now; the per-master accounts are worked out when read (from
        this waiter, which `stop` has frozen)."""
        yes, no, failed, n = self.yes, self.no, self.failed, len(self.replies)
        pending = n - yes - no - failed
        return Decision(yes, no, failed, self.describe, pending, masters=n, quorum=self.quorum)

    def describe(self) -> tuple[NodeOutcome, ...]:
        """What each master answered, in the masters' order."""
        outcomes = []
        for i, (node, reply) in enumerate(zip(self.rnd.nodes, self.replies, strict=True)):
            if reply is not None:
                verdict, detail = _judge(self.classify, reply)
                outcomes.append(NodeOutcome(node.name, verdict is Verdict.YES, detail))
            else:
                detail = self.given_up.get(i, "not answered yet (the round was decided without it)")
                outcomes.append(NodeOutcome(node.name, False, detail))
        return tuple(outcomes)


def _judge(classify: Classify, reply: Reply) -> tuple[Verdict, str]:
    """``classify(reply)``; a reply it cannot read counts as a failure."""
    try:
        return classify(reply)
    except Exception as exc:
        return Verdict.FAILED, f"unexpected reply {reply.value!r} ({type(exc).__name__}: {exc})"


def describe_error(reply: Reply) -> str:
    """A short account of a failed call, for `NodeOutcome`."""
    error = reply.error
    assert error is not None
    text = str(error) or "no message"
    return f"{type(error).__name__}: {text}"
