"""TLS (``rediss://``) end to end, with no TLS in the servers themselves.

Three real servers, each behind a TLS front (`FaultProxy` with a server-side
``ssl.SSLContext``) whose certificate comes from a throwaway CA made by trustme. The
masters are reached by ``rediss://`` URLs carrying redis-py's ``ssl_*`` parameters and
by ready ``redis.asyncio`` clients; certificates that fail verification end an
acquisition at once, with each master's reason.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import ssl
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

import anyio
import anyio.to_thread
import pytest
import trustme
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock import AsyncRedlock, Lease, QuorumUnavailableError, RedlockError
from asyncredlock._tls import CLIENT_CERTIFICATE_HINT
from asyncredlock.testing import FaultProxy, ServerGroup, Waits, client_state, whole_retry_delay
from asyncredlock.testing._support import connected_clients
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import library_tasks, polled
from .test_cli import cli, master_args

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
NEVER = 3600.0  # a timeout or retry delay no test waits out
CLOSE_POLLS = 200  # times the masters' connection counts are read after aclose()
UNTRUSTED = "unable to get local issuer certificate"
OTHER_HOST = "IP address mismatch, certificate is not valid for '127.0.0.1'."

#: The event loops the main cases run on (TLS transports differ between them).
both_loops = pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param("asyncio", id="asyncio"),
        pytest.param(
            ("asyncio", {"use_uvloop": True}),
            id="uvloop",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed"
            ),
        ),
    ],
)


@pytest.fixture(autouse=True)
def _asyncio_logs_nothing(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The fronts end their TLS connections as TLS must (it has no half-close):
    asyncio has nothing to warn about."""
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        yield
    records = caplog.get_records("setup") + caplog.get_records("call")
    assert [record.getMessage() for record in records if record.name == "asyncio"] == []


@dataclass(frozen=True)
class Certs:
    """A throwaway CA, the files a client is given, and server-side contexts."""

    ca: trustme.CA
    ca_pem: Path  # the CA that signs the fronts' certificates
    stranger_pem: Path  # a CA that signed nothing here
    client_pem: Path  # a client certificate signed by `ca`, for fronts that ask for one
    client_key: Path

    def server(
        self, *names: str, ask_client: bool = False, expired: bool = False
    ) -> ssl.SSLContext:
        """A server-side context with a certificate for ``names`` (127.0.0.1 and
        localhost by default; valid only in 2020 if ``expired``), requiring a client
        certificate if ``ask_client``."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        names = names or ("127.0.0.1", "localhost")
        period = (datetime(2020, 1, 1, tzinfo=UTC), datetime(2021, 1, 1, tzinfo=UTC))
        valid = dict(zip(("not_before", "not_after"), period, strict=True)) if expired else {}
        self.ca.issue_cert(*names, **valid).configure_cert(context)
        if ask_client:
            context.verify_mode = ssl.CERT_REQUIRED
            self.ca.configure_trust(context)
        return context


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    folder = tmp_path_factory.mktemp("tls")
    ca, stranger = trustme.CA(), trustme.CA()
    client = ca.issue_cert("locker@example.org")
    paths = [folder / name for name in ("ca.pem", "stranger.pem", "client.pem", "client.key")]
    ca.cert_pem.write_to_path(str(paths[0]))
    stranger.cert_pem.write_to_path(str(paths[1]))
    client.cert_chain_pems[0].write_to_path(str(paths[2]))
    client.private_key_pem.write_to_path(str(paths[3]))
    return Certs(ca, *paths)


@pytest.fixture
def group(make_servers: MakeServers) -> ServerGroup:
    """Three servers of this test's own: their connection counts are this test's."""
    return make_servers(3)


@asynccontextmanager
async def tls_fronts(
    group: ServerGroup, context: ssl.SSLContext
) -> AsyncIterator[list[FaultProxy]]:
    """A TLS front (`FaultProxy` with ``context``) before each server of ``group``."""
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                FaultProxy(server.host, server.port, ssl_context=context)
            )
            for server in group
        ]


@pytest.fixture
async def fronts(group: ServerGroup, certs: Certs) -> AsyncIterator[list[FaultProxy]]:
    """The TLS fronts of the three servers, with a certificate for 127.0.0.1."""
    async with tls_fronts(group, certs.server()) as proxies:
        yield proxies


def urls(fronts: Sequence[FaultProxy], **query: str | Path) -> list[str]:
    """``rediss://`` URLs of the fronts, with ``query`` as their parameters."""
    return [f"{front.url}?{urlencode(query)}" for front in fronts]


