"""The I/O engine under connection faults, on both loops: a reset under pipelined calls,
replies split into one-byte segments or cut in the middle, a handshake never answered
(the other masters go on; aclose() is prompt and leaves no connection), a reset behind
a granted SET and its release, a restart under pipelined EVALSHA (each call answered or
failed, the scripts loaded again), and a release one master never answers."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock import AsyncRedlock, QuorumUnavailableError
from asyncredlock._config import DEFAULTS
from asyncredlock._connect import make_node
from asyncredlock._transport import Link
from asyncredlock.testing import FaultProxy, ServerGroup, Waits, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .. import loops
from .conftest import library_tasks, polled
from .test_link import _link

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome


@pytest.fixture(params=sorted(loops.BACKENDS))
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both loops, asyncio and uvloop, whatever ``ASYNCREDLOCK_TEST_LOOP`` says."""
    return loops.BACKENDS[request.param]


class Splitter:
    """A TCP forwarder to a real server that hands the server's bytes to the client
    one at a time (a reply split over many segments), and can cut the client's
    connection once ``cut_after`` bytes of replies were forwarded."""

    def __init__(self, port: int, cut_after: int | None = None) -> None:
        self.port = port
        self.cut_after = cut_after
        self.forwarded = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.cut = asyncio.Event()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> Splitter:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def up() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        async def down() -> None:
            while data := await up_reader.read(65536):
                for i in range(len(data)):
                    if self.cut_after is not None and self.forwarded >= self.cut_after:
                        writer.transport.abort()
                        self.cut.set()
                        return
                    writer.write(data[i : i + 1])
                    await writer.drain()
                    self.forwarded += 1
                    await asyncio.sleep(0)  # a segment of its own

        tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
        self.tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            writer.transport.abort()
            up_writer.transport.abort()
            self.tasks.difference_update(tasks)


class TestPipelinedFaults:
    async def test_a_reset_under_pipelined_calls_gives_each_its_own_reply_or_an_error(
        self, servers: ServerGroup
    ) -> None:
        async with (
            FaultProxy("127.0.0.1", servers[0].port) as proxy,
            _link(proxy.url) as link,
        ):
            with anyio.fail_after(HANG_GUARD):
                assert (await link.call(("PING",))).value == b"PONG"
                proxy.delay = 0.2
                calls = [link.call(("ECHO", f"v{i}")) for i in range(300)]
                await asyncio.sleep(0)  # written
                proxy.reset_connections()
                replies = [await call for call in calls]
            for i, reply in enumerate(replies):
                if reply.error is None:
                    assert reply.value == f"v{i}".encode()
                else:
                    assert isinstance(reply.error, RedisConnectionError), reply.error
            assert any(reply.error is not None for reply in replies)
            assert link.outstanding == 0
            proxy.heal()
            with anyio.fail_after(HANG_GUARD):
                assert (await link.call(("ECHO", "after"))).value == b"after"

    async def test_replies_split_into_one_byte_segments_reach_their_callers(
        self, servers: ServerGroup
    ) -> None:
        async with Splitter(servers[0].port) as splitter, _link(splitter.url) as link:
            with anyio.fail_after(HANG_GUARD):
                calls = [link.call(("ECHO", f"value-{i}" * 3)) for i in range(40)]
                replies = [await call for call in calls]
            assert [reply.value for reply in replies] == [
                (f"value-{i}" * 3).encode() for i in range(40)
            ]
            assert link.outstanding == 0

    async def test_a_reply_cut_in_the_middle_fails_the_rest_and_the_next_call_reconnects(
        self, servers: ServerGroup
    ) -> None:
        # preload: SCRIPT LOAD replies (40-byte SHA1 bulk strings) come first
        async with _link(servers[0].url) as probe:
            await probe.call(("PING",))
            preload = len(probe.preload)
        cut_after = preload * 47 + 2 * 13 + 5  # mid third ECHO reply ($8\r\nabcdefgh\r\n)
        async with (
            Splitter(servers[0].port, cut_after=cut_after) as splitter,
            _link(splitter.url) as link,
        ):
            with anyio.fail_after(HANG_GUARD):
                calls = [link.call(("ECHO", "abcdefgh")) for _ in range(6)]
                replies = [await call for call in calls]
            assert splitter.cut.is_set()
            assert [r.value for r in replies[:2]] == [b"abcdefgh"] * 2
            assert all(isinstance(r.error, RedisConnectionError) for r in replies[2:])
            assert link.outstanding == 0
            splitter.cut_after = None
            with anyio.fail_after(HANG_GUARD):
                assert (await link.call(("ECHO", "again"))).value == b"again"
            assert link.connections == 2


