"""Masters named by Sentinel URLs (``redis-sentinel://host:port,.../service``), against
real Sentinel processes (``valkey-server --sentinel`` from the same binary): the URL
checked at construction (and a ready ``slave_for()`` client refused), a lock cycle,
wake-ups and inspection through sentinels, the CLI, nothing left open, the next
connection after a failover going to the new master, and a failover while a lock is
held (the key lost, the counter set back)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis.asyncio.sentinel
import valkey.asyncio.sentinel
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease, LockTimeoutError, QuorumUnavailableError
from asyncredlock.__main__ import main
from asyncredlock.testing import SentinelProcess, ServerGroup, ServerProcess, Waits
from asyncredlock.testing._support import connected_clients
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import cut_off_replica

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
#: Seconds of silence before the sentinel counts a master down. A sentinel pings once a
#: second and, once the connection is gone, counts the silence from the last answer, so
#: it can start a failover as little as ``DOWN_AFTER - 1`` s after the primary's last
#: count; the clock floor needs that to be a second (at 1.0 the suite once saw the
#: failover done within the second of the last token).
DOWN_AFTER = 2.0
SERVICES = ("s0", "s1", "s2")


@pytest.fixture
def sentinel(make_servers: MakeServers) -> Iterator[tuple[SentinelProcess, ServerGroup]]:
    """Three servers, each the master of one service of one Sentinel."""
    group = make_servers(3)
    process = SentinelProcess(dict(zip(SERVICES, group, strict=True)))
    with process:
        yield process, group


class TestURL:
    @pytest.mark.parametrize(
        ("url", "message"),
        [
            ("redis-sentinel://h1:26379", "names no service"),
            ("redis-sentinel://h1:26379/", "names no service"),
            ("redis-sentinel://h1:26379/svc/x", "only a database number"),
            ("redis-sentinel://h1:26379/svc/\u00b2", "only a database number"),  # ²
            ("redis-sentinel://h1:\u00b2/svc", "invalid sentinel port"),
            ("redis-sentinel://h1/svc#frag", r"'redis-sentinel://h1/svc' has a fragment"),
            ("redis-sentinel://h1:0/svc", "invalid sentinel port"),
            ("redis-sentinel://h1:99999/svc", "invalid sentinel port"),
            ("redis-sentinel://h1:26379,:1/svc", "without a host"),
            ("redis-sentinel://[::1/svc", "malformed sentinel address"),
            ("redis-sentinel://h1/svc?password=x", "unknown parameter 'password'"),
            ("redis-sentinel://h1/svc?sentinel_password=x&sentinel_password=y", "twice"),
            ("redis://h1:6379,h2:6379", "has a comma: one host per URL"),
        ],
    )
    def test_a_malformed_url_is_refused_at_construction(self, url: str, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            AsyncRedlock([url])

    @pytest.mark.parametrize(
        ("url", "shown"),
        [
            ("redis-sentinel://u:s3cret@h:99999/svc", "'redis-sentinel://u@h:99999/svc' has an"),
            ("redis-sentinel://u:s3cret@h", "'redis-sentinel://u@h' names no service"),
            ("redis-sentinel://u:s3cret@h/svc/x", "'redis-sentinel://u@h/svc/x': after the"),
            ("redis-sentinel://u:s3cret@[::1/svc", "'redis-sentinel://u@[::1/svc' has a"),
            ("redis-sentinel://h/svc?sentinel_password=s3cret&x=1", "'redis-sentinel://h/svc':"),
            # a "/" in the password (not %-encoded) ends the sentinels: "u:s3" is read as one
            ("redis-sentinel://u:s3/cret@h/svc", "'redis-sentinel://u@h/svc': an '@' after"),
            # ... with an address for a sentinel: the rest of it read as the service
            ("redis-sentinel://admin:4242/tails3cret@127.0.0.1", "'redis-sentinel://admin@"),
            # an unencoded '&' in a query password: its tail read as a parameter
            ("redis-sentinel://h/svc?sentinel_password=ab&cds3cret", "name not shown"),
        ],
    )
    def test_a_refused_url_is_shown_without_its_password(self, url: str, shown: str) -> None:
        with pytest.raises(ValueError, match=re.escape(shown)) as refused:
            AsyncRedlock([url])
        assert "s3" not in str(refused.value)

    def test_display_names_the_first_sentinel_and_the_service_without_password(self) -> None:
        redlock = AsyncRedlock(
            [
                "redis-sentinel://:s3cret@H1:26380,h2/orders/2?sentinel_password=x",
                "redis-sentinel://[::1]:26381/payments",
                "redis-sentinel://h3/users",
            ]
        )
        assert [node.name for node in redlock._core.nodes] == [
            "redis-sentinel://h1:26380/orders",
            "redis-sentinel://[::1]:26381/payments",
            "redis-sentinel://h3:26379/users",
        ]

    def test_the_same_master_twice_is_refused(self) -> None:
        with pytest.raises(ValueError, match="given twice"):
            AsyncRedlock(["redis-sentinel://h1,h2/svc", "redis-sentinel://h2:26379,h1/svc"])


class TestReplicaClient:
    @pytest.mark.parametrize("module", [redis.asyncio.sentinel, valkey.asyncio.sentinel])
    async def test_a_slave_for_client_is_refused_at_construction(self, module: Any) -> None:
        """A ``slave_for()`` client connects to a replica, where every SET fails with
        READONLY: it is refused before any I/O (no sentinel listens on this port),
        naming the master and the way to reach the primary."""
        sentinel = module.Sentinel([("127.0.0.1", 26379)])
        client = sentinel.slave_for("svc")
        try:
            with pytest.raises(ValueError, match="replica") as refused:
                AsyncRedlock([client])
            assert "'redis-sentinel://127.0.0.1:26379/svc'" in str(refused.value)
            assert "master_for('svc')" in str(refused.value)
        finally:
            await client.aclose()
            for each in sentinel.sentinels:
                await each.aclose()


class TestThroughSentinels:
    async def test_lock_wake_up_and_inspect(
        self, sentinel: tuple[SentinelProcess, ServerGroup]
    ) -> None:
        process, _ = sentinel
        urls = [process.master_url(service) for service in SERVICES]
        async with AsyncRedlock(urls) as holder, AsyncRedlock(urls) as waiter:
            lease = await holder.lock("sentinel:one", fencing=True).acquire()
            assert lease.token is not None
            state = await holder.inspect("sentinel:one")
            assert state.holder == lease.value
            assert [node.node for node in state.nodes] == [
                f"redis-sentinel://127.0.0.1:{process.port}/{s}" for s in SERVICES
            ]
            got: list[Lease] = []
            with anyio.fail_after(HANG_GUARD), Waits(waiter) as waits:
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        got.append(await waiter.lock("sentinel:one", timeout=20).acquire())

                    tg.start_soon(take)
                    await waits.reach(1)  # refused once: it waits for the release
                    await lease.release()
            assert got[0].token is not None
            assert got[0].token > lease.token
            await got[0].release()
            assert waiter.statistics().wakeups == 1  # woken by the release, not a retry

    async def test_closing_leaves_no_connection_on_servers_or_sentinel(
        self, sentinel: tuple[SentinelProcess, ServerGroup]
    ) -> None:
        process, group = sentinel
        # the sentinel's own links to the masters it monitors count too: measured first
        before = [connected_clients(server.port) for server in group]
        sentinel_before = connected_clients(process.port)
        redlock = AsyncRedlock([process.master_url(service) for service in SERVICES])
        async with redlock, redlock.lock("sentinel:closed"):
            assert connected_clients(process.port) > sentinel_before
        assert connected_clients(process.port) == sentinel_before
        assert [connected_clients(server.port) for server in group] == before

    async def test_the_cli_takes_sentinel_urls_from_the_environment(
        self,
        sentinel: tuple[SentinelProcess, ServerGroup],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        process, _ = sentinel
        urls = [process.master_url(service) for service in SERVICES]
        # commas inside a Sentinel URL (its sentinels) and between URLs alike
        spaced = ",".join(url.replace("//", f"//127.0.0.1:{process.port},", 1) for url in urls)
        monkeypatch.setenv("REDLOCK_MASTERS", spaced)
        async with AsyncRedlock(urls) as redlock:
            lease = await redlock.lock("sentinel:cli").acquire()
            held = await anyio.to_thread.run_sync(main, ["inspect", "sentinel:cli"])
            await lease.release()
        free = await anyio.to_thread.run_sync(main, ["inspect", "sentinel:cli"])
        assert (held, free) == (0, 1)
        assert lease.value in capsys.readouterr().out


class Hangup:
    """A listener that ends every connection as soon as it is accepted (a sentinel
    that is down, as a refused connection is), counting them."""

    def __init__(self) -> None:
        self.accepted = 0
        self.port = 0

    async def _hang_up(self, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Hangup]:
        server = await asyncio.start_server(self._hang_up, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self


class TestSentinelsDown:
    """A sentinel that is down is asked once per discovery, never retried with
    redis-py's default backoff (seconds per connection)."""

    async def test_a_sentinel_down_is_asked_once_and_the_next_one_answers(
        self, make_servers: MakeServers
    ) -> None:
        primary = make_servers(1)[0]
        with SentinelProcess({"svc": primary}) as process:
            async with Hangup().running() as down:
                url = f"redis-sentinel://127.0.0.1:{down.port},127.0.0.1:{process.port}/svc"
                with anyio.fail_after(HANG_GUARD):
                    async with AsyncRedlock([url]) as redlock:
                        lease = await redlock.lock("sentinel:down", timeout=0).acquire()
                        await lease.release()
                assert down.accepted == 1

    async def test_every_sentinel_down_is_an_outage_after_one_question_each(self) -> None:
        async with Hangup().running() as one, Hangup().running() as two:
            url = f"redis-sentinel://127.0.0.1:{one.port},127.0.0.1:{two.port}/svc"
            with anyio.fail_after(HANG_GUARD):
                async with AsyncRedlock([url]) as redlock:
                    with pytest.raises(QuorumUnavailableError, match="No master found"):
                        await redlock.lock("sentinel:down", timeout=0).acquire()
            # two connections: the attempt's, and its undo's (sent to every master)
            assert (one.accepted, two.accepted) == (2, 2)


