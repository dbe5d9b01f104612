"""A master that refuses a connection with an error (at ``maxclients``, or in protected
mode: ``-DENIED``) accepts it, writes that error with nothing asked, and closes it: the
error is the reason given, on either loop (asyncio reads it as the reply to the first
preloaded ``SCRIPT LOAD``; uvloop finds it in redis-py's buffer when the socket is taken
over). An error a preload got that later replies came after is no connection's last word."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock import AsyncRedlock, QuorumUnavailableError
from asyncredlock._config import DEFAULTS
from asyncredlock._connect import make_node
from asyncredlock._transport import Link
from asyncredlock.testing.pytest_plugin import MakeServers

from .. import loops

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome


@pytest.fixture(params=sorted(loops.BACKENDS))
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both loops, asyncio and uvloop, whatever ``ASYNCREDLOCK_TEST_LOOP`` says."""
    return loops.BACKENDS[request.param]


async def test_a_master_refusing_a_connection_with_an_error_says_why(
    make_servers: MakeServers,
) -> None:
    group = make_servers(1)
    async with Redis.from_url(group.urls[0]) as admin:
        await admin.config_set("maxclients", 1)  # admin is the one client it takes
        try:
            with anyio.fail_after(HANG_GUARD):
                async with AsyncRedlock(group.urls, node_timeout=0.5, timeout=0) as redlock:
                    with pytest.raises(QuorumUnavailableError) as failed:
                        await redlock.lock("maxclients").acquire()
        finally:
            await admin.config_set("maxclients", 10000)
    assert "max number of clients reached" in str(failed.value), str(failed.value)


async def test_a_preloads_error_answered_past_is_not_a_later_loss_reason(
    make_servers: MakeServers,
) -> None:
    group = make_servers(1)
    node, _ = make_node(group.urls[0], DEFAULTS)
    assert node.opener is not None
    link = Link("m", node.opener, node_timeout=1.0, socket_timeout=5.0, preload=[("NOSUCH",)])
    try:
        with anyio.fail_after(HANG_GUARD):
            assert (await link.call(("PING",))).value == b"PONG"  # after the preload's error
            blocked = link.call(("BLPOP", "refused:nothing", 0))
            async with Redis.from_url(group.urls[0]) as admin:
                for _ in range(2000):  # the master's state, polled: no event tells it
                    if (await admin.info("clients"))["blocked_clients"]:
                        break
                    await asyncio.sleep(0.01)
                await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            reply = await blocked
        assert isinstance(reply.error, RedisConnectionError), reply.error
        assert "lost" in str(reply.error)
        assert "the master said" not in str(reply.error), str(reply.error)
    finally:
        await link.aclose()
