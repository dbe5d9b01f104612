"""Waiting for a reply without putting the event loop to sleep (busy polling).

On many virtual machines an idle CPU halts, and waking the process when a reply
arrives costs tens of microseconds: longer than a round trip to a master on the same
host or rack. So after a request goes out on an idle connection, and only when the
event loop has nothing else to run, the client polls the loop's own selector for up to
``busy_poll`` seconds (never past the loop's next timer) instead of letting the loop
sleep in it: the first event the loop watches (a reply, or anything else: another
socket's bytes, a thread's ``call_soon_threadsafe``, a signal) ends the poll and is
handled at once. A poll that sees nothing makes the next ones wait their turn (1, 2,
4 ... up to 1,024 chances let pass), so a distant master costs almost nothing; a reply
caught in time resets that.

Only where the loop shows whether other work waits: asyncio's own selector event loops
(their ``_ready`` queue, ``_scheduled`` timers and ``_selector``), on a platform with
``poll()``. Elsewhere (uvloop, Windows) nothing changes.
"""

from __future__ import annotations

import asyncio
import math
import select
import weakref
from collections import deque

__all__ = ["Spin", "spin_of"]

_MAX_PENALTY = 1024

_SPINS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Spin | None] = (
    weakref.WeakKeyDictionary()
)


def spin_of(loop: asyncio.AbstractEventLoop) -> Spin | None:
    """The busy poller of ``loop``, shared by all its connections; ``None`` where
    the loop cannot tell that it has nothing else to run."""
    try:
        return _SPINS[loop]
    except KeyError:
        pass
    ready = getattr(loop, "_ready", None)
    timers = getattr(loop, "_scheduled", None)
    # an epoll or kqueue selector has a descriptor of its own (select() and poll() not)
    events = getattr(getattr(loop, "_selector", None), "fileno", None)
    spin = None
    if (
        isinstance(ready, deque)
        and isinstance(timers, list)
        and callable(events)
        and hasattr(select, "poll")
    ):
        spin = Spin(ready, events())  # holds no reference to the loop (_SPINS is weak)
    _SPINS[loop] = spin
    return spin


class Spin:
    """The sockets written to in this loop iteration, polled once it is done.

    Args:
        ready: The event loop's queue of callbacks to run.
        events: The descriptor of the loop's selector (an epoll or kqueue): readable
            when anything the loop watches is ready (a socket's bytes, a thread's
            ``call_soon_threadsafe``, a signal: the loop's wake-up socket).
    """

    __slots__ = (
        "budget",
        "caught",
        "events",
        "fds",
        "gave_way",
        "missed",
        "passed",
        "penalty",
        "ready",
        "skip",
    )

    def __init__(self, ready: deque[object], events: int) -> None:
        self.ready = ready
        self.events = events
        self.fds: list[int] = []
        self.budget = 0.0
        self.skip = 0  # chances still to let pass after a miss
        self.penalty = 0  # how many the next miss lets pass
        #: Polls that saw a reply come, that saw none, chances let pass, and polls
        #: not made or cut short because the loop had other work to run (a reply
        #: there already, a timer due): each poll counts in exactly one.
        self.caught = self.missed = self.passed = self.gave_way = 0

    def wrote(self, fd: int, budget: float) -> None:
        """A request went out on the idle connection of socket ``fd``."""
        if not self.fds:
            asyncio.get_running_loop().call_soon(self._poll)
        self.fds.append(fd)
        if budget > self.budget:
            self.budget = budget

    def _poll(self) -> None:
        fds, self.fds = self.fds, []
        budget, self.budget = self.budget, 0.0
        if self.ready:  # other work waits: the loop will not sleep anyway
            self.gave_way += 1
            return
        if self.skip:
            self.skip -= 1
            self.passed += 1
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + budget
        timers = loop._scheduled  # type: ignore[attr-defined]  # a new list when rebuilt
        timer = timers[0].when() if timers else math.inf
        poller = select.poll()  # the loop's selector: any event the loop watches
        poller.register(self.events, select.POLLIN)
        for fd in fds:  # and the sockets written to, to tell a reply from other work
            poller.register(fd, select.POLLIN)
        while not (seen := poller.poll(0)):
            now = loop.time()
            if self.ready or now >= timer:  # a signal's handler queued work, a timer is due
                self.gave_way += 1
                return
            if now >= end:
                self.missed += 1
                self.penalty = min(2 * self.penalty or 1, _MAX_PENALTY)
                self.skip = self.penalty
                return
        if any(fd != self.events and mask & select.POLLIN for fd, mask in seen):
            self.caught += 1
            self.penalty = 0
        else:  # other work for the loop, which it now does at once
            self.gave_way += 1