async def through_fronts_only(group: ServerGroup, fronts: Sequence[FaultProxy]) -> list[int]:
    """Each server's open connections, once checked to be exactly its front's (every
    one came through TLS: none reached the plain port directly)."""
    counts = [await anyio.to_thread.run_sync(connected_clients, server.port) for server in group]
    assert counts == [front.connections for front in fronts]
    return counts


async def no_connection_left(group: ServerGroup, fronts: Sequence[FaultProxy]) -> None:
    """Wait until no front and no server has a connection open (polled, a bounded
    number of times: a server notices a closed socket on its next loop turn)."""
    for _ in range(CLOSE_POLLS):
        if not any(front.connections for front in fronts):
            counts = [
                await anyio.to_thread.run_sync(connected_clients, server.port) for server in group
            ]
            if counts == [0, 0, 0]:
                return
        await anyio.sleep(0.02)
    raise AssertionError(f"connections left: {[front.connections for front in fronts]}")


class TestFront:
    """`FaultProxy` as a TLS front."""

    async def test_serves_tls_clients_and_counts_their_handshakes(
        self, fronts: list[FaultProxy], certs: Certs
    ) -> None:
        front = fronts[0]
        assert front.url == f"rediss://127.0.0.1:{front.port}"
        client = Redis.from_url(front.url, ssl_ca_certs=str(certs.ca_pem))
        async with client:
            assert await client.ping()
            assert (front.handshakes, front.connections) == (1, 1)

    async def test_a_plain_client_is_not_served(self, fronts: list[FaultProxy]) -> None:
        plain = fronts[0].url.replace("rediss://", "redis://")
        async with Redis.from_url(plain, socket_timeout=HANG_GUARD) as client:
            with pytest.raises(RedisConnectionError):
                await client.ping()
        assert fronts[0].handshakes == 0

    def test_a_context_that_is_not_an_ssl_context_is_refused(self, certs: Certs) -> None:
        with pytest.raises(TypeError, match=r"ssl_context must be an ssl\.SSLContext"):
            FaultProxy("127.0.0.1", 6379, ssl_context=str(certs.ca_pem))  # type: ignore[arg-type]


@both_loops
async def test_a_lock_over_tls(group: ServerGroup, fronts: list[FaultProxy], certs: Certs) -> None:
    """Acquire, extend and release through ``rediss://`` URLs; the fencing token grows;
    every connection the servers see came through a TLS handshake."""
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls(fronts, ssl_ca_certs=certs.ca_pem)) as redlock:
            lease = await redlock.lock("tls:orders", ttl=10.0, auto_extend=False).acquire()
            assert lease.held
            assert await through_fronts_only(group, fronts) == [1, 1, 1]
            await lease.extend(20.0)
            assert lease.statistics().extensions == 1
            await lease.release()
            again = await redlock.lock("tls:orders").acquire()
            await again.release()
            names = [state.node for state in (await redlock.inspect("tls:orders")).nodes]
    assert lease.token is not None
    assert again.token is not None
    assert again.token > lease.token
    assert [front.handshakes for front in fronts] == [1, 1, 1]  # one connection each
    assert names == [front.url for front in fronts]  # shown without the query


@both_loops
async def test_a_waiter_is_woken_over_tls_and_nothing_is_left_after_aclose(
    group: ServerGroup, fronts: list[FaultProxy], certs: Certs
) -> None:
    """A waiter in a second client hears the release through its own subscription
    connection, also over TLS; once both clients are closed, no connection is left."""
    masters = urls(fronts, ssl_ca_certs=certs.ca_pem)
    taken: list[Lease] = []
    with anyio.fail_after(HANG_GUARD):
        # node_timeout: the waiter's enrolment waits that long for its subscriptions
        # to be confirmed, and a loaded machine may take longer than the default
        # 0.1 s to open three TLS connections; a release before then goes unheard.
        async with (
            AsyncRedlock(masters) as holder,
            AsyncRedlock(masters, retry_delay=NEVER, node_timeout=5.0) as other,
        ):

            async def wait() -> None:
                taken.append(await other.lock("tls:handoff", timeout=NEVER).acquire())

            lease = await holder.lock("tls:handoff", ttl=60.0).acquire()
            # its retry would come after an hour, the key's expiry after a minute:
            # only the release can wake it in time
            with Waits(other) as waits, whole_retry_delay(other):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await waits.reach(1)
                    await lease.release()
            assert waits.woken == 1
            assert client_state(other).subscribed == (True, True, True)
            # the holder's command connection, the waiter's, the waiter's subscription
            assert [front.handshakes for front in fronts] == [3, 3, 3]
            assert await through_fronts_only(group, fronts) == [3, 3, 3]
            await taken[0].release()
        await no_connection_left(group, fronts)
    assert taken[0].token is not None
    assert lease.token is not None
    assert taken[0].token > lease.token


