"""Whether a connection that may stay quiet for long is still there.

A wake-up subscription only receives. Should a NAT, a firewall or a load balancer on the
way forget it (past its idle timeout, or restarted), neither end is told: the master's
announcements would go unheard for as long as the client runs, and every waiter would
fall back on its retry delay. So a subscription PINGs its master after a quiet spell,
and is dropped when even that goes unanswered (its listener then reopens it and wakes
every waiter, as for any lost subscription). The traffic also keeps such middleboxes
from forgetting it in the first place.

Bytes waiting unread in the socket count as an answer: a late event loop is not a
silent master (the command connections judge silence the same way).
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable

__all__ = ["Heartbeat", "readable"]


def readable(transport: asyncio.BaseTransport | None) -> bool:
    """Whether bytes from the peer wait in ``transport``'s socket, unread (False for
    a transport without one, closed, or gone)."""
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        if hasattr(select, "poll"):  # no limit on descriptor numbers, unlike select()
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        ready, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return bool(ready)


class Heartbeat:
    """Watches one connection: after ``interval`` seconds with nothing received,
    ``ping()`` (which must make the peer answer); after ``interval`` more with still
    nothing, ``dead()``, by default the transport aborted (its protocol's
    ``connection_lost`` follows).

    Args:
        transport: The connection's transport.
        interval: Seconds of quiet before the PING, and then before the drop.
        ping: Sends the PING.
        dead: Drops the connection (``None``: aborts the transport).
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        interval: float,
        ping: Callable[[], None],
        dead: Callable[[], None] | None = None,
    ) -> None:
        self.transport = transport
        self.interval = interval
        self.ping = ping
        self.dead = transport.abort if dead is None else dead
        loop = asyncio.get_running_loop()
        self.heard_at = loop.time()
        self.pinged = False  # a PING is out, unanswered
        self.pings = 0
        self._handle = loop.call_at(self.heard_at + interval, self._check)

    def heard(self, now: float | None = None) -> None:
        """Bytes arrived (at ``now``, the loop's time, if known): it is alive."""
        self.heard_at = asyncio.get_running_loop().time() if now is None else now
        self.pinged = False

    def stop(self) -> None:
        """Stop watching (the connection is closed, or closing)."""
        self._handle.cancel()

    def _check(self) -> None:
        if self.transport.is_closing():  # dropped already: its connection_lost is due
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now < self.heard_at + self.interval:  # heard meanwhile
            self._handle = loop.call_at(self.heard_at + self.interval, self._check)
            return
        if readable(self.transport):  # the answer is there; the loop has not read it
            self._handle = loop.call_at(now + self.interval, self._check)
            return
        if self.pinged:
            self.dead()
            return
        self.pinged = True
        self.pings += 1
        self.ping()
        self._handle = loop.call_at(now + self.interval, self._check)
