"""The I/O engine: one multiplexed, pipelined connection per master.

redis-py opens and authenticates each connection (every form a user can configure), then hands
the socket to a `Link`, whose ``asyncio.Protocol`` parses replies with hiredis. Every command for
the master goes out on that connection, in order: commands of one event-loop iteration leave in
one write (one behind at most one other, at once), replies resolve the callers' futures (no task
per call), an undo runs after its ``SET``, and a script the master lost (``NOSCRIPT``) is sent
again only with nothing sent behind it (else that call fails, unrun).

A master is *silent* when requests have been out for ``node_timeout`` with not one byte back,
judged only by a timer that fired on time and with nothing unread in the socket (a busy loop
says nothing about the master); any byte readmits it. After ``socket_timeout`` of silence the
connection is dropped, its calls fail, and the silence ends with them: the next call opens a
new connection, judged afresh. An idle connection PINGs after socket_timeout (a silent cut
shows). A cold burst of callers opens one connection per master.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._connection import Connection, Request
from ._liveness import Heartbeat
from ._log import log_master_readmitted, log_ping_refused, refuses_ping, turned_silent
from ._spin import Spin, spin_of
from ._telemetry import master_error
from ._tls import lost_reason
from ._wire import ClosedError, Hook, Opener, Reply, pack_args

__all__ = ["Link"]


class Link:
    """Every call to one master, on one connection, in order.

    Args:
        name: The master's display name, for errors.
        opener: Opens a connection and attaches the protocol to it.
        node_timeout: Silence, with requests out, after which the master is `silent`.
        socket_timeout: Silence after which the connection is dropped and its calls
            fail; also the idle time after which it PINGs.
        preload: Commands sent first on every new connection, replies unread
            (``SCRIPT LOAD`` of the scripts: no ``NOSCRIPT`` reorders the calls).
        busy_poll: Seconds to poll for the reply to a call sent on an idle
            connection when the loop has nothing else to run (`_spin`); 0: never.
    """

    def __init__(
        self,
        name: str,
        opener: Opener,
        *,
        node_timeout: float,
        socket_timeout: float,
        preload: Sequence[tuple[Any, ...]] = (),
        busy_poll: float = 0.0,
    ) -> None:
        self.name = name
        self.opener = opener
        self.node_timeout = node_timeout
        self.socket_timeout = socket_timeout
        self.preload = tuple((pack_args(command), command) for command in preload)
        self.busy_poll = busy_poll
        #: The event loop's busy poller, once connected (None: not polling).
        self.spin: Spin | None = None
        #: Requests sent or waiting for the connection, not answered yet.
        self.outstanding = 0
        #: Whether requests have been out for ``node_timeout`` with no byte back.
        self.silent = False
        self._unheard = False  # dropped while silent, not heard from since
        #: Called when the master turns silent (rounds waiting on it decide).
        self.watchers: set[Callable[[], None]] = set()
        self.connections = 0  # connections opened so far
        self.pings = 0  # PINGs sent on an idle connection
        self._ping_out: asyncio.Future[Reply] | None = None  # one out, not a caller's
        self.closed = False
        self._conn: Connection | None = None
        self._queued: list[tuple[bytes, Request]] = []
        self._connecting: asyncio.Task[None] | None = None
        self.quiet_since = math.inf  # since when nothing was heard with calls out
        self._watchdog: asyncio.TimerHandle | None = None
        self._watchdog_due = 0.0
        self._idle: asyncio.Future[None] | None = None
        # every unresolved call's future -> its hook and index, if any: called at
        # once with the reply, in the callback that read it (no loop iteration, no
        # handle per reply); only futures made here can have one
        self._hooks: dict[asyncio.Future[Reply], tuple[Hook, int] | None] = {}

    def __repr__(self) -> str:
        return f"<Link {self.name} outstanding={self.outstanding} silent={self.silent}>"

    @property
    def connected(self) -> bool:
        """Whether a connection is open (calls go out on it now)."""
        return self._conn is not None and not self._conn.lost

    # -- calls -------------------------------------------------------------------

    def call(
        self, args: tuple[Any, ...], source: str | None = None, *, packed: bytes | None = None
    ) -> asyncio.Future[Reply]:
        """Send a command; the future resolves with its `Reply`, and never raises.

        Args:
            args: The command and its arguments.
            source: For an ``EVALSHA``: the script, for a ``NOSCRIPT`` reply (sent as
                ``EVAL`` if nothing went out behind it, else the call fails, unrun).
            packed: ``args`` already in RESP (packed once for several masters).
        """
        if packed is None:
            packed = pack_args(args)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        if self.closed:
            future.set_result(Reply(error=ClosedError("this AsyncRedlock is closed")))
            return future
        self._hooks[future] = None
        if self.outstanding == 0:
            self.quiet_since = loop.time()
            self._arm(self.node_timeout)
        self.outstanding += 1
        conn = self._conn
        if conn is not None and not conn.lost:
            conn.send(packed, (future, args, source), ahead=self.outstanding - 1)
        else:
            self._queued.append((packed, (future, args, source)))
            if self._connecting is None:
                self._connecting = loop.create_task(self._connect())
        return future

    def listen(self, future: asyncio.Future[Reply], hook: Hook, index: int) -> bool:
        """Have ``hook(index, reply)`` called the moment ``future``'s reply is read,
        before its callbacks run. One hook per future, only on one this link made and
        has not resolved: ``False`` otherwise (the caller falls back to a callback)."""
        if self._hooks.get(future, True) is not None:  # not ours, resolved or hooked
            return False
        self._hooks[future] = (hook, index)
        return True

    def unlisten(self, future: asyncio.Future[Reply]) -> None:
        """Forget ``future``'s hook, if any."""
        if future in self._hooks:
            self._hooks[future] = None

    def resolve(self, future: asyncio.Future[Reply], reply: Reply) -> None:
        """Deliver a reply (or a failure) to one caller."""
        self.outstanding -= 1
        error = reply.error  # an ACL refusing our PING: logged once, not counted
        ours = future is self._ping_out and refuses_ping(error)
        if error is not None and not isinstance(error, ClosedError) and not ours:
            master_error(self.name, error)
        hooked = self._hooks.pop(future, None)
        if not future.done():  # a caller never cancels it; closing may have failed it
            future.set_result(reply)
            if hooked is not None:
                try:
                    hooked[0](hooked[1], reply)
                except Exception as exc:  # never let it stop the reading of replies
                    asyncio.get_running_loop().call_exception_handler(
                        {"message": f"reply hook failed on {self.name}", "exception": exc}
                    )
        if future is self._ping_out:
            self._ping_out = None
        if self.outstanding == 0:
            self.quiet_since = math.inf
        if not self.calls:
            idle, self._idle = self._idle, None
            if idle is not None and not idle.done():
                idle.set_result(None)

    @property
    def calls(self) -> int:
        """Callers' calls outstanding (`outstanding` less the link's own PING)."""
        return self.outstanding - (self._ping_out is not None)

    async def wait_idle(self) -> None:
        """Wait until no caller's call is outstanding."""
        if self.calls:
            if self._idle is None:
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)

    # -- liveness ----------------------------------------------------------------

    def heard(self, conn: Connection) -> None:
        """Bytes arrived on ``conn``: the master is alive."""
        now = asyncio.get_running_loop().time()
        if conn.heartbeat is not None:
            conn.heartbeat.heard(now)
        if self.outstanding:
            self.quiet_since = now
        if self.silent or self._unheard:
            self.silent = self._unheard = False
            log_master_readmitted(self.name)

    def unread(self) -> bool:
        """Whether bytes from the master wait unread in the socket: our loop is behind."""
        conn = self._conn
        return conn is not None and conn.unread()

    def _arm(self, delay: float) -> None:
        if self._watchdog is None:
            loop = asyncio.get_running_loop()
            self._watchdog_due = loop.time() + delay
            self._watchdog = loop.call_at(self._watchdog_due, self._check)

    def _check(self) -> None:
        self._watchdog = None
        if self.outstanding == 0 or self.closed:
            return
        now = asyncio.get_running_loop().time()
        if now - self._watchdog_due > self.node_timeout / 2:
            # Our loop is late: replies may be sitting unread. Judge after the
            # loop has polled the sockets again.
            self._arm(self.node_timeout / 4)
            return
        conn = self._conn
        if conn is None or conn.lost:
            # Connecting: nothing could be answered yet (a slow connection attempt
            # is this process's loop or the network; the attempt has its own
            # timeout). Silence is counted from when the calls are sent.
            self._arm(self.node_timeout)
            return
        if conn.out and len(conn.pending) == len(conn.out):
            conn.flush()  # the loop ran this before their write: nothing is out yet
        quiet = now - self.quiet_since
        if quiet >= self.node_timeout and conn.unread():
            self.heard(conn)  # replies are there; our loop has not read them yet
            quiet = 0.0
        if quiet >= self.socket_timeout:
            self._drop(RedisTimeoutError(f"no reply within {self.socket_timeout:g} s"))
            return
        if quiet >= self.node_timeout:
            if not self.silent:
                self.silent = True
                turned_silent(self.name, quiet, self.watchers)
            self._arm(min(self.node_timeout, self.quiet_since + self.socket_timeout - now))
        else:
            self._arm(self.quiet_since + self.node_timeout - now)

    # -- connections -------------------------------------------------------------

    async def _connect(self) -> None:
        conn = Connection(self)
        try:
            await self.opener(conn)
        except Exception as exc:
            self._connecting = None
            error = exc if isinstance(exc, RedisConnectionError) else _connection_error(exc)
            self._fail_queued(error)
            return
        finally:
            if self.closed and conn.transport is not None:
                conn.transport.abort()
        self._connecting = None
        if self.closed:
            return
        self.connections += 1
        self.spin = spin_of(asyncio.get_running_loop()) if self.busy_poll and conn.fd >= 0 else None
        self._conn = conn  # silence is counted from the queued calls' write (flush)
        if conn.transport is not None:  # idle, it PINGs: a silent cut shows as silence
            dead = functools.partial(self._dead, conn)
            conn.heartbeat = Heartbeat(conn.transport, self.socket_timeout, self._ping, dead)
        for packed, command in self.preload:  # one request each (`Connection.last_word`)
            conn.send(packed, (None, command, None))
        queued, self._queued = self._queued, []
        for packed, request in queued:
            conn.send(packed, request)

    def _ping(self) -> None:
        if self.closed:  # its connection is about to go: nothing to watch
            return
        self.pings += 1  # judged like any call (a refusal, an ACL without +ping, answers)
        self._ping_out = self.call(("PING",))
        self._ping_out.add_done_callback(functools.partial(log_ping_refused, self.name))

    def _dead(self, conn: Connection) -> None:
        # the PING unanswered (the watchdog may drop it first): later calls go to a new
        # connection at once, not to this one until its connection_lost
        if self._conn is conn:
            self._drop(RedisTimeoutError(f"no reply to PING within {self.socket_timeout:g} s"))

    def dropped(self, conn: Connection, exc: Exception | None) -> None:
        """The connection was closed (by the master, the network, or us)."""
        if self._conn is conn:
            self._conn = None
            self._unsilence()
        unanswered = None if conn.replied else conn.transport
        why = lost_reason(self.name, exc, unanswered, conn.last_word())
        conn.fail(RedisConnectionError(why))

    def _drop(self, error: Exception) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.fail(error)
        self._fail_queued(error)
        self._unsilence()

    def _unsilence(self) -> None:
        # No call is out: left silent, it would get none from acquisitions (they skip
        # it), so never a byte to readmit it. Its next call is judged afresh.
        self._unheard, self.silent = self._unheard or self.silent, False

    def _fail_queued(self, error: Exception) -> None:
        queued, self._queued = self._queued, []
        for _, (future, _, _) in queued:
            if future is not None:
                self.resolve(future, Reply(error=error))

    async def aclose(self) -> None:
        """Fail every call still out, then close the connection."""
        if self.closed:
            return
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait([connecting])
        error = ClosedError("this AsyncRedlock was closed while the call was out")
        self._fail_queued(error)
        conn, self._conn = self._conn, None
        if conn is None:
            return
        pending, conn.pending = conn.pending, collections.deque()
        for future, _, _ in pending:
            if future is not None:
                self.resolve(future, Reply(error=error))
        if conn.transport is not None and not conn.lost:
            conn.flush()
            conn.transport.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(conn.closed), 1.0)
            if not conn.closed.done():
                conn.transport.abort()


def _connection_error(exc: Exception) -> RedisConnectionError:
    error = RedisConnectionError(f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