class TestHungHandshake:
    async def test_acquisitions_go_on_while_a_master_never_answers_its_handshake(
        self, servers: ServerGroup
    ) -> None:
        async with FaultProxy("127.0.0.1", servers[2].port) as proxy:
            proxy.blackhole = True
            urls = [*servers.urls[:2], f"{proxy.url}/1"]  # SELECT 1: a handshake
            with anyio.fail_after(HANG_GUARD):
                async with AsyncRedlock(
                    urls, node_timeout=0.1, socket_timeout=10.0, timeout=0
                ) as redlock:
                    for i in range(5):
                        lease = await redlock.lock(f"hung:{i}").acquire()
                        await lease.release()
                    state = client_state(redlock)
                    assert state.connections[:2] == (1, 1)
                    assert state.connections[2] == 0

    async def test_aclose_while_every_connection_is_being_opened_is_prompt(
        self, servers: ServerGroup
    ) -> None:
        async with contextlib.AsyncExitStack() as stack:
            proxies = [
                await stack.enter_async_context(FaultProxy("127.0.0.1", server.port))
                for server in list(servers)[:3]
            ]
            for proxy in proxies:
                proxy.blackhole = True
            redlock = AsyncRedlock(
                [f"{proxy.url}/1" for proxy in proxies], node_timeout=0.1, socket_timeout=15.0
            )
            attempt = asyncio.create_task(redlock.lock("hung:close", timeout=10).acquire())
            # every connection attempt under way (accepted, then nothing answers)
            assert await polled(lambda: all(proxy.connections for proxy in proxies))
            assert not attempt.done()
            with anyio.fail_after(5):  # well short of socket_timeout
                await redlock.aclose()
                with pytest.raises((RuntimeError, QuorumUnavailableError)):
                    await attempt
            assert [
                t for t in library_tasks() if "/testing/" not in t.get_coro().cr_code.co_filename
            ] == []
            for proxy in proxies:
                proxy.blackhole = False


class TestCutUnderALease:
    async def test_a_reset_behind_a_granted_set_and_its_release_leaves_no_lock_key(
        self, servers: ServerGroup
    ) -> None:
        async with FaultProxy("127.0.0.1", servers[2].port) as proxy:
            urls = [*servers.urls[:2], proxy.url]
            async with Redis.from_url(servers.urls[2]) as third:
                with anyio.fail_after(HANG_GUARD):
                    async with AsyncRedlock(urls, node_timeout=1.0, timeout=0) as redlock:
                        await redlock.inspect("warm")  # every connection open
                        proxy.delay = 0.3
                        lease = await redlock.lock("cut:lease", ttl=30).acquire()
                        for _ in range(2000):  # the SET ran there (polled: no event tells)
                            if await third.exists("cut:lease"):
                                break
                            await asyncio.sleep(0.01)
                        await lease.release()
                        proxy.reset_connections()
                        proxy.heal()
                        await redlock.settle()
                        assert client_state(redlock).in_flight == (0, 0, 0)
                    assert await third.exists("cut:lease") == 0
                    for url in servers.urls[:2]:
                        async with Redis.from_url(url) as direct:
                            assert await direct.exists("cut:lease") == 0


