"""Paths that report themselves (log, counters, spans, metrics, lease state,
wait_lost(), loss callbacks), each checked against the docs and the others: a block
exited by another task, a cancelled release or force_release, an extension too late,
a shorter extend, a master at maxclients. SDK providers of the test's own, as in
test_telemetry.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import AsyncExitStack

import anyio
import pytest
from opentelemetry.trace import StatusCode
from redis.asyncio import Redis

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LockLostError,
    LockNotOwnedError,
    QuorumUnavailableError,
)
from asyncredlock.testing import FaultProxy, ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, entered_in_a_task
from .test_telemetry import Telemetry, installed

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    """SDK providers of the test's own, as in test_telemetry."""
    yield from installed(monkeypatch)


def _cause(cause: str) -> frozenset[tuple[str, str]]:
    return frozenset({("asyncredlock.cause", cause)})


def _outcome(outcome: str) -> frozenset[tuple[str, str]]:
    return frozenset({("asyncredlock.outcome", outcome)})


async def test_a_block_exited_elsewhere_after_its_lease_was_lost_does_not_say_released(
    masters: Masters,
) -> None:
    """Lock's docstring: exited by another task, the block raises RuntimeError,
    "having released the lease". A lease already lost (here forced free by this
    client) was not released: the error said "its lease was released" all the same,
    where the block exited in its own task raises LockLostError."""
    async with AsyncRedlock(masters.urls, timeout=0) as redlock:
        lock = redlock.lock("robs-exit-lost")
        with anyio.fail_after(HANG_GUARD):
            async with entered_in_a_task(lock) as lease:
                await redlock.force_release("robs-exit-lost")
                assert lease.lost
                with pytest.raises((RuntimeError, LockLostError)) as raised:
                    await asyncio.create_task(lock.__aexit__(None, None, None))
        message = str(raised.value)
        assert "was released" not in message, (
            f"the lease was lost (forced free), not released, yet the error says: {message!r}"
        )


async def test_a_cancelled_release_finding_the_lock_gone_is_counted_once_as_gone(
    servers: ServerGroup, masters: Masters, otel: Telemetry
) -> None:
    """The cancelled release's outcome, taken in the background: lost once in
    statistics(), resource_statistics(), the lost metric (cause gone), the hold
    metric (lost, not released), one log line, callbacks once; its span cancelled."""
    async with AsyncRedlock(servers.urls) as redlock:
        lease = await redlock.lock("robs-cancelled-release").acquire()
        for client in masters.clients:
            await client.delete("robs-cancelled-release")
        called: list[Lease] = []
        lease.add_lost_callback(called.append)
        releasing = asyncio.get_running_loop().create_task(lease.release())
        await asyncio.sleep(0)
        releasing.cancel()
        with anyio.fail_after(HANG_GUARD):
            await asyncio.wait([releasing])
            assert await lease.wait_lost()
            await redlock.settle()
        await asyncio.sleep(0)
        assert called == [lease]
        assert redlock.statistics().lost == 1
        assert redlock.resource_statistics()["robs-cancelled-release"].lost == 1
    assert otel.points("asyncredlock.lease.lost") == {_cause("gone"): 1}
    assert otel.points("asyncredlock.hold.duration") == {_outcome("lost"): 1}
    (span,) = otel.spans("asyncredlock.release")
    assert dict(span.attributes or {})["asyncredlock.outcome"] == "cancelled"


