"""Turns to ask the masters for a semaphore's slots, shared by the tasks of one
``AsyncRedlock`` (see `Turns`)."""

from __future__ import annotations

import asyncio
import collections
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._core import Core

__all__ = ["TURNS", "Turns"]


class Turns:
    """Turns to ask the masters, per semaphore key, for the tasks of one
    ``AsyncRedlock``: at most ``limit`` of them attempt at once (more could not all
    get a slot: they would split the masters' grants, fail and wake one another);
    the others wait here, in arrival order. A turn ends with its ``acquire()``."""

    def __init__(self) -> None:
        self.taken: dict[str, int] = {}
        self.waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}

    def busy(self, key: str, limit: int) -> bool:
        """Whether a task that asks now waits for its turn."""
        return self.taken.get(key, 0) >= limit or key in self.waiting

    async def take(self, key: str, limit: int) -> None:
        if not self.busy(key, limit):
            self.taken[key] = self.taken.get(key, 0) + 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(key, collections.deque()).append(turn)
        try:
            await turn  # passed on by `give`: the count stays
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.give(key)  # passed on just as it was cancelled: on to the next
            else:  # `give` may have dropped it (and its queue) already
                queue = self.waiting.get(key)
                if queue is not None and turn in queue:
                    queue.remove(turn)
                    if not queue:
                        del self.waiting[key]
            raise

    def give(self, key: str) -> None:
        """End a turn: pass it to the first task still waiting, or count it free."""
        queue = self.waiting.get(key, collections.deque())
        while queue:
            turn = queue.popleft()
            if not turn.done():
                turn.set_result(None)
                if not queue:
                    del self.waiting[key]
                return
        self.waiting.pop(key, None)
        self.taken[key] -= 1
        if not self.taken[key]:
            del self.taken[key]


#: Each AsyncRedlock's turns (its engine's), dropped with it.
TURNS: weakref.WeakKeyDictionary[Core, Turns] = weakref.WeakKeyDictionary()