async def test_a_ready_client_over_tls(
    group: ServerGroup, fronts: list[FaultProxy], certs: Certs
) -> None:
    """``Redis(ssl=True, ssl_ca_certs=...)`` clients as masters: asyncredlock's own
    connection is opened with their TLS settings."""
    ready = [
        Redis(host=front.host, port=front.port, ssl=True, ssl_ca_certs=str(certs.ca_pem))
        for front in fronts
    ]
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(ready) as redlock:
            lease = await redlock.lock("tls:ready").acquire()
            assert await through_fronts_only(group, fronts) == [1, 1, 1]
            await lease.release()
    for client in ready:
        await client.aclose()
    assert lease.token is not None
    assert [front.handshakes for front in fronts] == [1, 1, 1]  # the clients never connected


@pytest.fixture(params=["untrusted CA", "another host", "expired"])
async def refusing(
    request: pytest.FixtureRequest, group: ServerGroup, certs: Certs
) -> AsyncIterator[tuple[list[str], str, list[FaultProxy]]]:
    """Fronts whose certificate the client refuses, the URLs given to it, and why."""
    trusted = {"ssl_ca_certs": certs.ca_pem}
    context, query, why = {
        "untrusted CA": (certs.server(), {"ssl_ca_certs": certs.stranger_pem}, UNTRUSTED),
        "another host": (certs.server("db.example.org"), trusted, OTHER_HOST),
        "expired": (certs.server(expired=True), trusted, "certificate has expired"),
    }[request.param]
    async with tls_fronts(group, context) as proxies:
        yield urls(proxies, **query), why, proxies


@both_loops
async def test_a_refused_certificate_ends_the_acquisition_at_once(
    refusing: tuple[list[str], str, list[FaultProxy]],
) -> None:
    """With an hour-long timeout: one attempt, then `QuorumUnavailableError` naming
    the verification failure of each master (not a silent master, not a timeout);
    `force_release()` says so too."""
    masters, why, fronts = refusing
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(masters, timeout=NEVER) as redlock:
            with pytest.raises(QuorumUnavailableError) as caught:
                await redlock.lock("tls:refused").acquire()
            assert redlock.statistics().attempts == 1
            with pytest.raises(QuorumUnavailableError) as forced:
                await redlock.force_release("tls:refused")
    error = caught.value
    assert str(error).startswith("could not lock 'tls:refused': TLS certificates refused")
    assert str(forced.value).startswith("could not force 'tls:refused' free: TLS certificates")
    failed = "CertificateError: TLS certificate verification failed for 127.0.0.1"
    for outcomes in (error.outcomes, forced.value.outcomes):
        assert [(o.node, o.ok, o.detail) for o in outcomes] == [
            (front.url, False, f"{failed}:{front.port}: {why}") for front in fronts
        ]
    assert [front.handshakes for front in fronts] == [0, 0, 0]


async def test_a_ready_client_with_a_refused_certificate_says_so(
    group: ServerGroup, fronts: list[FaultProxy], certs: Certs
) -> None:
    ready = [
        Redis(host=front.host, port=front.port, ssl=True, ssl_ca_certs=str(certs.stranger_pem))
        for front in fronts
    ]
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(ready, timeout=NEVER) as redlock:
            with pytest.raises(QuorumUnavailableError) as caught:
                await redlock.lock("tls:ready-refused").acquire()
    for client in ready:
        await client.aclose()
    assert all(UNTRUSTED in outcome.detail for outcome in caught.value.outcomes)
    assert len(caught.value.outcomes) == 3


