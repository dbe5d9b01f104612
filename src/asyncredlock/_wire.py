"""What goes over a connection to a master, and what comes back: `Reply`, the
protocol an `Opener` attaches, and RESP packing (hiredis)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["ClosedError", "Hook", "Opener", "Reply", "Stream", "pack", "pack_args"]


@dataclass(slots=True)
class Reply:
    """The result of one call to one master: a value, or the exception it raised.

    Never changed once made; not a frozen dataclass only because one is made per
    reply, and a frozen one takes twice as long to build."""

    value: Any = None
    error: Exception | None = None


class ClosedError(RedisConnectionError):
    """The ``AsyncRedlock`` was closed while the call was out (its outcome is unknown)."""


class Stream(asyncio.Protocol):
    """A protocol an `Opener` can attach to a connection it opened."""

    #: What opened the socket and must live as long as it does (an asyncio
    #: ``StreamWriter`` closes its transport when it is garbage-collected).
    opened_by: object = None


#: Opens a connection to the master and attaches ``protocol`` to it: once it
#: returns, ``protocol.connection_made`` has been called.
Opener = Callable[[Stream], Awaitable[None]]

#: Called with (index, reply) when a reply is read; see `Link.listen`.
Hook = Callable[[int, "Reply"], None]


#: One command, given as a tuple, in RESP (hiredis's stub types the argument as a
#: 1-tuple; it takes any length).
pack_args = cast(Callable[[tuple[Any, ...]], bytes], hiredis.pack_command)


def pack(*args: Any) -> bytes:
    """One command in RESP."""
    return pack_args(args)
