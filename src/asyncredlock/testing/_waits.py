"""`Waits`: wait until acquisitions are parked, instead of sleeping in a test."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

from .._redlock import AsyncRedlock
from ._checks import check_count

__all__ = ["Waits"]


class Waits:
    """Counts the ``acquire()`` calls of some ``AsyncRedlock`` clients as they start
    to wait, so that a test can wait until a waiter is parked before it releases,
    kills or cancels something (no sleep standing in for "long enough").

    Counting starts when it is made (make it before the waiters start) and stops
    at the end of its ``with`` block, or at `close`.

    Attributes:
        queued: Calls that started waiting behind another task of the same client
            for the same key.
        waiting: Waits between attempts: for a release announced by the masters,
            or the retry delay (a call that waits several times counts each time;
            it failed an attempt first, and a waiter that queues on the masters is
            queued there by then).
        woken: Waits that a release announcement ended (not their retry delay).
        ahead: Attempts of a writer, or of a fair lock, that keep its place in
            the masters' queue ahead of later arrivals (readers of a read-write
            lock included): every attempt of a fair one, and an unfair writer's
            once its ``patience`` has run out. Counted once the attempt is decided.

    Raises:
        TypeError: An argument is not an ``AsyncRedlock``.
    """

    def __init__(self, *redlocks: AsyncRedlock) -> None:
        for redlock in redlocks:
            if not isinstance(redlock, AsyncRedlock):
                raise TypeError(f"Waits() takes AsyncRedlock clients, not {type(redlock).__name__}")
        self.queued = self.waiting = self.woken = self.ahead = 0
        self._changed = asyncio.Event()
        # a client listed twice is counted once
        self._cores = list({id(each._core): each._core for each in redlocks}.values())
        for core in self._cores:
            core.watchers.append(self._note)

    def _note(self, event: str) -> None:
        if event == "queued":
            self.queued += 1
        elif event == "waiting":
            self.waiting += 1
        elif event == "woken":
            self.woken += 1
        elif event == "ahead":
            self.ahead += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def reach(self, waiting: int = 0, *, queued: int = 0) -> None:
        """Return once at least ``waiting`` waits between attempts and ``queued``
        waits behind another task have started (bound it with a timeout of your
        own).

        Raises:
            TypeError: A count is not an int (a bool, or a float such as NaN, which
                every count would pass at once).
            ValueError: A count is negative.
        """
        check_count("waiting", waiting)
        check_count("queued", queued)
        while self.waiting < waiting or self.queued < queued:
            await self._changed.wait()

    def close(self) -> None:
        """Stop counting."""
        for core in self._cores:
            if self._note in core.watchers:
                core.watchers.remove(self._note)
        self._cores = []

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