async def test_one_refused_certificate_is_one_failed_master(
    group: ServerGroup, fronts: list[FaultProxy], certs: Certs
) -> None:
    """A minority of masters refused is an outage the quorum tolerates."""
    async with tls_fronts(group, certs.server("db.example.org")) as wrong:
        masters = urls([wrong[0], *fronts[1:]], ssl_ca_certs=certs.ca_pem)
        with anyio.fail_after(HANG_GUARD):
            async with AsyncRedlock(masters) as redlock:
                lease = await redlock.lock("tls:minority").acquire()
                state = await redlock.inspect("tls:minority")
                await lease.release()
    assert [node.holder == lease.value for node in state.nodes] == [False, True, True]
    assert OTHER_HOST in (state.nodes[0].error or "")


@pytest.mark.parametrize(
    ("names", "trusted", "relax"),
    [
        pytest.param((), False, {"ssl_cert_reqs": "none"}, id="ssl_cert_reqs=none"),
        pytest.param(
            ("db.example.org",),
            True,
            {"ssl_check_hostname": "false"},
            id="ssl_check_hostname=false",
        ),
    ],
)
async def test_verification_turned_off_connects(
    group: ServerGroup, certs: Certs, names: tuple[str, ...], trusted: bool, relax: dict[str, str]
) -> None:
    """The URL parameters that relax verification pass through to redis-py: the
    fronts refused in `test_a_refused_certificate_ends_the_acquisition_at_once`
    (an untrusted CA, another host name) are then accepted."""
    ca_pem = certs.ca_pem if trusted else certs.stranger_pem
    async with tls_fronts(group, certs.server(*names)) as proxies:
        with anyio.fail_after(HANG_GUARD):
            async with AsyncRedlock(urls(proxies, ssl_ca_certs=ca_pem, **relax)) as redlock:
                lease = await redlock.lock("tls:relaxed").acquire()
                await lease.release()
        assert [front.handshakes for front in proxies] == [1, 1, 1]
    assert lease.token is not None


async def test_a_client_certificate_from_the_url(group: ServerGroup, certs: Certs) -> None:
    """Fronts that require a client certificate: ``ssl_certfile`` and ``ssl_keyfile``
    give one; without them the fronts refuse the handshake."""
    async with tls_fronts(group, certs.server(ask_client=True)) as proxies:
        mutual = urls(
            proxies,
            ssl_ca_certs=certs.ca_pem,
            ssl_certfile=certs.client_pem,
            ssl_keyfile=certs.client_key,
        )
        with anyio.fail_after(HANG_GUARD):
            async with AsyncRedlock(mutual) as redlock:
                lease = await redlock.lock("tls:mutual").acquire()
                await lease.release()
            assert [front.handshakes for front in proxies] == [1, 1, 1]
            async with AsyncRedlock(urls(proxies, ssl_ca_certs=certs.ca_pem), timeout=0) as anon:
                with pytest.raises(QuorumUnavailableError) as refused:
                    await anon.lock("tls:mutual").acquire()
            # redis-py's own handshake sends SELECT first: it is refused during it
            selecting = [
                url.replace("?", "/1?", 1) for url in urls(proxies, ssl_ca_certs=certs.ca_pem)
            ]
            async with AsyncRedlock(selecting, timeout=0) as anon:
                with pytest.raises(QuorumUnavailableError) as refused_early:
                    await anon.lock("tls:mutual").acquire()
        assert [front.handshakes for front in proxies] == [1, 1, 1]
    assert lease.token is not None
    # ended before any reply: each master's account says what a front asking for a
    # client certificate does to a client that gives none
    assert str(refused.value).count(CLIENT_CERTIFICATE_HINT) == 3
    assert str(refused_early.value).count(CLIENT_CERTIFICATE_HINT) == 3


async def test_a_tls_connection_lost_after_replies_has_no_certificate_hint(
    fronts: list[FaultProxy], certs: Certs
) -> None:
    """A TLS connection that answered, then was reset, is reported lost, nothing more."""
    async with AsyncRedlock(urls(fronts, ssl_ca_certs=certs.ca_pem), timeout=0) as redlock:
        with anyio.fail_after(HANG_GUARD):
            state = await redlock.inspect("tls:answered")  # every master has answered
            assert [node.error for node in state.nodes] == [None] * 3
            for front in fronts:
                front.reset_connections()
            # the attempt goes out on the connections just reset (the client hears
            # of the resets only after it)
            with pytest.raises(QuorumUnavailableError) as lost:
                await redlock.lock("tls:reset").acquire()
    assert str(lost.value).count("lost: ") == 3
    assert CLIENT_CERTIFICATE_HINT not in str(lost.value)