async def test_a_cancelled_force_release_loses_this_clients_lease_once_as_forced(
    masters: Masters, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    async with AsyncRedlock(masters.urls) as redlock:
        lease = await redlock.lock("robs-forced").acquire()
        called: list[Lease] = []
        lease.add_lost_callback(called.append)
        forcing = asyncio.get_running_loop().create_task(redlock.force_release("robs-forced"))
        await asyncio.sleep(0)
        forcing.cancel()
        with anyio.fail_after(HANG_GUARD):
            await asyncio.wait([forcing])
            assert await lease.wait_lost()
            await redlock.settle()
        await asyncio.sleep(0)
        assert called == [lease]
        assert redlock.statistics().lost == 1
    lost = [r for r in caplog.records if "lost:" in r.getMessage()]
    assert [r.getMessage().split(": ", 1)[1].split(" [")[0] for r in lost] == [
        "forced free (force_release)"
    ]
    assert otel.points("asyncredlock.lease.lost") == {_cause("forced"): 1}
    assert await masters.keys() == [[]] * len(masters)


async def test_a_master_at_maxclients_reports_why_in_outcome_log_and_metric(
    make_servers: MakeServers, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncredlock")
    group = make_servers(1)
    async with Redis.from_url(group.urls[0]) as admin:
        await admin.config_set("maxclients", 1)
        try:
            with anyio.fail_after(HANG_GUARD):
                async with AsyncRedlock(group.urls, node_timeout=0.5, timeout=0) as redlock:
                    with pytest.raises(QuorumUnavailableError) as failed:
                        await redlock.lock("robs-maxclients").acquire()
        finally:
            await admin.config_set("maxclients", 10000)
    errors = otel.points("asyncredlock.master.errors")
    logged = [r.getMessage() for r in caplog.records]
    assert not [line for line in logged if "lost" in line], logged  # nothing held
    assert "max number of clients reached" in str(failed.value)
    assert {dict(k)["error.type"] for k in errors} == {"ConnectionError"}, errors


async def test_a_block_exited_elsewhere_whose_release_finds_it_gone_does_not_say_released(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    """The release made for a block exited from another task finds the lock gone on a
    majority: the lease ends lost ("gone from a majority when released", logged and
    counted), and exited in its own task the block raises LockLostError; exited
    elsewhere the RuntimeError says "its lease was released"."""
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    async with AsyncRedlock(masters.urls, timeout=0) as redlock:
        lock = redlock.lock("robs-exit-gone")
        with anyio.fail_after(HANG_GUARD):
            async with entered_in_a_task(lock) as lease:
                for client in masters.clients:
                    await client.delete("robs-exit-gone")
                with pytest.raises((RuntimeError, LockLostError)) as raised:
                    await asyncio.create_task(lock.__aexit__(None, None, None))
        assert lease.lost
        assert redlock.statistics().lost == 1
    message = str(raised.value)
    assert "was released" not in message, (
        f"the release found the lock gone and the lease lost, yet the error says: {message!r}"
    )


async def test_a_cancelled_release_that_reaches_too_few_masters_is_logged(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture
) -> None:
    """errors.md's log table: "a release that reached too few masters, where no
    exception can tell anyone: [...] in background releases" is a WARNING. A cancelled
    release() goes on in the background (usage.md); its caller got CancelledError, which
    tells nothing of the release: its short outcome should be logged as the others."""
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    group = make_servers(3)
    async with AsyncExitStack() as stack:
        proxies = [await stack.enter_async_context(FaultProxy("127.0.0.1", s.port)) for s in group]
        redlock = await stack.enter_async_context(
            AsyncRedlock([p.url for p in proxies], node_timeout=0.2, socket_timeout=0.5)
        )
        lease = await redlock.lock("robs-short-release").acquire()
        # acquire() returns at a quorum: a third SET may still be in a proxy, which the
        # reset below would drop. inspect() reads every master after it, in order.
        state = await redlock.inspect("robs-short-release")
        assert [node.holder for node in state.nodes] == [lease.value] * 3
        for proxy in proxies[:2]:
            proxy.refuse = True
            proxy.reset_connections()
        releasing = asyncio.get_running_loop().create_task(lease.release())
        await asyncio.sleep(0)
        releasing.cancel()
        with anyio.fail_after(HANG_GUARD):
            await asyncio.wait([releasing])
            assert not await lease.wait_lost()  # the outcome is known: not lost
            for server in list(group)[:2]:  # the release did not reach them: still there
                async with Redis(port=server.port) as direct:
                    assert await direct.exists("robs-short-release") == 1
    short = [r for r in caplog.records if "released on too few masters" in r.getMessage()]
    assert short, [r.getMessage() for r in caplog.records]


async def test_an_extension_confirmed_after_the_expiry_it_set_reports_late_everywhere(
    make_servers: MakeServers, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """Guard (end to end, where test_telemetry checks the mapping alone): extend()
    whose quorum answers after start + ttl - drift: LockNotOwnedError "too late", one
    failed extension (client and lease), one loss logged with the LATE reason, the
    lost metric's cause ``expired``, the extend span ``expired`` (ERROR), the hold
    ``lost``, wait_lost() True and the callback once."""
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    group = make_servers(3)
    async with AsyncExitStack() as stack:
        proxies = [await stack.enter_async_context(FaultProxy("127.0.0.1", s.port)) for s in group]
        redlock = await stack.enter_async_context(
            AsyncRedlock([p.url for p in proxies], node_timeout=2, socket_timeout=5)
        )
        lease = await redlock.lock("robs-late", ttl=0.5, auto_extend=False).acquire()
        called: list[Lease] = []
        lease.add_lost_callback(called.append)
        for proxy in proxies:
            proxy.delay = 0.3  # the replies come 0.6 s after the round: past 0.5 s - drift
        with anyio.fail_after(HANG_GUARD), pytest.raises(LockNotOwnedError) as late:
            await lease.extend()
        assert "too late" in str(late.value), str(late.value)
        with anyio.fail_after(HANG_GUARD):
            assert await lease.wait_lost()
        await asyncio.sleep(0)
        assert called == [lease]
        stats = redlock.statistics()
        assert (stats.failed_extensions, stats.lost) == (1, 1)
        assert lease.statistics().failed_extensions == 1
    warnings = [r.getMessage() for r in caplog.records]
    assert any("(too late: confirmed only after the expiry it set)" in w for w in warnings)
    assert next(w for w in warnings if "lost:" in w).startswith(
        "lease on 'robs-late' lost: extended too late: a quorum confirmed it only after"
    )
    assert otel.points("asyncredlock.lease.lost") == {_cause("expired"): 1}
    assert otel.points("asyncredlock.hold.duration") == {_outcome("lost"): 1}
    (span,) = otel.spans("asyncredlock.extend")
    assert dict(span.attributes or {})["asyncredlock.outcome"] == "expired"
    assert span.status.status_code is StatusCode.ERROR


async def test_a_shorter_extend_whose_cut_validity_runs_out_is_one_loss(
    make_servers: MakeServers, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """Guard: extend(ttl=0.2) of a lease with ~10 s left, masters 0.3 s away each way.
    The validity is cut as the round goes out; the automatic extension, due by the cut,
    ends the lease lost when it runs out (one loss: expired), and extend() then finds
    it ended: LockNotOwnedError, no failed extension counted or logged, span expired."""
    caplog.set_level(logging.INFO, logger="asyncredlock")
    group = make_servers(3)
    async with AsyncExitStack() as stack:
        proxies = [await stack.enter_async_context(FaultProxy("127.0.0.1", s.port)) for s in group]
        redlock = await stack.enter_async_context(
            AsyncRedlock([p.url for p in proxies], node_timeout=2, socket_timeout=5)
        )
        lease = await redlock.lock("robs-cut", ttl=10).acquire()
        called: list[Lease] = []
        lease.add_lost_callback(called.append)
        for proxy in proxies:
            proxy.delay = 0.3
        with anyio.fail_after(HANG_GUARD), pytest.raises(LockNotOwnedError) as failed:
            await lease.extend(ttl=0.2)
        with anyio.fail_after(HANG_GUARD):
            assert await lease.wait_lost()
        await asyncio.sleep(0)
        stats = redlock.statistics()
        assert called == [lease]
        assert (stats.failed_extensions, stats.lost) == (0, 1)
        assert lease.statistics().failed_extensions == 0
    assert "no longer held" in str(failed.value), str(failed.value)
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert [line.split(" [")[0] for line in logged] == [
        "lease on 'robs-cut' lost: not extended before its validity ran out"
    ], logged
    assert otel.points("asyncredlock.lease.lost") == {_cause("expired"): 1}
    (span,) = otel.spans("asyncredlock.extend")
    assert dict(span.attributes or {})["asyncredlock.outcome"] == "expired"


async def test_a_force_release_whose_deletes_land_unanswered_leaves_no_second_holder(
    make_servers: MakeServers,
) -> None:
    """force_release() cancelled takes this client's leases as lost at once ("its
    deletes were sent, so the leases are as good as gone", _operator.lose_leases). Not
    cancelled but undecided in time (two of three masters answer after
    max(node_timeout, socket_timeout)), it raises QuorumUnavailableError and leaves them
    held, extending themselves, though its deletes landed everywhere: a rival takes
    the lock while this client's lease still says held, with ~10 s of validity."""
    group = make_servers(3)
    async with AsyncExitStack() as stack:
        proxies = [await stack.enter_async_context(FaultProxy("127.0.0.1", s.port)) for s in group]
        redlock = await stack.enter_async_context(
            AsyncRedlock([p.url for p in proxies], node_timeout=0.2, socket_timeout=0.3)
        )
        rival = await stack.enter_async_context(AsyncRedlock(group.urls, timeout=0))
        lease = await redlock.lock("robs-forced-late", ttl=10).acquire()
        for proxy in proxies[:2]:
            proxy.delay = 0.25  # each delete lands 0.25 s later, its reply 0.5 s later
        with anyio.fail_after(HANG_GUARD):
            with pytest.raises(QuorumUnavailableError):
                await redlock.force_release("robs-forced-late")
            # the deletes land: the rival gets it (retrying until then, if need be)
            taken = await rival.lock("robs-forced-late", timeout=3).acquire()
        assert not (lease.held and taken.held), (
            f"two holders: this client's lease says held ({lease.validity:.1f} s left)"
            " after its own force_release() deleted the key (a rival holds it on a majority)"
        )
