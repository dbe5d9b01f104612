"""One socket to a master, as `Link` (``_transport``) uses it: the requests in flight in
order, the writes of one loop iteration joined, and the replies parsed by hiredis and handed
to their callers; an error reply no caller took kept as the master's last word."""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Protocol, cast

import hiredis
from redis.exceptions import ResponseError

from ._liveness import Heartbeat, readable
from ._spin import Spin
from ._wire import Reply, Stream, pack

__all__ = ["Connection", "Owner", "Request"]


class Owner(Protocol):
    """What a `Connection` needs of its link (`Link`)."""

    spin: Spin | None
    busy_poll: float
    quiet_since: float

    def heard(self, conn: Connection) -> None: ...

    def resolve(self, future: asyncio.Future[Reply], reply: Reply) -> None: ...

    def dropped(self, conn: Connection, exc: Exception | None) -> None: ...


#: A request on the wire: its future (None: the link's own), its command's args, source.
Request = tuple["asyncio.Future[Reply] | None", "tuple[Any, ...]", "str | None"]


class Connection(Stream):
    """One socket to the master: the requests in flight, and the writes to join."""

    def __init__(self, link: Owner) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.fd = -1  # the socket's, for the busy poll (-1: none)
        self.reader = hiredis.Reader()
        self.pending: collections.deque[Request] = collections.deque()
        self.out: list[bytes] = []
        self.lost = False
        self.replied = False  # any byte from the master yet
        # an error reply no caller took (a preload's, or one with nothing asked) and the
        # request then next in line: the master's last word while that one still is
        self.said: tuple[str, Request | None] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.heartbeat: Heartbeat | None = None  # PINGs the master when idle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's: no isinstance check
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        self.fd = -1 if sock is None else sock.fileno()

    def send(self, packed: bytes, request: Request, *, ahead: int | None = None) -> None:
        """Send ``packed`` now or with this iteration's write; its reply resolves ``request``.

        ``ahead``: the link's requests out before it (``None``: not a caller's call). With
        at most one (no burst on), unless a write waits, it is written now, not after the
        loop iteration's remaining callbacks; with none, a busy poll may follow (`Spin`).
        """
        self.pending.append(request)
        at_once = ahead is not None and ahead <= 1 and not self.out  # never past a waiting write
        if at_once and self.transport is not None and not self.lost:
            self.transport.write(packed)
            if ahead == 0 and self.link.spin is not None:
                self.link.spin.wrote(self.fd, self.link.busy_poll)
            return
        if not self.out:
            asyncio.get_running_loop().call_soon(self.flush)
        self.out.append(packed)

    def flush(self) -> None:
        out, self.out = self.out, []
        if out and self.transport is not None and not self.lost:
            if len(self.pending) == len(out):  # nothing older on the wire: silence is
                self.link.quiet_since = asyncio.get_running_loop().time()  # from this write
            self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        link, self.replied = self.link, True
        link.heard(self)
        reader = self.reader
        reader.feed(data)
        pending = self.pending
        demoted = False
        while (reply := reader.gets()) is not False:
            try:  # free unless raised (zero-cost exceptions): nothing more on each reply
                future, args, source = pending.popleft()
            except IndexError:  # nothing asked: a master refusing the connection says why
                self.unasked(reply)
                return
            if isinstance(reply, hiredis.ReplyError):
                text = str(reply)
                if source is not None and text.startswith("NOSCRIPT"):
                    # As EVAL (which caches it) only with nothing sent behind it: no reordering
                    if not pending:
                        self.send(pack("EVAL", source, *args[2:]), (future, args, None))
                        continue
                    self.send(pack("SCRIPT", "LOAD", source), (None, args, None))
                # a master turned replica (a Sentinel failover): reconnect to the new one
                demoted = demoted or text.startswith("READONLY")
                if future is not None:
                    link.resolve(future, Reply(error=ResponseError(text)))
                else:  # a preload's: maybe the master refusing the connection (maxclients)
                    self.said = (text, pending[0] if pending else None)
            elif future is not None:
                link.resolve(future, Reply(reply))
        if demoted and self.transport is not None:
            self.transport.close()

    def unasked(self, reply: object) -> None:
        """A reply to nothing asked: kept as the master's last word; the connection closes."""
        self.said = (str(reply) if isinstance(reply, hiredis.ReplyError) else repr(reply), None)
        if self.transport is not None:
            self.transport.close()

    def last_word(self) -> str | None:
        """The master's error reply that no caller took, if nothing was read after it."""
        if self.said is None:
            return None
        text, then_next = self.said
        return text if (self.pending[0] if self.pending else None) is then_next else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if not self.closed.done():
            self.closed.set_result(None)
        self.link.dropped(self, exc)

    def unread(self) -> bool:
        """Whether bytes from the master wait unread: our loop is behind, not the master."""
        return not self.lost and readable(self.transport)

    def fail(self, error: Exception) -> None:
        """Fail every request still in flight and drop the socket."""
        self.lost = True
        pending, self.pending = self.pending, collections.deque()
        for future, _, _ in pending:
            if future is not None:
                self.link.resolve(future, Reply(error=error))
        if self.transport is not None:
            self.transport.abort()
