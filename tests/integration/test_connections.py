"""The connections asyncredlock opens: every form a user gives keeps working, and a
master that went silent is readmitted once it answers again."""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import NamedTuple

import anyio
import pytest
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import Connection as RedisConnection

from asyncredlock import AsyncRedlock, QuorumUnavailableError
from asyncredlock._transport import Link
from asyncredlock.testing import FaultProxy, ServerGroup, ServerProcess, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import polled

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
PASSWORD = "s3cret-pw"


class Guarded(NamedTuple):
    server: ServerProcess
    socket: str


@pytest.fixture
def guarded() -> Iterator[Guarded]:
    """A server listening on a unix socket too (in a short directory: socket paths are
    limited to about 100 bytes). Its password and ACL user are set after start, since
    the readiness check sends no AUTH."""
    directory = tempfile.mkdtemp(prefix="arl-")
    socket = f"{directory}/s.sock"
    try:
        with ServerProcess(
            extra_args=("--unixsocket", socket, "--unixsocketperm", "700")
        ) as server:
            yield Guarded(server, socket)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _protect(server: ServerProcess) -> None:
    async with Redis(host=server.host, port=server.port) as direct:
        await direct.execute_command(
            "ACL", "SETUSER", "locker", "on", f">{PASSWORD}", "~*", "&*", "+@all"
        )
        await direct.config_set("requirepass", PASSWORD)


async def _cycle(redlock: AsyncRedlock, name: str) -> None:
    lease = await redlock.lock(name, timeout=0).acquire()
    await lease.release()


class TestConnectionForms:
    async def test_password_acl_user_database_and_unix_socket(self, guarded: Guarded) -> None:
        await _protect(guarded.server)
        server = guarded.server
        forms = {
            "password": f"redis://:{PASSWORD}@{server.host}:{server.port}",
            "acl user, db 2": f"redis://locker:{PASSWORD}@{server.host}:{server.port}/2",
            "unix socket": f"unix://{guarded.socket}?password={PASSWORD}",
        }
        with anyio.fail_after(HANG_GUARD):
            for form, url in forms.items():
                async with AsyncRedlock([url]) as redlock:
                    lease = await redlock.lock(f"form:{form}", timeout=0).acquire()
                    if form == "acl user, db 2":
                        async with Redis(
                            host=server.host, port=server.port, password=PASSWORD, db=2
                        ) as db2:
                            assert await db2.get(f"form:{form}") == lease.value.encode()
                    await lease.release()
                    assert redlock.statistics().acquisitions == 1, form

    async def test_the_url_parameters_taken_reach_the_connection(
        self, servers: ServerGroup
    ) -> None:
        query = "db=3&client_name=locker&socket_timeout=2&socket_connect_timeout=2"
        url = f"{servers[0].url}?{query}&socket_keepalive=false"
        db3 = f"{servers[0].url}/3"
        with anyio.fail_after(HANG_GUARD):
            async with AsyncRedlock([url]) as redlock, Redis.from_url(db3) as direct:
                lease = await redlock.lock("form:query", timeout=0).acquire()
                assert "locker" in [client["name"] for client in await direct.client_list()]
                assert await direct.get("form:query") == lease.value.encode()
                await lease.release()

    async def test_a_url_shared_with_redis_py_clients_works_as_it_is(
        self, servers: ServerGroup
    ) -> None:
        """Parameters redis-py takes that change nothing in asyncredlock's connections
        (it sets RESP2, no retries, no health checks, and keeps no pool) are taken:
        refused at construction before, though such URLs worked."""
        query = (
            "protocol=3&health_check_interval=30&retry_on_timeout=true&max_connections=50"
            "&decode_responses=true&encoding=utf-8&encoding_errors=strict&socket_read_size=4096"
        )
        with anyio.fail_after(HANG_GUARD):
            async with AsyncRedlock([f"{servers[0].url}/0?{query}"]) as redlock:
                await _cycle(redlock, "form:shared-url")
                assert redlock.statistics().acquisitions == 1

    async def test_a_ready_client_lends_its_settings_not_its_pool(self, guarded: Guarded) -> None:
        await _protect(guarded.server)
        server = guarded.server
        client = Redis(host=server.host, port=server.port, password=PASSWORD)
        pool = client.connection_pool
        with anyio.fail_after(HANG_GUARD):
            async with AsyncRedlock([client]) as redlock:
                await _cycle(redlock, "ready-client")
            # asyncredlock opened its own connection with the client's settings; the
            # client's pool made none, and is still usable after aclose()
            assert len(pool._available_connections) + len(pool._in_use_connections) == 0
            assert await client.ping() is True
        await client.aclose()

    async def test_a_ready_clients_hung_handshake_is_given_up(self, guarded: Guarded) -> None:
        """A client made with ``socket_timeout=None`` (redis-py's "wait forever"), its
        master accepting connections but never answering AUTH: the connection's
        handshake is given up after the AsyncRedlock's socket_timeout. Before, the
        link stayed connecting for good, every later call queued behind it, and
        settle() never returned."""
        await _protect(guarded.server)
        server = guarded.server
        async with FaultProxy(server.host, server.port) as proxy:
            proxy.blackhole = True  # TCP accepted, nothing answered
            client = Redis(host=proxy.host, port=proxy.port, password=PASSWORD, socket_timeout=None)
            try:
                async with AsyncRedlock([client], socket_timeout=0.5) as redlock:
                    with pytest.raises(QuorumUnavailableError):
                        await redlock.lock("hung-auth", timeout=0).acquire()
                    with anyio.move_on_after(HANG_GUARD):
                        await redlock.settle()  # the connection attempt ended
                    link = redlock._core.nodes[0].link
                    assert link is not None
                    assert (link._connecting, link._queued) == (None, [])
            finally:
                await client.aclose()

    async def test_a_wrong_password_is_an_outage_with_the_reason(self, guarded: Guarded) -> None:
        await _protect(guarded.server)
        server = guarded.server
        url = f"redis://:wrong@{server.host}:{server.port}"
        with anyio.fail_after(HANG_GUARD):
            async with AsyncRedlock([url]) as redlock:
                with pytest.raises(QuorumUnavailableError) as caught:
                    await redlock.lock("wrong-password", timeout=0).acquire()
        (outcome,) = caught.value.outcomes
        assert "AuthenticationError" in outcome.detail or "WRONGPASS" in outcome.detail


