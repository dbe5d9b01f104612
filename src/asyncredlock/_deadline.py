"""How long a round waits (`Timing`), the one timer that ends the rounds waiting
under it (`Waiting`), and a wait for some replies up to a bound (`wait_until`).

A round's deadline is judged as a master's silence is (``_transport``): a busy loop
says nothing about the masters. A deadline timer that ran late, or a round whose
unanswered masters have bytes unread in their sockets, looks again once the loop has
polled its sockets (the replies may sit there unread: uvloop runs its timers before
the next poll), a few times at most, before giving up on the calls still out.

A round whose own code raises while its deadline, or a master's silence, is handled (a
bug) is logged once, at ERROR, and ended there (as out of time if it can be, else
decided as it stands): the others waiting with it still end in time, none is stranded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._node import Node

__all__ = ["Timing", "Waiter", "Waiting", "wait_until"]

logger = logging.getLogger("asyncredlock")

# The loop runs a timer up to its clock's resolution early; a round's wait is
# up to this much shorter than ``max_wait``, never longer.
_EARLY = 0.001
# A deadline looked at again waits this long: never 0 (on uvloop a 0 delay runs
# before the next poll, which is what must come first).
_RELOOK = 0.001
# How many times a round's deadline is looked at again, at most.
_RELOOKS = 3


class Waiter(Protocol):
    """A round waiting (``_quorum._Tally``)."""

    #: How many times its deadline was looked at again.
    looks: int
    #: When it began to wait (the loop's time), once its deadline was looked at again.
    started: float
    #: Done once the round is decided.
    decided: asyncio.Future[None]

    def on_silent(self) -> None: ...

    def out_of_time(self, waited: float | None = None) -> None:
        """Give up on the calls still out; ``waited``: how long it waited, if its
        deadline was looked at again (longer than ``max_wait``)."""

    def unread(self) -> bool: ...


class Waiting:
    """The rounds waiting under one `Timing`, each for at most ``max_wait``.

    They all wait the same time, so their deadlines come in the order they
    started: one timer, armed for the oldest, serves them all. Acquisition
    rounds hear of a master turning silent through one watcher per master for
    all of them. A round decided in time only enters and leaves a dict: no timer
    handle made and cancelled, no watcher added and removed per round.
    """

    __slots__ = ("_due", "_late", "_loop", "_timer", "_watched", "max_wait", "waiting")

    def __init__(self, max_wait: float, node_timeout: float) -> None:
        self.max_wait = max_wait
        self.waiting: dict[Waiter, float] = {}  # insertion order is deadline order
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the timer was due
        # a timer later than this ran in a busy loop (as `Link` judges its own)
        self._late = min(node_timeout, max_wait) / 2
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watched: Sequence[Node] = ()

    def add(
        self, waiter: Waiter, loop: asyncio.AbstractEventLoop, watch: Sequence[Node] | None
    ) -> None:
        """Start ``waiter``'s wait; ``watch``: the masters whose silence it hears of."""
        due = loop.time() + self.max_wait
        self.waiting[waiter] = due
        if self._timer is None or self._loop is not loop:
            self._loop, self._due, self._timer = loop, due, loop.call_at(due, self._fire)
        if watch is not None and watch is not self._watched:
            for node in watch:  # once per set of masters (an AsyncRedlock's): kept
                node.watch(self._silent)
            self._watched = watch

    def discard(self, waiter: Waiter) -> None:
        """End ``waiter``'s wait (decided, or given up)."""
        self.waiting.pop(waiter, None)

    def close(self) -> None:
        """Disarm the timer and let go of the masters watched: the client is closed, its
        calls failed (every round decided). A round started later arms it again."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._watched = ()

    def _silent(self) -> None:
        for waiter in list(self.waiting):
            try:
                waiter.on_silent()
            except Exception as exc:  # that round's bug: the others still hear of it
                self._failed(waiter, exc)

    def _failed(self, waiter: Waiter, exc: Exception) -> None:
        """``waiter`` raised ``exc``: logged (once: it waits no more), and its round
        ended as out of time if it can be, else decided as it stands (the calls still
        out counted as pending). Its caller gets an outcome; the others wait on."""
        logger.error(
            "asyncredlock round failed as its wait was judged (%s: %s); it ends now",
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        self.discard(waiter)
        with contextlib.suppress(Exception):  # logged above: the same fault as a rule
            waiter.out_of_time()
        if not waiter.decided.done():
            waiter.decided.set_result(None)

    def _fire(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        late = now - self._due > self._late
        expired = []
        for waiter, due in self.waiting.items():
            if due > now + _EARLY:
                break
            expired.append((waiter, due))
        relook = now + _RELOOK  # before every deadline still to come: the order holds
        for waiter, due in expired:
            try:
                if waiter.looks < _RELOOKS and (late or waiter.unread()):
                    if not waiter.looks:
                        waiter.started = due - self.max_wait
                    waiter.looks += 1  # replies may sit unread: read them first
                    self.waiting[waiter] = relook
                else:
                    del self.waiting[waiter]
                    waiter.out_of_time(now - waiter.started if waiter.looks else None)
            except Exception as exc:  # that round's bug: the others still end, re-armed
                self._failed(waiter, exc)
        if self._timer is None and self.waiting:
            self._due = next(iter(self.waiting.values()))
            self._timer = loop.call_at(self._due, self._fire)


class _OneRound(Waiting):
    """The `Waiting` of a `Timing` made for one round: its timer is disarmed as soon as
    no round waits (else it would stay in the loop until due, keeping it)."""

    __slots__ = ()

    def discard(self, waiter: Waiter) -> None:
        self.waiting.pop(waiter, None)
        if not self.waiting:
            self.close()


@dataclass(frozen=True, slots=True)
class Timing:
    """How long a round waits: whether it gives up on a master reported silent
    (``node_timeout`` of silence, acquisition), and at most (``max_wait``). A deadline
    timer more than ``min(node_timeout, max_wait) / 2`` late ran in a busy loop.
    ``one_round``: made for one round (its timer disarmed once the round ends; a shared
    one's stays armed, so that a round decided in time makes no timer handle)."""

    give_up_silent: bool
    max_wait: float
    node_timeout: float = 0.1
    one_round: bool = field(default=False, compare=False)
    rounds: Waiting = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = _OneRound if self.one_round else Waiting
        object.__setattr__(self, "rounds", kind(self.max_wait, self.node_timeout))


async def wait_until(
    futures: Sequence[asyncio.Future[Any]], enough: Callable[[], bool], within: float
) -> None:
    """Wait until ``enough()``, every one of ``futures`` ended, or ``within`` seconds
    passed. A wait that ended more than ``within / 2`` after it was due ran in a busy
    loop (replies may sit unread): it looks again once the loop has polled (1 ms
    later, a few times at most) before it ends short of ``enough()``."""
    loop = asyncio.get_running_loop()
    deadline = due = loop.time() + within
    looks = 0
    while not enough():
        pending = [future for future in futures if not future.done()]
        now = loop.time()
        if not pending:
            return
        if now >= deadline:
            if looks >= _RELOOKS or now - due <= within / 2:
                return
            looks, due = looks + 1, now + _RELOOK
        else:
            due = deadline
        await asyncio.wait(pending, timeout=due - now, return_when=asyncio.FIRST_COMPLETED)