class TestCLI:
    async def test_inspect_over_tls(
        self, fronts: list[FaultProxy], certs: Certs, capsys: pytest.CaptureFixture[str]
    ) -> None:
        masters = urls(fronts, ssl_ca_certs=certs.ca_pem)
        with anyio.fail_after(HANG_GUARD):
            async with (
                AsyncRedlock(masters, identity="tls-holder") as redlock,
                redlock.lock("tls:cli") as lease,
            ):
                code = await cli("inspect", "tls:cli", *master_args(masters))
        out = capsys.readouterr().out
        assert code == 0
        assert f"majority holder: {lease.value} (on 3 of 3 masters; identity tls-holder)" in out
        rows = [line.split() for line in out.splitlines() if line.startswith("rediss://")]
        assert [row[:2] for row in rows] == [[front.url, lease.value] for front in fronts]

    async def test_inspect_with_a_refused_certificate(
        self, fronts: list[FaultProxy], certs: Certs, capsys: pytest.CaptureFixture[str]
    ) -> None:
        masters = urls(fronts, ssl_ca_certs=certs.stranger_pem)
        with anyio.fail_after(HANG_GUARD):
            code = await cli("inspect", "tls:cli", *master_args(masters))
        out = capsys.readouterr().out
        assert code == 3
        rows = [line for line in out.splitlines() if line.startswith("rediss://")]
        assert len(rows) == 3
        assert all(
            "TLS certificate verification failed" in row and UNTRUSTED in row for row in rows
        )


def own_tasks() -> list[asyncio.Task[object]]:
    """The library's running tasks, not those of its testing helpers (the fronts)."""
    return [
        task
        for task in library_tasks()
        if "/testing/" not in task.get_coro().cr_code.co_filename  # type: ignore[union-attr]
    ]


@pytest.fixture
async def mutual(group: ServerGroup, certs: Certs) -> AsyncIterator[list[FaultProxy]]:
    """Fronts that require a client certificate signed by the CA."""
    async with tls_fronts(group, certs.server(ask_client=True)) as proxies:
        yield proxies


def mutual_urls(fronts: list[FaultProxy], certs: Certs) -> list[str]:
    # ssl_check_hostname is on by default in redis-py >= 6; said explicitly here
    return urls(
        fronts,
        ssl_ca_certs=certs.ca_pem,
        ssl_certfile=certs.client_pem,
        ssl_keyfile=certs.client_key,
        ssl_check_hostname="true",
    )


async def test_mutual_tls_wakeup_restart_and_idle_pings(
    group: ServerGroup, mutual: list[FaultProxy], certs: Certs
) -> None:
    """Over mutual TLS with host name checks: a waiter is woken through its TLS
    subscription; idle command and subscription connections PING and stay up; after a
    master restarts, both reconnect (through a new TLS handshake) and a later
    wake-up still arrives."""
    masters = mutual_urls(mutual, certs)
    taken: list[Lease] = []
    with anyio.fail_after(HANG_GUARD):
        async with (
            AsyncRedlock(masters, socket_timeout=0.3) as holder,
            AsyncRedlock(masters, retry_delay=NEVER, node_timeout=5.0, socket_timeout=0.3) as other,
        ):

            async def wait(name: str) -> None:
                taken.append(await other.lock(name, timeout=NEVER).acquire())

            async def handoff(name: str) -> None:
                lease = await holder.lock(name, ttl=60.0).acquire()
                with Waits(other) as waits, whole_retry_delay(other):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(wait, name)
                        await waits.reach(1)
                        await lease.release()
                assert waits.woken == 1
                await taken[-1].release()

            await handoff("mtls:one")
            assert client_state(other).subscribed == (True, True, True)
            # idle: command links and subscriptions PING, and stay connected
            links = [node.link for node in other._core.nodes]
            listeners = other._core.waker.listeners
            assert await polled(lambda: all(link and link.pings >= 2 for link in links))
            assert await polled(
                lambda: all(
                    li is not None
                    and li.connection is not None
                    and li.connection.heartbeat is not None
                    and li.connection.heartbeat.pings >= 2
                    for li in listeners
                )
            )
            before = [front.handshakes for front in mutual]
            assert before == [3, 3, 3]  # no reconnection while idle
            # a master restarts behind its front: both kinds of connection reopen
            await anyio.to_thread.run_sync(group[0].restart)
            assert await polled(
                lambda: (
                    client_state(other).subscribed == (True, True, True)
                    and mutual[0].handshakes >= before[0] + 1
                )
            )
            await handoff("mtls:two")
            assert await polled(lambda: mutual[0].handshakes >= before[0] + 3)
            state = await other.inspect("mtls:two")
            assert [node.error for node in state.nodes] == [None, None, None]
        await no_connection_left(group, mutual)
    assert len(taken) == 2


