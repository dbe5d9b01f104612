"""Review of TLS: mutual TLS with host name checks through every connection the
library opens (commands, wake-up subscription, reconnection after a master restart,
idle PINGs), and `aclose()` with calls pending over TLS. Complements test_tls.py
(which covers one-way TLS, refused certificates and the client-certificate hint)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, QuorumUnavailableError, RedlockError
from asyncredlock.testing import FaultProxy, ServerGroup, Waits, client_state, whole_retry_delay

from .conftest import library_tasks, polled
from .test_tls import (  # noqa: F401  (fixtures)
    HANG_GUARD,
    NEVER,
    Certs,
    _asyncio_logs_nothing,
    certs,
    group,
    no_connection_left,
    tls_fronts,
    urls,
)

pytestmark = pytest.mark.anyio


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
            assert await polled(lambda: client_state(other).subscribed == (True, True, True)
                                and mutual[0].handshakes >= before[0] + 1)
            await handoff("mtls:two")
            assert await polled(lambda: mutual[0].handshakes >= before[0] + 3)
            state = await other.inspect("mtls:two")
            assert [node.error for node in state.nodes] == [None, None, None]
        await no_connection_left(group, mutual)
    assert len(taken) == 2


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
            except BaseException as exc:  # noqa: BLE001 - recorded and asserted
                errors.append(exc)

        task = asyncio.get_running_loop().create_task(extend())
        assert await polled(lambda: all(n.in_flight for n in redlock._core.nodes))
        await redlock.aclose()
        await task
        for front in mutual:
            front.blackhole = False
        assert len(errors) == 1
        assert isinstance(errors[0], RedlockError | RuntimeError), repr(errors[0])
        assert own_tasks() == []
        await no_connection_left(group, mutual)


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
            except BaseException as exc:  # noqa: BLE001 - recorded and asserted
                errors.append(exc)

        task = asyncio.get_running_loop().create_task(acquire())
        assert await polled(lambda: all(front.connections for front in mutual))
        await redlock.aclose()
        await task
        for front in mutual:
            front.blackhole = False
        assert len(errors) == 1
        assert isinstance(errors[0], RedlockError | RuntimeError), repr(errors[0])
        assert own_tasks() == []
        await no_connection_left(group, mutual)


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


@pytest.mark.parametrize("case", ["missing CA file", "wrong ssl_password"])
async def test_a_tls_setting_redis_py_refuses_is_refused_at_construction(
    certs: Certs, encrypted_key: Path, tmp_path: Path, case: str
) -> None:
    """configuration.md (URL parameters): "a value redis-py would refuse ... raise
    ValueError at construction, instead of failing every connection to that master
    later". A CA file that does not exist, or an ``ssl_password`` that does not
    decrypt ``ssl_keyfile``, is refused by redis-py on every connection; today the
    client is built, then each acquisition retries "Error 2 connecting to HOST:PORT.
    No such file or directory." / "[SSL] PEM lib" as an outage until its timeout."""
    query = {
        "missing CA file": {"ssl_ca_certs": tmp_path / "no-such-ca.pem"},
        "wrong ssl_password": {
            "ssl_ca_certs": certs.ca_pem,
            "ssl_certfile": certs.client_pem,
            "ssl_keyfile": encrypted_key,
            "ssl_password": "wrong-pass",
        },
    }[case]
    masters = [f"rediss://127.0.0.1:{port}?{urlencode(query)}" for port in (7001, 7002, 7003)]
    with pytest.raises(ValueError) as refused:
        redlock = AsyncRedlock(masters, timeout=0)
        async with redlock:  # only reached when construction let it through
            with pytest.raises(QuorumUnavailableError) as caught:
                await redlock.lock("tls:setting").acquire()
        pytest.fail(f"built; its acquisition raised: {caught.value}")
    assert "wrong-pass" not in str(refused.value)