class TestFailover:
    async def test_new_connections_go_to_the_promoted_replica(
        self, make_servers: MakeServers
    ) -> None:
        primary = make_servers(1)[0]
        replica = ServerProcess(extra_args=("--replicaof", "127.0.0.1", str(primary.port)))
        with replica, SentinelProcess({"svc": primary}, down_after=0.5) as process:
            events = Redis(port=process.port).pubsub()
            await events.subscribe("+switch-master")
            async with AsyncRedlock([process.master_url("svc")]) as redlock:
                lease = await redlock.lock("sentinel:before").acquire()
                await lease.release()
                primary.stop()  # the sentinel promotes the replica
                with anyio.fail_after(HANG_GUARD):
                    switched = await _next_message(events)
                assert switched.split()[-2:] == [b"127.0.0.1", str(replica.port).encode()]
                assert process.master_address("svc") == ("127.0.0.1", replica.port)
                lease = await redlock.lock("sentinel:after").acquire()
                direct = Redis(port=replica.port)
                try:  # the lock was taken on the promoted replica
                    assert await direct.get(lease.key) == lease.value.encode()
                finally:
                    await direct.aclose()
                await lease.release()
            await events.aclose()


class Replicated:
    """Three masters: a Sentinel-managed one (``servers[0]`` its primary, with a
    replica) and two standalone ones (``servers[1]``, ``servers[2]``)."""

    def __init__(self, servers: ServerGroup, replica: ServerProcess, sentinel: SentinelProcess):
        self.servers, self.replica, self.sentinel = servers, replica, sentinel
        self.urls = [sentinel.master_url("svc"), servers[1].url, servers[2].url]

    async def set_everywhere(self, key: str, value: int) -> None:
        """Set ``key`` on every master, the replica's copy included."""
        for server in self.servers:
            async with Redis(port=server.port) as client:
                await client.set(key, value)
                if server is self.servers[0]:
                    assert await client.wait(1, HANG_GUARD * 1000) == 1

    def cut_off(self) -> None:
        """The replica misses the primary's writes from now on (`cut_off_replica`)."""
        cut_off_replica(self.servers[0], self.replica)

    async def fail_over(self) -> None:
        """Kill the primary, let the replica go on, wait until the sentinel has
        switched the service to it."""
        async with Redis(port=self.sentinel.port) as client:
            events = client.pubsub()
            await events.subscribe("+switch-master")
            self.servers[0].kill()
            self.replica.resume()
            with anyio.fail_after(HANG_GUARD):
                switched = await _next_message(events)
            await events.aclose()
        assert switched.split()[-1] == str(self.replica.port).encode()

    async def on_replica(self, key: str) -> bytes | None:
        async with Redis(port=self.replica.port) as client:
            value: bytes | None = await client.get(key)
            return value