async def _closed_while_pending(
    redlock: AsyncRedlock,
    task: asyncio.Task[None],
    errors: list[BaseException],
    group: ServerGroup,
    mutual: list[FaultProxy],
) -> None:
    """Close ``redlock`` while ``task``'s call hangs behind the blackholed ``mutual``
    fronts: the call ends with one library error, and no task or connection is left."""
    await redlock.aclose()
    await task
    for front in mutual:
        front.blackhole = False
    assert len(errors) == 1
    assert isinstance(errors[0], RedlockError | RuntimeError), repr(errors[0])
    assert own_tasks() == []
    await no_connection_left(group, mutual)


async def test_aclose_with_calls_pending_over_tls(
    group: ServerGroup, mutual: list[FaultProxy], certs: Certs
) -> None:
    """Calls out on TLS connections whose masters went silent: `aclose()` fails them
    with `ClosedError`, leaves no library task and no connection, and asyncio logs
    no unclosed-transport warning."""
    masters = mutual_urls(mutual, certs)
    with anyio.fail_after(HANG_GUARD):
        redlock = AsyncRedlock(masters, timeout=NEVER, node_timeout=2.0, socket_timeout=NEVER)
        lease = await redlock.lock("mtls:pending", ttl=60.0, auto_extend=False).acquire()
        for front in mutual:
            front.blackhole = True
        errors: list[BaseException] = []

        async def extend() -> None:
            try:
                await lease.extend()
            except BaseException as exc:  # recorded and asserted
                errors.append(exc)

        task = asyncio.get_running_loop().create_task(extend())
        assert await polled(lambda: all(n.in_flight for n in redlock._core.nodes))
        await _closed_while_pending(redlock, task, errors, group, mutual)


async def test_aclose_during_a_tls_handshake(
    group: ServerGroup, mutual: list[FaultProxy], certs: Certs
) -> None:
    """`aclose()` while the first connections are still in their TLS handshake (the
    fronts forward nothing): the acquisition ends with `ClosedError` (or the closed
    client's RuntimeError), and no task or connection is left."""
    masters = mutual_urls(mutual, certs)
    for front in mutual:
        front.blackhole = True
    with anyio.fail_after(HANG_GUARD):
        redlock = AsyncRedlock(masters, timeout=NEVER, node_timeout=2.0, socket_timeout=NEVER)
        errors: list[BaseException] = []

        async def acquire() -> None:
            try:
                await redlock.lock("mtls:handshake").acquire()
            except BaseException as exc:  # recorded and asserted
                errors.append(exc)

        task = asyncio.get_running_loop().create_task(acquire())
        assert await polled(lambda: all(front.connections for front in mutual))
        await _closed_while_pending(redlock, task, errors, group, mutual)


async def test_a_front_drops_a_connection_stuck_in_its_tls_handshake(
    group: ServerGroup, certs: Certs
) -> None:
    """A client that opened TCP to a TLS front and never handshakes (the handshake is
    the loop's, before the front sees a connection): after `aclose()` its connection
    ends (at the front's 5 s handshake timeout), where it lasted the loop's 60 s (on
    Python >= 3.12, ``aclose()`` would wait for it). On the default loop only: it
    waits out the 5 s, and the timeout is the loop's own setting either way."""
    front = FaultProxy(group[0].host, group[0].port, ssl_context=certs.server())
    await front.start()
    reader, writer = await asyncio.open_connection(front.host, front.port)
    try:
        with anyio.fail_after(HANG_GUARD):
            await front.aclose()
        assert front.connections == 0
        assert front.handshakes == 0
        try:
            with anyio.fail_after(HANG_GUARD):
                data = await reader.read(1)
        except ConnectionResetError:
            data = b""
        assert data == b"", "the proxy sent something to a client that said nothing"
    finally:
        writer.close()


