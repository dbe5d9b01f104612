"""Tests of asyncredlock.testing.FaultProxy in front of a real server, on asyncio and uvloop.

No timing thresholds: a delay is checked by showing that the reply has *not* arrived
before the delay elapsed, then that it does arrive.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock.testing import FaultProxy, ServerGroup, ServerProcess
from asyncredlock.testing.pytest_plugin import MakeServers

pytestmark = pytest.mark.anyio

PING = b"*1\r\n$4\r\nPING\r\n"
DELAY = 0.1  # long enough that a loaded machine still answers a direct PING sooner


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {}), id="asyncio"),
        pytest.param(
            ("asyncio", {"use_uvloop": True}),
            id="uvloop",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed"
            ),
        ),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    backend: tuple[str, dict[str, object]] = request.param
    return backend


@pytest.fixture
def server(servers: ServerGroup) -> ServerProcess:
    return servers[0]


@pytest.fixture
async def proxy(server: ServerProcess) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(server.host, server.port) as proxy:
        yield proxy


def client(url: str) -> aioredis.Redis:
    """One connection, no retries: a reset must surface, not be papered over.

    Used with `aclosing` rather than ``async with``, whose entry already connects.
    """
    return aioredis.Redis.from_url(
        url,
        single_connection_client=True,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=10,
        socket_connect_timeout=10,
    )


async def raw_connection(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(proxy.host, proxy.port)


async def raw_ping(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(PING)
    await writer.drain()
    return await reader.readline()


async def test_forwards_commands(proxy: FaultProxy) -> None:
    async with aclosing(client(proxy.url)) as redis:
        assert await redis.set("k", "v")
        assert await redis.get("k") == b"v"
        assert proxy.connections == 1


async def test_delay_holds_each_direction(proxy: FaultProxy) -> None:
    async with aclosing(client(proxy.url)) as redis:
        await redis.set("k", "v")  # connected and warm: only the delay is measured
        proxy.delay = DELAY
        replies: list[bytes | None] = []
        arrived = anyio.Event()

        async def get() -> None:
            replies.append(await redis.get("k"))
            arrived.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(get)
            # One-way delay would answer after DELAY; both ways take 2 * DELAY.
            with anyio.move_on_after(1.5 * DELAY):
                await arrived.wait()
            assert replies == []
        assert replies == [b"v"]


async def test_delay_keeps_byte_order_when_lowered(proxy: FaultProxy) -> None:
    reader, writer = await raw_connection(proxy)
    proxy.delay = DELAY
    writer.write(PING)
    await writer.drain()
    proxy.delay = 0.0  # the later, undelayed bytes must not overtake the PING
    writer.write(b"*2\r\n$4\r\nECHO\r\n$5\r\nafter\r\n")
    await writer.drain()
    assert await reader.readline() == b"+PONG\r\n"
    assert await reader.readline() == b"$5\r\n"
    assert await reader.readline() == b"after\r\n"
    writer.close()


async def test_client_half_close_still_gets_the_reply(proxy: FaultProxy) -> None:
    reader, writer = await raw_connection(proxy)
    proxy.delay = DELAY / 10
    writer.write(PING)
    writer.write_eof()
    assert await reader.read() == b"+PONG\r\n"  # the reply, then the server's close
    writer.close()


async def test_blackhole_answers_nothing_and_heal_restores(proxy: FaultProxy) -> None:
    async with aclosing(client(proxy.url)) as redis:
        assert await redis.ping()
        proxy.blackhole = True
        with anyio.move_on_after(DELAY) as scope:
            await redis.ping()
        assert scope.cancelled_caught
    proxy.heal()
    async with aclosing(client(proxy.url)) as redis:
        assert await redis.ping()


async def test_blackhole_accepts_but_resets_on_heal(proxy: FaultProxy) -> None:
    proxy.blackhole = True
    reader, writer = await raw_connection(proxy)  # accepted
    writer.write(PING)
    await writer.drain()
    with anyio.move_on_after(DELAY) as scope:
        await reader.read(1)
    assert scope.cancelled_caught
    proxy.blackhole = False  # the PING was dropped: this stream cannot resume
    with pytest.raises(ConnectionResetError):
        await reader.read(1)
    writer.close()


async def test_idle_connection_survives_blackhole(proxy: FaultProxy) -> None:
    reader, writer = await raw_connection(proxy)
    assert await raw_ping(reader, writer) == b"+PONG\r\n"
    proxy.blackhole = True
    proxy.blackhole = False
    assert await raw_ping(reader, writer) == b"+PONG\r\n"
    writer.close()


async def test_forget_connections_cuts_open_ones_silently(proxy: FaultProxy) -> None:
    """Open connections go dead telling neither end (as a NAT that forgot them): no
    reply and no reset; new connections are served; heal() resets the forgotten."""
    reader, writer = await raw_connection(proxy)
    assert await raw_ping(reader, writer) == b"+PONG\r\n"
    assert proxy.forget_connections() == 1
    assert proxy.forget_connections() == 0  # forgotten already
    writer.write(PING)
    await writer.drain()
    with anyio.move_on_after(DELAY) as scope:
        await reader.read(1)
    assert scope.cancelled_caught
    other_reader, other_writer = await raw_connection(proxy)
    assert await raw_ping(other_reader, other_writer) == b"+PONG\r\n"
    proxy.heal()
    with pytest.raises(ConnectionResetError):
        await reader.read(1)
    assert await raw_ping(other_reader, other_writer) == b"+PONG\r\n"  # never forgotten
    writer.close()
    other_writer.close()


async def test_reset_connections_fails_open_client(proxy: FaultProxy) -> None:
    async with aclosing(client(proxy.url)) as redis:
        assert await redis.ping()
        proxy.reset_connections()
        assert proxy.connections == 0
        with pytest.raises(RedisConnectionError):
            await redis.ping()


async def test_reset_connections_sends_rst_to_in_flight_request(proxy: FaultProxy) -> None:
    reader, writer = await raw_connection(proxy)
    proxy.delay = 60.0
    writer.write(PING)
    await writer.drain()
    proxy.reset_connections()
    with pytest.raises(ConnectionResetError):
        await reader.read(1)
    writer.close()


async def test_refuse_resets_new_connections_only(proxy: FaultProxy) -> None:
    async with aclosing(client(proxy.url)) as before:
        assert await before.ping()
        proxy.refuse = True
        async with aclosing(client(proxy.url)) as refused:
            with pytest.raises(RedisConnectionError):
                await refused.ping()
        assert await before.ping()
    proxy.heal()
    async with aclosing(client(proxy.url)) as after:
        assert await after.ping()


async def test_target_down_resets_client(make_servers: MakeServers) -> None:
    server = make_servers(1)[0]
    async with FaultProxy(server.host, server.port) as proxy:
        server.stop()
        async with aclosing(client(proxy.url)) as redis:
            with pytest.raises(RedisConnectionError):
                await redis.ping()
        assert proxy.connections == 0


async def test_heal_clears_every_fault(proxy: FaultProxy) -> None:
    proxy.delay, proxy.blackhole, proxy.refuse = 1.0, True, True
    proxy.heal()
    assert (proxy.delay, proxy.blackhole, proxy.refuse) == (0.0, False, False)


@pytest.mark.parametrize("bad", [-0.001, float("nan"), float("inf")])
async def test_delay_rejects_bad_values(proxy: FaultProxy, bad: float) -> None:
    with pytest.raises(ValueError, match="delay"):
        proxy.delay = bad
    assert proxy.delay == 0.0


async def test_aclose_cancels_everything(server: ServerProcess) -> None:
    before = asyncio.all_tasks()
    proxy = FaultProxy(server.host, server.port)
    await proxy.start()
    idle = await raw_connection(proxy)
    assert await raw_ping(*idle) == b"+PONG\r\n"
    proxy.delay = 60.0
    in_flight = await raw_connection(proxy)
    in_flight[1].write(PING)
    await in_flight[1].drain()
    await proxy.aclose()
    await proxy.aclose()  # idempotent
    assert asyncio.all_tasks() - before == set()
    assert proxy.connections == 0
    for reader, writer in (idle, in_flight):
        with pytest.raises(ConnectionResetError):
            await reader.read(1)
        writer.close()
    with pytest.raises(ConnectionRefusedError):
        await raw_connection(proxy)
