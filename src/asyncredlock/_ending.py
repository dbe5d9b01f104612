"""Who hears of a lease's end: its ``async with`` block, the tasks in
``wait_lost()``, and the loss callbacks."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

import anyio

__all__ = ["Ending", "is_async_callable"]

T = TypeVar("T")


class Ending(Generic[T]):
    """The end of a lease, as told to those who depend on it.

    ``announce()`` tells it once: `wait` returns, and on a loss the callbacks are
    scheduled on the event loop (so an error in one goes to the loop's exception
    handler, as for any callback). The block's scope is cancelled (`cancel_block`)
    by the lease itself, only when it is lost while the block runs.
    """

    # It holds no reference to its lease (the callbacks get the lease as an
    # argument), so a lease and its Ending form no cycle: a lease is freed by
    # reference counting, not left to the cyclic collector (thousands a second).
    __slots__ = ("_callbacks", "_event", "known", "lost", "scope")

    def __init__(self) -> None:
        self.known = False  # announced
        self.lost = False
        self.scope: anyio.CancelScope | None = None  # the async with block's
        self._event: asyncio.Event | None = None  # made only when someone waits
        self._callbacks: list[Callable[[T], object]] = []

    def announce(self, owner: T, *, lost: bool) -> None:
        """The end of ``owner`` is known: wake the waiters, and call back on a loss."""
        if self.known:
            return
        self.known, self.lost = True, lost
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        if lost:
            loop = asyncio.get_running_loop()
            for callback in callbacks:
                loop.call_soon(callback, owner)

    async def wait(self) -> bool:
        """Wait for `announce`; whether it was a loss."""
        if not self.known:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        return self.lost

    def add(self, callback: Callable[[T], object], owner: T) -> None:
        """Call ``callback(owner)`` on a loss; soon, if it is lost already, and
        never once it is released.

        Raises:
            TypeError: ``callback`` is not callable, is an async function (its
                coroutine would never run), or cannot be called with the lease alone
                (a callable whose signature cannot be read is taken).
        """
        if not callable(callback) or is_async_callable(callback):
            raise TypeError(
                "a loss callback is a plain function taking the lease (to run async"
                f" code, start a task from it), not {callback!r}"
            )
        unbound = _not_one_argument(callback)
        if unbound is not None:
            raise TypeError(
                f"a loss callback is called with the lease, one argument: {callback!r}"
                f" cannot be ({unbound})"
            )
        if not self.known:
            self._callbacks.append(callback)
        elif self.lost:
            asyncio.get_running_loop().call_soon(callback, owner)

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

    def cancel_block(self) -> None:
        """Cancel the ``async with`` block, if one is running (the lease is lost)."""
        if self.scope is not None:
            self.scope.cancel()

    def block_cancelled(self) -> bool:
        """Whether the running block's scope was cancelled (the lease lost)."""
        return self.scope is not None and self.scope.cancel_called

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


def _not_one_argument(callback: Callable[..., object]) -> str | None:
    """Why ``callback`` cannot be called with one positional argument; ``None`` if
    it can, or if its signature cannot be read (a builtin: found at the call)."""
    try:
        signature = inspect.signature(callback, follow_wrapped=False)  # a wrapper's own
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None)
    except TypeError as exc:
        return str(exc)
    return None


def is_async_callable(obj: object) -> bool:
    """Whether calling ``obj`` makes a coroutine: an async function, or an object
    whose class's ``__call__`` is one (either in a ``functools.partial`` too)."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    call = getattr(type(obj), "__call__", None)  # noqa: B004 (its class's, not callable())
    return inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(call)