@pytest.fixture
def encrypted_key(certs: Certs, tmp_path: Path) -> Path:
    """The client key of `certs`, encrypted with the password ``right-pass``."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(certs.client_key.read_bytes(), None)
    path = tmp_path / "client-encrypted.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"right-pass"),
        )
    )
    return path


def _tls_settings(case: str, certs: Certs, encrypted_key: Path, tmp_path: Path) -> dict[str, str]:
    return {
        "missing CA file": {"ssl_ca_certs": str(tmp_path / "no-such-ca.pem")},
        "missing CA directory": {"ssl_ca_path": str(tmp_path / "no-such-ca-dir")},
        "CA directory a file": {"ssl_ca_path": str(certs.ca_pem)},
        "wrong ssl_password": {
            "ssl_ca_certs": str(certs.ca_pem),
            "ssl_certfile": str(certs.client_pem),
            "ssl_keyfile": str(encrypted_key),
            "ssl_password": "wrong-pass",
        },
    }[case]


#: The cases of `_tls_settings`, each with the setting its error names.
REFUSED_SETTINGS = {
    "missing CA file": "ssl_ca_certs",
    "missing CA directory": "ssl_ca_path",
    "CA directory a file": "ssl_ca_path",
    "wrong ssl_password": "ssl_keyfile",
}


@pytest.mark.parametrize("case", list(REFUSED_SETTINGS))
def test_a_tls_setting_redis_py_refuses_is_refused_at_construction(
    certs: Certs, encrypted_key: Path, tmp_path: Path, case: str
) -> None:
    """A value redis-py would refuse on every connection raises ValueError at
    construction (configuration.md, URL parameters), naming the setting and its file:
    a CA file that does not exist, an ``ssl_password`` that does not decrypt
    ``ssl_keyfile``. No password shows (the user's is in the URL too)."""
    query = _tls_settings(case, certs, encrypted_key, tmp_path)
    named = REFUSED_SETTINGS[case]
    masters = [f"rediss://user:s3cret@127.0.0.1:{port}?{urlencode(query)}" for port in (7001, 7002)]
    with pytest.raises(ValueError, match=named) as refused:
        AsyncRedlock(masters)
    message = str(refused.value)
    assert "127.0.0.1:7001" in message
    assert Path(query[named]).name in message
    assert "wrong-pass" not in message
    assert "s3cret" not in message


@pytest.mark.parametrize("case", list(REFUSED_SETTINGS))
async def test_a_ready_client_with_tls_settings_redis_py_refuses_is_refused(
    certs: Certs, encrypted_key: Path, tmp_path: Path, case: str
) -> None:
    """The same check for a ready ``Redis(ssl=True, ...)`` client."""
    query = _tls_settings(case, certs, encrypted_key, tmp_path)
    named = REFUSED_SETTINGS[case]
    client = Redis(host="127.0.0.1", port=7001, ssl=True, **query)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=named) as refused:
        AsyncRedlock([client])
    await client.aclose()
    assert Path(query[named]).name in str(refused.value)
    assert "wrong-pass" not in str(refused.value)


async def test_a_ready_client_with_a_tls_value_redis_py_refuses_is_a_value_error() -> None:
    """A ready client's TLS value that redis-py refuses when it makes a connection is
    refused at construction with ValueError naming the master, as in a URL
    (``master URL ...: Invalid SSL Certificate Requirements Flag: maybe``), not
    with redis-py's ``RedisError`` (or ``TypeError``)."""
    client = Redis(host="127.0.0.1", port=7001, ssl=True, ssl_cert_reqs="maybe")
    refusal = r"master '.*127\.0\.0\.1:7001.*': .*Flag: maybe"
    with pytest.raises(ValueError, match=refusal) as refused:
        AsyncRedlock([client])
    await client.aclose()
    assert type(refused.value) is ValueError


def test_tls_settings_redis_py_accepts_build_a_client(certs: Certs, encrypted_key: Path) -> None:
    """The right ``ssl_password`` for an encrypted key is accepted at construction."""
    query = {
        "ssl_ca_certs": certs.ca_pem,
        "ssl_certfile": certs.client_pem,
        "ssl_keyfile": encrypted_key,
        "ssl_password": "right-pass",
    }
    AsyncRedlock([f"rediss://127.0.0.1:7001?{urlencode(query)}"])
