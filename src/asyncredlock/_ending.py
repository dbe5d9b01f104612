"""Who hears of a lease's end: its ``async with`` block, the tasks in
``wait_lost()``, and the loss callbacks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

import anyio

__all__ = ["Ending"]

T = TypeVar("T")


class Ending(Generic[T]):
    """The end of ``owner`` (a lease), as told to those who depend on it.

    ``announce()`` tells it once: `wait` returns, and on a loss the callbacks are
    scheduled on the event loop (so an error in one goes to the loop's exception
    handler, as for any callback). The block's cancel scope is cancelled by the
    lease itself, only when it loses the lock while the block runs.
    """

    __slots__ = ("_callbacks", "_event", "known", "lost", "owner", "scope")

    def __init__(self, owner: T) -> None:
        self.owner = owner  # what the callbacks are called with
        self.known = False  # announced
        self.lost = False
        self.scope: anyio.CancelScope | None = None  # the async with block's
        self._event: asyncio.Event | None = None  # made only when someone waits
        self._callbacks: list[Callable[[T], object]] = []

    def announce(self, *, lost: bool) -> None:
        """The end is known: wake the waiters, and call back on a loss."""
        if self.known:
            return
        self.known, self.lost = True, lost
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        if lost:
            loop = asyncio.get_running_loop()
            for callback in callbacks:
                loop.call_soon(callback, self.owner)

    async def wait(self) -> bool:
        """Wait for `announce`; whether it was a loss."""
        if not self.known:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        return self.lost

    def add(self, callback: Callable[[T], object]) -> None:
        """Call ``callback`` on a loss; soon, if the lease is lost already, and
        never once it is released."""
        if not self.known:
            self._callbacks.append(callback)
        elif self.lost:
            asyncio.get_running_loop().call_soon(callback, self.owner)

    def remove(self, callback: Callable[[T], object]) -> int:
        """Forget every registration of ``callback``; how many there were."""
        kept = [each for each in self._callbacks if each != callback]
        removed = len(self._callbacks) - len(kept)
        self._callbacks = kept
        return removed

    def enter_block(self) -> None:
        """The lease's ``async with`` block starts: a scope to cancel on loss."""
        self.scope = anyio.CancelScope()
        self.scope.__enter__()

    def exit_block(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """The block ends; whether its scope swallowed the exception (its own
        cancellation)."""
        scope, self.scope = self.scope, None
        assert scope is not None
        return bool(scope.__exit__(exc_type, exc, tb))
