"""The end of an ``AsyncRedlock``: ``async with``, ``aclose()``, and the warning for
one dropped unclosed (`Closing`, its base)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Self

from ._core import Core
from ._operator import shut_down

__all__ = ["Closing"]


class Closing:
    """How an ``AsyncRedlock`` ends: closed by ``aclose()`` or its ``async with``, or
    dropped unclosed (warned of)."""

    _core: Core

    async def aclose(self) -> None:
        """End held leases, finish background calls, close the connections.

        A lease still held ends lost (its holder still counted on it): its
        ``async with`` block is cancelled and raises `LockLostError`,
        ``wait_lost()`` returns ``True``, its loss callbacks run; it is released
        on the masters. Waits at most ``node_timeout`` in all for those releases and
        the calls still out, then fails every call still out (the calls waiting
        on them end with an error: ``QuorumUnavailableError`` whose outcomes say
        the ``AsyncRedlock`` was closed) and closes the connections. A lock key
        whose undo was cut short expires with its TTL. Safe to call twice, at once
        (the later returns when the first has closed), and to cancel (it closes first).

        Raises:
            RuntimeError: Called on another event loop than the one this
                ``AsyncRedlock`` was first used on. Once that loop is closed, it can
                no longer be closed: only that loop could close its connections.
        """
        await self._close(None)

    async def _close_now(self) -> None:
        """`aclose`, waiting for nothing: the calls still out fail at once (the command
        line, interrupted: its calls are reads, with nothing to undo, or
        ``force-release``'s deletes, which it says may or may not have landed)."""
        await self._close(0.0)

    async def _close(self, wait: float | None) -> None:
        core = self._core
        if core.closing:
            await core.shut.wait()
            return
        core.check_loop()
        await shut_down(core, wait)

    def _check_open(self) -> None:
        if self._core.closing:
            raise RuntimeError("this AsyncRedlock is closed")

    async def __aenter__(self) -> Self:
        self._check_open()
        self._core.check_loop()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __del__(self, _warn: Callable[..., object] = warnings.warn) -> None:
        """Warn (`ResourceWarning`, as aiohttp's and redis-py's clients do) of one
        dropped after it was used (bound to an event loop) without being closed: its
        connections were left open, and its leases unreleased. Never raises."""
        # (_warn: bound now, as module globals may be gone at interpreter exit)
        core = self.__dict__.get("_core")  # (none if its constructor raised)
        if core is None or core.loop is None or core.closed:
            return
        _warn(
            f"unclosed {self!r}: close it (async with, or await aclose()) inside the"
            " event loop it was used on",
            ResourceWarning,
            source=self,
        )
