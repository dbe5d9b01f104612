"""One master: its client, how scripts run on it, and how many calls it has out."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from ._scripts import Script, evalsha

__all__ = ["Node", "Reply"]


@dataclass(frozen=True, slots=True)
class Reply:
    """The result of one call to one master: a value, or the exception it raised."""

    value: Any = None
    error: Exception | None = None


class Node:
    """A master and the client that talks to it.

    Args:
        client: A ``redis.asyncio`` client (standalone or cluster).
        name: Display name used in errors and inspection.
        owned: Whether asyncredlock built the client and must close it.
    """

    def __init__(self, client: Any, name: str, *, owned: bool) -> None:
        self.client = client
        self.name = name
        self.owned = owned
        self.in_flight = 0
        # Calls a round gave up on because the master stayed silent. While too many
        # are out and it still says nothing, it is treated as down without sending.
        self.overdue = 0
        # When the master last answered anything, and since when it has had calls
        # out without a break (time.monotonic()).
        self.last_answer = -math.inf
        self.busy_since = -math.inf

    def __repr__(self) -> str:
        return f"Node({self.name!r})"

    async def call(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Reply:
        """Run ``script`` here; never raises an ``Exception``, returns it in the reply."""
        if self.in_flight == 0:
            self.busy_since = time.monotonic()
        self.in_flight += 1
        try:
            reply = Reply(await evalsha(self.client, script, keys, args))
        except ResponseError as exc:
            reply = Reply(error=exc)
        except Exception as exc:
            return Reply(error=exc)
        finally:
            self.in_flight -= 1
        self.last_answer = time.monotonic()
        return reply

    def silent(self, now: float, patience: float) -> bool:
        """Whether calls are out here and nothing was answered for ``patience`` seconds."""
        return self.in_flight > 0 and now - max(self.last_answer, self.busy_since) > patience

    async def aclose(self) -> None:
        """Close the client if asyncredlock created it."""
        if self.owned:
            await self.client.aclose()