class TestSilentMaster:
    async def test_a_silent_master_is_readmitted_once_it_answers(
        self, servers: ServerGroup
    ) -> None:
        async with FaultProxy("127.0.0.1", servers[4].port) as proxy:
            urls = [*servers.urls[:4], proxy.url]
            async with AsyncRedlock(urls, socket_timeout=0.5) as redlock:
                with anyio.fail_after(HANG_GUARD):
                    await _cycle(redlock, "silent:warm")
                    assert client_state(redlock).connections[4] == 1
                    proxy.blackhole = True
                    i = 0
                    while not client_state(redlock).silent[4]:  # each cycle is real work
                        await _cycle(redlock, f"silent:{i}")
                        i += 1
                    sent = client_state(redlock).in_flight[4]
                    await _cycle(redlock, "silent:skipped")
                    assert client_state(redlock).in_flight[4] <= sent  # skipped, not sent to
                    proxy.blackhole = False
                    # its calls fail at socket_timeout; the next acquisition reconnects
                    j = 0
                    while (back := client_state(redlock)).connections[4] < 2 or back.silent[4]:
                        await _cycle(redlock, f"silent:back:{j}")
                        j += 1
                    await _cycle(redlock, "silent:readmitted")
                    await redlock.settle()
                final = client_state(redlock)
                assert not final.silent[4]
                assert final.in_flight[4] == 0
                assert redlock.statistics().unavailable == 0

    async def test_masters_silent_past_socket_timeout_are_tried_again(
        self, make_servers: MakeServers, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Every master hangs past ``socket_timeout``: they turn silent, their calls
        fail and their connections are dropped, so no call is out any more. The next
        acquisitions send to them again (a new connection each), and once they answer
        the client locks again. Left silent, they would be skipped by every
        acquisition, never sent a call, never heard from: an outage for good. The log
        says each master turned silent, and that it answers again."""
        group = make_servers(3)
        caplog.set_level(logging.INFO, logger="asyncredlock")
        async with AsyncRedlock(group.urls, socket_timeout=0.5) as redlock:
            await _cycle(redlock, "hung:warm")
            for server in group:
                server.pause()
            try:
                with pytest.raises(QuorumUnavailableError):
                    await redlock.lock("hung", timeout=0).acquire()
                assert all(client_state(redlock).silent)
                assert await polled(lambda: client_state(redlock).in_flight == (0, 0, 0))
            finally:
                for server in group:
                    server.resume()
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("hung", timeout=HANG_GUARD).acquire()
                await lease.release()
            state = client_state(redlock)
            assert all(count >= 2 for count in state.connections)  # reopened
            assert state.silent == (False, False, False)
        messages = [record.getMessage() for record in caplog.records]
        for url in group.urls:
            assert any(m.startswith(f"master {url} silent") for m in messages)
            assert f"master {url} answers again" in messages

    async def test_an_idle_connection_pings_and_stays(self, servers: ServerGroup) -> None:
        """Idle for ``socket_timeout``, each connection PINGs its master; answered, it
        stays (the same connection PINGs again after another idle spell)."""
        async with AsyncRedlock(servers.urls[:3], socket_timeout=0.2) as redlock:
            await _cycle(redlock, "idle:ping")
            links = [node.link for node in redlock._core.nodes]
            assert await polled(lambda: all(link and link.pings >= 2 for link in links))
            state = client_state(redlock)
            assert (state.connections, state.silent) == ((1, 1, 1), (False, False, False))

    async def test_an_idle_connection_cut_silently_is_dropped_before_the_next_call(
        self, servers: ServerGroup
    ) -> None:
        """A NAT or load balancer forgets the idle connections, telling neither end:
        their PINGs go unanswered, so the connections are dropped while idle (the
        masters silent meanwhile), and the next acquisition opens new ones at once
        instead of finding every master silent."""
        async with contextlib.AsyncExitStack() as stack:
            proxies = [
                await stack.enter_async_context(FaultProxy("127.0.0.1", server.port))
                for server in list(servers)[:3]
            ]
            redlock = await stack.enter_async_context(
                AsyncRedlock([proxy.url for proxy in proxies], socket_timeout=0.2)
            )
            await _cycle(redlock, "idle:cut:warm")
            await redlock.settle()  # the release returned at a quorum: one call may be out
            assert [proxy.forget_connections() for proxy in proxies] == [1, 1, 1]
            links = [node.link for node in redlock._core.nodes]
            # unanswered, the PINGs got the connections dropped: no call of ours was out
            assert await polled(
                lambda: all(link and link.pings and not link.connected for link in links)
            )
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("idle:cut", timeout=HANG_GUARD).acquire()
                await lease.release()
            state = client_state(redlock)
            assert (state.connections, state.silent) == ((2, 2, 2), (False, False, False))

    async def test_an_idle_connections_ping_is_not_a_call_and_unanswered_lets_it_go(
        self, servers: ServerGroup
    ) -> None:
        """The PING of an idle connection is the library's own: `settle()` does not wait
        for it, nor does `in_flight` count it. Unanswered (the connection cut silently),
        the connection is let go at once: a call made then opens a new one instead of
        going to the dead one until its loss is reported."""
        async with contextlib.AsyncExitStack() as stack:
            proxies = [
                await stack.enter_async_context(FaultProxy("127.0.0.1", server.port))
                for server in list(servers)[:3]
            ]
            redlock = await stack.enter_async_context(
                # the PING's drop due long before its silence: the heartbeat drops it
                AsyncRedlock([proxy.url for proxy in proxies], socket_timeout=0.5, node_timeout=2)
            )
            await _cycle(redlock, "idle:ping:warm")
            await redlock.settle()
            links = [node.link for node in redlock._core.nodes]
            still_connected: list[bool] = []
            for link in links:
                assert link is not None
                assert link._conn is not None
                heartbeat = link._conn.heartbeat
                assert heartbeat is not None
                drop = heartbeat.dead

                def dropped(drop: Callable[[], None] = drop, link: Link = link) -> None:
                    drop()
                    still_connected.append(link.connected)

                heartbeat.dead = dropped
            assert [proxy.forget_connections() for proxy in proxies] == [1, 1, 1]
            assert await polled(lambda: all(link and link.outstanding == 1 for link in links))
            with anyio.fail_after(HANG_GUARD):
                await redlock.settle()
            assert client_state(redlock).in_flight == (0, 0, 0)
            assert all(link and link.outstanding == 1 for link in links)  # not waited for
            assert await polled(lambda: len(still_connected) == 3)
            assert still_connected == [False, False, False]


class EndedOnConnect(RedisConnection):
    """A redis-py connection closed as soon as redis-py has connected it: as if the
    master had ended it before asyncredlock took the socket over (or the loop was
    busy since the handshake, and redis-py's own reader heard the end)."""

    async def connect(self) -> None:
        await super().connect()
        assert self._writer is not None
        self._writer.transport.abort()
        await self._writer.wait_closed()  # redis-py's reader hears of it, not asyncredlock's


async def test_a_connection_ended_before_it_is_taken_over_fails_its_calls_at_once(
    servers: ServerGroup,
) -> None:
    """Its calls fail as on a lost connection, not after the silence of a master
    (``node_timeout``) as calls written to a socket that nobody reads would."""
    server = servers[0]
    pool = ConnectionPool(connection_class=EndedOnConnect, host=server.host, port=server.port)
    client = Redis(connection_pool=pool)
    try:
        with anyio.fail_after(HANG_GUARD):
            async with AsyncRedlock([client], timeout=0, node_timeout=2.0) as redlock:
                with pytest.raises(QuorumUnavailableError) as failed:
                    await redlock.lock("ended:on-connect").acquire()
    finally:
        await client.aclose()
    assert f"connection to {server.host}:{server.port} lost" in str(failed.value)
    assert "silent" not in str(failed.value)
    assert "ssl_certfile" not in str(failed.value)  # not TLS: no hint of certificates
