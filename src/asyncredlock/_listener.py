"""The wake-up subscription to one master (see ``_wakeup``): its connection, opened
like the command connection (redis-py's settings, then a hiredis protocol owns the
socket), reopened when lost, and PINGed when it has been quiet (see ``_liveness``)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import cast

import hiredis

from ._liveness import Heartbeat
from ._log import log_ping_refusal, log_subscribe_refused, log_unsubscribe_refusal
from ._node import Node
from ._wire import Stream, pack

__all__ = ["RECONNECT_DELAY", "Listener"]

logger = logging.getLogger("asyncredlock")

#: Pause before a listener reconnects after losing its connection (seconds).
RECONNECT_DELAY = 0.2

# The commands whose refusal by the master's ACL (NOPERM) is logged at WARNING
_LOGGED = (("SUBSCRIBE",), ("UNSUBSCRIBE",), ("PING",))


class _Subscription(Stream):
    """One subscriber connection: parses what the master pushes; PINGs it when quiet."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.heartbeat: Heartbeat | None = None
        # the commands sent whose reply is still to come, in order (one channel
        # each): an error reply names no channel, this says whose it is
        self.expected: deque[tuple[str, ...]] = deque()
        #: Whether the master confirmed a SUBSCRIBE on it: its loss may lose a release
        self.subscribed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's: no isinstance check
        self.transport = cast(asyncio.Transport, transport)

    def send(self, *command: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(pack(*command))
            self.expected.append(command)

    def watch(self, interval: float) -> None:
        """PING the master after ``interval`` of quiet; drop the connection when
        that goes unanswered as long (see `Heartbeat`)."""
        if self.transport is not None:
            self.heartbeat = Heartbeat(self.transport, interval, lambda: self.send("PING"))

    def data_received(self, data: bytes) -> None:
        if self.heartbeat is not None:
            self.heartbeat.heard()
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if isinstance(reply, list) and len(reply) == 3:
                kind = _text(reply[0])
                if kind != "message" and self.expected:  # a command's reply
                    self.expected.popleft()
                self.subscribed = self.subscribed or kind == "subscribe"
                self.listener.handle(kind, _text(reply[1]), reply[2])
                continue
            command = self.expected.popleft() if self.expected else ()
            if isinstance(reply, hiredis.ReplyError):
                self.listener.refused(str(reply), command)
            elif not (isinstance(reply, list) and reply[:1] == [b"pong"]):  # a heartbeat's
                logger.debug("subscription to %s: unexpected reply %r", self.listener.name, reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if not self.closed.done():
            self.closed.set_result(None)


class Listener:
    """The subscription connection to one master, reopened when lost."""

    def __init__(
        self,
        node: Node,
        index: int,
        on_message: Callable[[int, str, bytes], None],
        on_lost: Callable[[str | None], None],
    ) -> None:
        assert node.listen_opener is not None
        self.index = index
        self.name = node.name
        self.opener = node.listen_opener
        self.quiet = node.socket_timeout  # before a PING, then before a drop
        self.on_message = on_message
        self.on_lost = on_lost
        self.unconfirmed: set[str] = set()  # resubscribed after a loss, not confirmed
        self.channels: set[str] = set()
        self.confirmed: dict[str, asyncio.Future[None]] = {}
        self.asked: dict[str, int] = {}  # SUBSCRIBEs sent on this connection, unanswered
        self.connection: _Subscription | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        #: The master's refusal of a SUBSCRIBE on this connection (its ACL), if any.
        self.refusal: str | None = None

    def subscribe(self, channel: str) -> asyncio.Future[None]:
        """Add ``channel``; the future completes when the master confirmed it (is
        cancelled once closed: nothing is opened after `aclose`)."""
        if self.closed:
            refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            refused.cancel()
            return refused
        self.channels.add(channel)
        future = self.confirmed.get(channel)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self.confirmed[channel] = future
            if self.task is None:
                self.task = asyncio.get_running_loop().create_task(self._run())
            elif self.connection is not None:
                self._ask(self.connection, channel)
        return future

    def unsubscribe(self, channel: str) -> None:
        """Drop ``channel`` (nothing waits on it any more)."""
        self.channels.discard(channel)
        future = self.confirmed.pop(channel, None)
        if future is not None and not future.done():
            future.cancel()
        if self.connection is not None:
            self.connection.send("UNSUBSCRIBE", channel)

    async def _run(self) -> None:
        while self.channels:
            connection = _Subscription(self)
            try:
                await self.opener(connection)
                self.connection, self.refusal = connection, None
                connection.watch(self.quiet)
                self._ask(connection, *self.channels)
                await connection.closed
            except Exception as exc:
                logger.debug("subscription to %s lost: %r", self.name, exc)
            finally:
                self.connection, self.asked = None, {}
                for future in self.confirmed.values():
                    if not future.done():
                        future.cancel()
                self.confirmed = {}
                if connection.transport is not None:
                    connection.transport.abort()
            # A connection with no subscription confirmed on it lost nothing (one that
            # failed to open, or one accepted then reset at once: a proxy whose backend is
            # down, maxclients): it wakes nobody; waiters are woken at the next confirmation
            if connection.subscribed:
                self.on_lost(None)
            await asyncio.sleep(RECONNECT_DELAY)
            loop = asyncio.get_running_loop()
            for channel in self.channels:
                self.confirmed.setdefault(channel, loop.create_future())
            self.unconfirmed = set(self.channels)
        self.task = None

    def handle(self, kind: str, channel: str, data: object) -> None:
        """One message pushed by the master."""
        if kind == "subscribe":
            left = self.asked.pop(channel, 1) - 1
            if left > 0:  # an earlier SUBSCRIBE's reply: the latest is still to come
                self.asked[channel] = left
                return
            future = self.confirmed.get(channel)
            if future is not None and not future.done():
                future.set_result(None)
            if channel in self.unconfirmed:
                # A release between the loss and now went unheard: retry now.
                self.unconfirmed.discard(channel)
                self.on_lost(channel)
        elif kind == "message":
            value = data if isinstance(data, bytes) else str(data).encode()
            self.on_message(self.index, channel, value)

    def refused(self, error: str, command: tuple[str, ...]) -> None:
        """An error reply to ``command``: a SUBSCRIBE the master's ACL refused
        (``NOPERM``) is the subscription's refusal, kept and logged at WARNING (once
        per master); a refused PING (its heartbeat's) or UNSUBSCRIBE (its channel
        stays subscribed, the subscription works) is logged as that command's
        refusal, and is no refusal of the subscription; another error, only at
        DEBUG. The refused channel's confirmation ends (its waiters poll), and a
        later waiter on it asks again; the other channels are unaffected."""
        kind = command[:1]
        if kind == ("SUBSCRIBE",):
            self._unasked(command[1])
        if not error.startswith("NOPERM") or kind not in _LOGGED:
            logger.debug("subscription to %s: error reply %r", self.name, error)
        elif kind == ("PING",):  # its heartbeat's: refused, but answered
            log_ping_refusal(self.name, error)
        elif kind == ("UNSUBSCRIBE",):
            log_unsubscribe_refusal(self.name, error)
        else:
            self.refusal = error
            log_subscribe_refused(self.name, error)

    def _unasked(self, channel: str) -> None:
        left = self.asked.pop(channel, 1) - 1
        if left > 0:  # a later SUBSCRIBE of it is still to be answered
            self.asked[channel] = left
            return
        future = self.confirmed.pop(channel, None)
        if future is not None and not future.done():
            future.cancel()
        if channel in self.unconfirmed:  # as when confirmed: a release may be unheard
            self.unconfirmed.discard(channel)
            self.on_lost(channel)

    def _ask(self, connection: _Subscription, *channels: str) -> None:
        for channel in channels:  # one command each: a refusal is of one channel
            self.asked[channel] = self.asked.get(channel, 0) + 1
            connection.send("SUBSCRIBE", channel)

    async def aclose(self) -> None:
        self.closed = True
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=RECONNECT_DELAY * 5)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
