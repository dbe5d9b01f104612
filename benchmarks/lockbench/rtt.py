"""Round trips with no lock in them: what the proxies add, and the floor of a quorum
round. The fan-out and peers benchmarks measure both once per RTT they run at."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import NotRequired, cast
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .harness import ProxyHost, Summary, summarize

__all__ = ["MeasuredRtt", "make_client", "measure_quorum_round", "measure_rtt"]


class MeasuredRtt(Summary):
    """`measure_rtt()`'s PING summary through one proxy, with the quorum round
    (`measure_quorum_round()`) where the script measured it too."""

    quorum_round: NotRequired[Summary]


def make_client(url: str) -> Redis:
    """A ``redis.asyncio`` client with retries off and socket timeouts set."""
    parts = urlsplit(url)
    return Redis(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 6379,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
    )


async def measure_rtt(proxies: ProxyHost, pings: int) -> Summary:
    """PING through the first proxy: the round trip it really adds, in ms."""
    client = make_client(proxies.urls(1)[0])
    try:
        for _ in range(3):
            await client.ping()
        times = []
        for _ in range(pings):
            t0 = time.perf_counter()
            await client.ping()
            times.append(time.perf_counter() - t0)
    finally:
        await client.aclose()
    return summarize(times)


class _Pinger(asyncio.Protocol):
    """A bare connection that counts ``+PONG`` replies: the least a client can do."""

    def __init__(self, on_reply: Callable[[], None]) -> None:
        self.on_reply = on_reply
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's: no isinstance check
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        for _ in range(data.count(b"\r\n")):
            self.on_reply()


class _QuorumPing:
    """One round: resolves ``quorum_in`` at the ``quorum``-th reply, ``all_in`` at
    the last."""

    def __init__(self, loop: asyncio.AbstractEventLoop, quorum: int, n: int) -> None:
        self.quorum, self.n, self.count = quorum, n, 0
        self.quorum_in: asyncio.Future[None] = loop.create_future()
        self.all_in: asyncio.Future[None] = loop.create_future()

    def reply(self) -> None:
        self.count += 1
        if self.count == self.quorum:
            self.quorum_in.set_result(None)
        if self.count == self.n:
            self.all_in.set_result(None)


async def measure_quorum_round(urls: Sequence[str], quorum: int, pings: int) -> Summary:
    """One PING to each of ``urls`` at once, timed until ``quorum`` replies are in:
    a quorum round trip with no client work in it, the floor of one Redlock round on
    this machine (the proxy process forwards the N requests one after another).
    Each round waits for every reply before the next starts."""
    loop = asyncio.get_running_loop()
    rounds: list[_QuorumPing] = []

    def on_reply() -> None:
        rounds[-1].reply()

    conns = []
    try:
        for url in urls:
            parts = urlsplit(url)
            _, protocol = await loop.create_connection(
                lambda: _Pinger(on_reply), parts.hostname or "127.0.0.1", parts.port or 6379
            )
            conns.append(protocol)
        times = []
        for i in range(pings + 3):  # the first 3 warm up
            rounds[:] = [_QuorumPing(loop, quorum, len(conns))]
            t0 = time.perf_counter()
            for conn in conns:
                assert conn.transport is not None
                conn.transport.write(b"PING\r\n")
            await rounds[0].quorum_in
            if i >= 3:
                times.append(time.perf_counter() - t0)
            await rounds[0].all_in
    finally:
        for conn in conns:
            if conn.transport is not None:
                conn.transport.close()
    return summarize(times)