@pytest.fixture
async def replicated(make_servers: MakeServers) -> AsyncIterator[Replicated]:
    """`Replicated`, the sentinel knowing the replica (so that it can fail over)."""
    servers = make_servers(3)
    primary = servers[0]
    replica = ServerProcess(extra_args=("--replicaof", "127.0.0.1", str(primary.port)))
    with replica, SentinelProcess({"svc": primary}, down_after=DOWN_AFTER) as sentinel:
        async with Redis(port=sentinel.port) as client:
            events = client.pubsub()
            await events.subscribe("+slave")
            if not await client.execute_command("SENTINEL", "REPLICAS", "svc"):
                with anyio.fail_after(HANG_GUARD):
                    await _next_message(events)
            await events.aclose()
        yield Replicated(servers, replica, sentinel)


class TestFailoverWhileHeld:
    """A failover of a Sentinel-managed master while its replica lagged: replication
    is asynchronous, so the promoted replica may lack the lock key and hold an older
    fence counter (here for certain: it was cut off before the acquisitions)."""

    async def test_a_lease_outlives_a_failover_that_lost_its_key(
        self, replicated: Replicated
    ) -> None:
        """The master that failed over lost the lock, as a master restarted empty
        would: one of the failures the quorum tolerates. The lease extends on the
        others, a rival is refused, and the next token is larger (the others kept
        the count)."""
        replicated.cut_off()
        async with (
            AsyncRedlock(replicated.urls) as holder,
            AsyncRedlock(replicated.urls) as rival,
        ):
            lease = await holder.lock("held", auto_extend=False).acquire()
            await holder.settle()  # every master answered: no call is retried later
            await replicated.fail_over()
            assert await replicated.on_replica("held") is None  # lost in the failover
            await lease.extend()  # on the two masters that still hold it
            assert lease.held
            with pytest.raises(LockTimeoutError):
                await rival.lock("held", timeout=0).acquire()
            await lease.release()
            after = await rival.lock("held", timeout=0).acquire()
            await after.release()
        assert lease.token is not None
        assert after.token is not None
        assert after.token > lease.token

    async def test_a_counter_set_back_by_the_failover_is_lifted_by_the_clock(
        self, replicated: Replicated
    ) -> None:
        """The next quorum shares only the failed-over master with the last one:
        the first holder is granted by it (before the failover) and the first
        standalone master (the second refuses: another holder's key), the next by
        the promoted replica and the second standalone master (the first refuses).
        Neither of those has the first token; the clock floor keeps the next one
        larger, since the failover took longer than a second (``DOWN_AFTER``)."""
        start = 10**15  # every counter at one count (microseconds in 2001)
        await replicated.set_everywhere("{stale}:fence", start)
        replicated.cut_off()
        standalone = [Redis(port=server.port) for server in replicated.servers[1:]]
        try:
            async with (
                AsyncRedlock(replicated.urls) as holder,
                AsyncRedlock(replicated.urls) as rival,
            ):
                await standalone[1].set("stale", "another holder", px=HANG_GUARD * 1000)
                first = await holder.lock("stale", auto_extend=False).acquire()
                await first.release()
                await holder.settle()
                await standalone[1].delete("stale")
                await replicated.fail_over()
                assert await replicated.on_replica("{stale}:fence") == str(start).encode()
                await standalone[0].set("stale", "another holder", px=HANG_GUARD * 1000)
                seconds, _ = await standalone[1].time()
                assert first.token is not None
                assert seconds * 10**6 > first.token  # the clocks are a second further on
                second = await rival.lock("stale", timeout=0).acquire()  # one attempt
                await second.release()
        finally:
            for client in standalone:
                await client.aclose()
        assert first.token > start + 10**6  # lifted by the floor
        assert second.token is not None
        assert second.token > first.token


async def _next_message(pubsub: Any) -> bytes:
    """The next message published on the channels ``pubsub`` subscribed to."""
    async for message in pubsub.listen():
        if message["type"] == "message":
            data: bytes = message["data"]
            return data
    raise AssertionError("the subscription ended")
