"""What the fault proxy (`_proxy`) forwards, and when: chunks stamped with the moment
they are due, waits that never end before it, and a connection reset."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from dataclasses import dataclass

__all__ = ["Chunk", "reset_transport", "until"]

# A wait that ended early sleeps again at least this long: not a spin on uvloop, whose
# timers below half a millisecond run at once.
_AGAIN = 0.001


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes read from one side, to be written to the other at `due` (`time.monotonic`:
    uvloop's ``loop.time()`` counts whole milliseconds, floored)."""

    due: float
    data: bytes | None  # None: the sender half-closed (EOF)


async def until(due: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``due``, never less: uvloop rounds a
    sleep to whole milliseconds, so one may end early; it sleeps again then."""
    wait = due - time.monotonic()
    while wait > 0:
        await asyncio.sleep(wait)
        if (wait := due - time.monotonic()) > 0:
            wait = max(wait, _AGAIN)


def reset_transport(transport: asyncio.Transport) -> None:
    """Close `transport` with a TCP RST rather than a FIN (SO_LINGER 0)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