async def _our_clients(url: str) -> list[str]:
    """The other clients of a server (CLIENT LIST), but the one asking."""
    async with Redis.from_url(url) as direct:
        me = await direct.client_id()
        return [
            line
            for line in (await direct.execute_command("CLIENT", "LIST")).decode().splitlines()
            if f"id={me} " not in line and "flags=S" not in line
        ]


class TestFrozenHandshake:
    async def test_a_frozen_masters_handshake_then_aclose_leaves_no_connection(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(3)
        urls = [f"{url}/1" for url in group.urls]  # SELECT 1: a round trip to connect
        group[2].pause()
        try:
            with anyio.fail_after(HANG_GUARD):
                redlock = AsyncRedlock(urls, node_timeout=0.1, socket_timeout=10.0, timeout=0)
                lease = await redlock.lock("frozen:handshake").acquire()
                await lease.release()
                await redlock.aclose()
        finally:
            group[2].resume()
        assert [
            t for t in library_tasks() if "/testing/" not in t.get_coro().cr_code.co_filename
        ] == []
        for url in group.urls:
            for _ in range(200):
                if not await _our_clients(url):
                    break
                await asyncio.sleep(0.01)
            assert await _our_clients(url) == []


class TestReleaseNeverBack:
    @pytest.mark.parametrize("fault", ["blackhole", "reset"])
    async def test_a_waiter_is_woken_when_one_masters_release_never_comes_back(
        self, servers: ServerGroup, fault: str
    ) -> None:
        async with FaultProxy("127.0.0.1", servers[2].port) as proxy:
            holder_urls = [*servers.urls[:2], proxy.url]
            async with (
                AsyncRedlock(holder_urls, node_timeout=0.2, socket_timeout=5.0) as holder,
                AsyncRedlock(servers.urls[:3], retry_delay=3600.0) as waiter,
            ):
                lease = await holder.lock("never:back", ttl=60.0).acquire()
                probe = Waits(waiter)
                got: list[bool] = []

                async def wait_for_it() -> None:
                    taken = await waiter.lock("never:back", timeout=HANG_GUARD).acquire()
                    got.append(taken.held)
                    await taken.release()

                with anyio.fail_after(HANG_GUARD / 2):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(wait_for_it)
                        await probe.reach(1)
                        if fault == "blackhole":
                            proxy.blackhole = True
                        else:
                            proxy.delay = 0.5
                        release = asyncio.create_task(lease.release())
                        if fault == "reset":
                            for _ in range(3):  # the release task runs and writes
                                await asyncio.sleep(0)
                            proxy.reset_connections()
                        with contextlib.suppress(Exception):
                            await release
                assert got == [True]
                proxy.heal()


class TestRestartUnderPipeline:
    async def test_a_restart_under_pipelined_evalsha_answers_or_fails_each_and_reloads(
        self, make_servers: MakeServers
    ) -> None:
        group = make_servers(1)
        node, _ = make_node(group.urls[0], DEFAULTS)
        assert node.opener is not None
        source = "return ARGV[1]"
        sha = hashlib.sha1(source.encode()).hexdigest()
        link = Link(
            "m",
            node.opener,
            node_timeout=1.0,
            socket_timeout=5.0,
            preload=[("SCRIPT", "LOAD", source)],
        )
        try:
            with anyio.fail_after(HANG_GUARD):
                assert (await link.call(("EVALSHA", sha, 0, "warm"), source)).value == b"warm"
                calls = [link.call(("EVALSHA", sha, 0, f"a{i}"), source) for i in range(50)]
                group[0].restart()
                replies = [await call for call in calls]
                for i, reply in enumerate(replies):
                    if reply.error is None:
                        assert reply.value == f"a{i}".encode()
                    else:
                        assert isinstance(reply.error, RedisConnectionError), reply.error
                assert link.outstanding == 0
                again = [link.call(("EVALSHA", sha, 0, f"b{i}"), source) for i in range(5)]
                assert [(await call).value for call in again] == [
                    f"b{i}".encode() for i in range(5)
                ]
                assert link.connections == 2
        finally:
            await link.aclose()
