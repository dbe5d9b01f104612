"""`Line`: waiters in arrival order, the one queue of this process's waits.

The tasks of one client that want the same key (`_gate.Gates`) and the acquisitions
waiting for a lock channel's release (`_wakeup.Waker`) both wait in a `Line`: they
join at the end, the first is served, and one that leaves (cancelled, timed out,
served elsewhere) is taken out wherever it stands, at once.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["Line"]

T = TypeVar("T")


class Line(Generic[T]):
    """Waiters in arrival order, each at most once (compared by identity or their
    own hash)."""

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: collections.OrderedDict[T, None] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._waiting)

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def __contains__(self, waiter: object) -> bool:
        return waiter in self._waiting

    def __iter__(self) -> Iterator[T]:
        """The waiters, first first (do not join or leave while iterating)."""
        return iter(self._waiting)

    def join(self, waiter: T) -> None:
        """Add ``waiter`` at the end."""
        self._waiting[waiter] = None

    def leave(self, waiter: T) -> bool:
        """Take ``waiter`` out wherever it stands; whether it was there."""
        return self._waiting.pop(waiter, False) is None

    def first(self) -> T | None:
        """The first waiter, left in place; ``None`` if nobody waits."""
        return next(iter(self._waiting), None)

    def serve(self) -> T | None:
        """Take the first waiter out and return it; ``None`` if nobody waits."""
        if not self._waiting:
            return None
        return self._waiting.popitem(last=False)[0]
