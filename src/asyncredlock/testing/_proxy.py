"""A fault-injection TCP proxy: delay, blackhole, reset, forget, refuse, switched at run time.

Put a `FaultProxy` between a client and one server to make that server slow, silent or
unreachable without touching the server process::

    async with FaultProxy("127.0.0.1", server.port) as proxy:
        client = redis.asyncio.from_url(proxy.url)
        proxy.delay = 0.005        # +5 ms each way
        proxy.blackhole = True     # nothing gets through, nothing answers
        proxy.reset_connections()  # RST every open connection
        proxy.forget_connections()  # open connections silently dead (a NAT's idle timeout)
        proxy.heal()

With ``ssl_context`` (a server-side `ssl.SSLContext`) the proxy is a TLS front: it
terminates TLS from the client and forwards the plain bytes to the server, which needs
no TLS of its own; its `url` is then ``rediss://HOST:PORT``.

Each accepted connection is a *pair* (client side, upstream side). Bytes read from one
side are stamped with a due time (arrival + `delay`) and queued; one pump task per
direction writes them to the other side when due, in order. A delay therefore adds
latency without serializing throughput; a change applies to bytes read afterwards.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from types import TracebackType
from typing import Self, cast

from .._config import check_seconds
from ._checks import check_port, check_str, check_switch
from ._forward import Chunk, reset_transport, until

__all__ = ["FaultProxy"]

_READ_HIGH_WATER = 1 << 20  # queued, not yet forwarded bytes before reading pauses
_READ_LOW_WATER = 1 << 18


class _Side(asyncio.Protocol):
    """One TCP endpoint of a pair: queues what it reads, tracks its write buffer."""

    def __init__(self, proxy: FaultProxy, pair: _Pair | None = None) -> None:
        self._proxy = proxy
        self.pair = pair
        self.transport: asyncio.Transport | None = None
        self.inbox: asyncio.Queue[Chunk] = asyncio.Queue()
        self.writable = asyncio.Event()
        self.writable.set()
        self._queued = 0
        self._reading_paused = False
        self._eof_queued = False

    # -- protocol callbacks --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport; uvloop's does not subclass asyncio.Transport, hence the cast.
        self.transport = cast(asyncio.Transport, transport)
        if self.pair is None:  # a client side: the proxy decides what to do with it
            self._proxy._accepted(self)

    def data_received(self, data: bytes) -> None:
        self._receive(data)

    def eof_received(self) -> bool | None:
        self._receive(None)
        if self.transport is not None and self.transport.get_extra_info("ssl_object"):
            return None  # TLS has no half-close: the transport closes after this
        return True  # keep our write half open: the reply may still be in flight

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()  # wake a pump waiting to write here: it will see the close
        if self.pair is None:
            return
        if exc is not None:
            self.pair.abort()
        elif not self._eof_queued:
            self._queue(None)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    # -- used by the pair --

    def _receive(self, data: bytes | None) -> None:
        if self.pair is None or self.pair.closed:
            return
        if self._proxy.blackhole:
            self.pair.corrupted = True  # dropped bytes: this stream can never resume
            return
        self._queue(data)

    def _queue(self, data: bytes | None) -> None:
        self._eof_queued = self._eof_queued or data is None
        self.inbox.put_nowait(Chunk(time.monotonic() + self._proxy.delay, data))
        self._queued += len(data or b"")
        if self._queued > _READ_HIGH_WATER and self.transport and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True

    async def next_chunk(self) -> Chunk:
        """The oldest queued chunk; resumes reading once the backlog is small again."""
        chunk = await self.inbox.get()
        self._queued -= len(chunk.data or b"")
        if self._reading_paused and self._queued < _READ_LOW_WATER and self.transport:
            self._reading_paused = False
            self.transport.resume_reading()
        return chunk


class _Pair:
    """A proxied connection: client side, upstream side, and the task that pumps them."""

    def __init__(self, proxy: FaultProxy, client: _Side) -> None:
        self._proxy = proxy
        self.client = client
        self.upstream: _Side | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.corrupted = False  # bytes were dropped by a blackhole
        self.forgotten = False  # by forget_connections(): it forwards nothing, ever

    async def run(self) -> None:
        """Wait out a blackhole, connect upstream, pump both ways until both ends close."""
        try:
            await self._proxy._passable.wait()
            await self._connect_upstream()
            await self._pump_both()
        except OSError:
            pass  # the target refuses or is unreachable: the client is reset below
        finally:
            self.abort()  # no-op after a graceful close()

    async def _pump_both(self) -> None:
        upstream = self.upstream
        if upstream is None or self.closed:
            return
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._pump(self.client, upstream))
            tasks.create_task(self._pump(upstream, self.client))
        self.close()

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self._proxy.target
        _, side = await loop.create_connection(lambda: _Side(self._proxy, self), host, port)
        self.upstream = side
        if self.closed and side.transport is not None:
            reset_transport(side.transport)

    async def _pump(self, src: _Side, dst: _Side) -> None:
        """Forward chunks from `src` to `dst` when due; an EOF ends this direction."""
        while True:
            chunk = await src.next_chunk()
            await until(chunk.due)
            if self._proxy.blackhole or self.forgotten:
                self.corrupted = True
                continue
            if not self._write(dst, chunk.data):
                return
            await dst.writable.wait()

    def _write(self, dst: _Side, data: bytes | None) -> bool:
        """Write `data` (None: EOF) to `dst`; False once this direction is finished."""
        transport = dst.transport
        if transport is None or transport.is_closing():
            if data is not None:
                self.abort()  # the reader went away with bytes still owed to it
            return False
        if data is None:
            if transport.can_write_eof():
                try:
                    transport.write_eof()
                except OSError:  # the other end is already gone: nothing to finish
                    self.abort()
            return False
        transport.write(data)
        return True

    def close(self) -> None:
        """Both directions ended: close both sides gracefully (FIN)."""
        self._finish(reset=False)

    def abort(self) -> None:
        """Reset both sides (RST) and cancel the pumping task. No-op once closed."""
        if self.closed:
            return
        self._finish(reset=True)
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    def _finish(self, *, reset: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self._proxy._pairs.discard(self)
        for side in (self.client, self.upstream):
            if side is not None and side.transport is not None:
                if reset:
                    reset_transport(side.transport)
                else:
                    side.transport.close()


class FaultProxy:
    """An asyncio TCP proxy on 127.0.0.1 that injects network faults on demand.

    Faults apply at once, to open connections as well as new ones, and can be combined:

    - `delay`: seconds added in each direction (a round trip gains ``2 * delay``, at
      least: on uvloop, whose timers count whole milliseconds, a millisecond or so more).
    - `blackhole`: connections are accepted but nothing is forwarded either way, as in
      a network partition. Bytes that arrive meanwhile are dropped; when the blackhole
      is lifted, every connection that lost bytes is reset (its stream cannot resume
      consistently), while connections that stayed idle carry on.
    - `refuse`: new connections are reset right after accept (open ones are untouched).
    - `reset_connections()`: every open connection is reset (RST) on both ends.
    - `forget_connections()`: every open connection is cut silently (nothing forwarded
      any more, neither end told), as by a NAT or load balancer past its idle timeout.

    When the target itself resets a connection, the proxy resets the client's side too;
    when it closes gracefully, the close is forwarded after any delayed bytes.

    With ``ssl_context`` the proxy is a TLS front for a server without TLS: clients
    connect with TLS (``rediss://``), the proxy completes the handshake with that
    context's certificate and forwards the decrypted bytes. A connection counts as
    accepted (and the faults apply to it) once its handshake has completed; one still
    in it 5 s after it was opened is dropped, by `aclose()` or not.

    Args:
        target_host: Host of the server to forward to.
        target_port: Port of the server to forward to.
        listen_host: Address to listen on.
        listen_port: Port to listen on; 0 picks a free one.
        ssl_context: A server-side context (``ssl.Purpose.CLIENT_AUTH``, with a
            certificate chain loaded) to terminate TLS with; None: plain TCP.

    Raises:
        TypeError: A host is not a str, a port not an int (nor a bool), or
            ``ssl_context`` not an `ssl.SSLContext`.
        ValueError: A port is out of range.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        check_str("target_host", target_host)
        check_port("target_port", target_port)
        check_str("listen_host", listen_host)
        check_port("listen_port", listen_port)
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise TypeError(f"ssl_context must be an ssl.SSLContext, not {ssl_context!r}")
        self._ssl = ssl_context
        self._handshakes = 0
        self._target = (target_host, target_port)
        self._listen = (listen_host, listen_port)
        self._port = 0
        self._server: asyncio.Server | None = None
        self._closing = False
        self._pairs: set[_Pair] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._passable = asyncio.Event()  # set while no blackhole is on
        self._passable.set()
        self._delay = 0.0
        self._blackhole = False
        self._refuse = False

    def __repr__(self) -> str:
        return f"<FaultProxy {self.url} -> {self._target[0]}:{self._target[1]}>"

    @property
    def host(self) -> str:
        """The address the proxy listens on."""
        return self._listen[0]

    @property
    def port(self) -> int:
        """The port the proxy listens on (known once started, 0 before)."""
        return self._port

    @property
    def url(self) -> str:
        """``redis://HOST:PORT`` of the proxy (``rediss://`` for a TLS front), to give to
        a client instead of the server's."""
        return f"{'rediss' if self._ssl else 'redis'}://{self.host}:{self._port}"

    @property
    def target(self) -> tuple[str, int]:
        """The ``(host, port)`` the proxy forwards to."""
        return self._target

    @property
    def connections(self) -> int:
        """Open proxied connections (not ended on both sides): one its client closes in a
        blackhole counts until the lift, as the close is dropped and the server keeps it."""
        return len(self._pairs)

    @property
    def handshakes(self) -> int:
        """TLS handshakes completed so far (always 0 without ``ssl_context``)."""
        return self._handshakes

    # -- faults --

    @property
    def delay(self) -> float:
        """Seconds each chunk is held in each direction; applies to bytes read afterwards.

        Raises:
            TypeError: On assignment of what is not an int or float (a bool too).
            ValueError: On assignment of a negative, NaN or infinite value, or of
                one over ``MAX_SECONDS`` (about 31 years).
        """
        return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        self._delay = check_seconds("delay", seconds, allow_zero=True)

    @property
    def blackhole(self) -> bool:
        """Whether nothing is forwarded. Lifting it resets connections that lost bytes.

        Raises:
            TypeError: On assignment of what is not a bool.
        """
        return self._blackhole

    @blackhole.setter
    def blackhole(self, on: bool) -> None:
        self._blackhole = check_switch("blackhole", on)
        if on:
            self._passable.clear()
            return
        for pair in list(self._pairs):
            if pair.corrupted or pair.forgotten:
                pair.abort()
        self._passable.set()

    @property
    def refuse(self) -> bool:
        """Whether new connections are reset right after being accepted.

        Raises:
            TypeError: On assignment of what is not a bool.
        """
        return self._refuse

    @refuse.setter
    def refuse(self, on: bool) -> None:
        self._refuse = check_switch("refuse", on)

    def reset_connections(self) -> None:
        """Reset (RST) every open connection, on the client and the server side."""
        for pair in list(self._pairs):
            pair.abort()

    def forget_connections(self) -> int:
        """Forward nothing more on the open connections, telling neither end (new
        connections are not affected; `heal()` resets these). How many were cut."""
        cut = [pair for pair in self._pairs if not pair.forgotten]
        for pair in cut:
            pair.forgotten = True
        return len(cut)

    def heal(self) -> None:
        """Clear every fault: no delay, no blackhole, no refusal."""
        self.delay = 0.0
        self.refuse = False
        self.blackhole = False

    async def start(self) -> None:
        """Start listening; cancelled, it leaves nothing listening.

        Raises:
            RuntimeError: The proxy was already started or closed.
            OSError: The listening socket could not be bound.
        """
        if self._server is not None or self._closing:
            raise RuntimeError(f"{self!r} was already started or closed")
        loop = asyncio.get_running_loop()
        timeout = 5.0 if self._ssl else None  # the loop's, out of aclose()'s reach: 60 s
        self._server = server = await loop.create_server(
            lambda: _Side(self),
            *self._listen,
            ssl=self._ssl,
            ssl_handshake_timeout=timeout,
            start_serving=False,  # asyncio yields once serving: held before, aclose() has it
        )
        self._port = server.sockets[0].getsockname()[1]
        try:
            await server.start_serving()
        except BaseException:  # cancelled there: stop listening (no aclose() may follow)
            server.close()
            raise

    async def aclose(self) -> None:
        """Stop listening, reset every connection, wait for the proxy's tasks (idempotent)."""
        self._closing = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.reset_connections()
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- internals --

    def _accepted(self, client: _Side) -> None:
        """A new client connection: refuse it, or make it a pair with its own task."""
        if client.transport is None:  # pragma: no cover - set by connection_made
            return
        if self._ssl is not None:  # with TLS, connection_made follows the handshake
            self._handshakes += 1
        if self._refuse or self._closing:
            reset_transport(client.transport)
            return
        pair = _Pair(self, client)
        client.pair = pair
        self._pairs.add(pair)
        name = f"FaultProxy :{self._port} -> {self._target[0]}:{self._target[1]}"
        pair.task = asyncio.get_running_loop().create_task(pair.run(), name=name)
        self._tasks.add(pair.task)
        pair.task.add_done_callback(self._tasks.discard)
