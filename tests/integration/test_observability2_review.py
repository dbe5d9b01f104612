"""Review of what the library reports (log, statistics(), OpenTelemetry) on the paths
added lately: a block whose entering task ended (kept held, with a WARNING), round
deadlines that look again in a busy loop, the cap an extension round sent later puts
on an earlier one, and semaphores and read-write locks against docs/observability.md.

The OpenTelemetry SDK is the test's own (test_telemetry.py's ``installed``): spans and
metric points are read back from its in-memory exporters. (The review's test of a
lease capped at its max_hold whose validity a failed shorter extension cut is in
test_extend_capped.py, with its fix.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import anyio
import pytest

from asyncredlock import (
    AsyncRedlock,
    HoldLimitError,
    Lease,
    Lock,
    LockNotOwnedError,
    LockTimeoutError,
)
from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters
from .test_telemetry import Telemetry, attrs, cause, installed, outcome

pytestmark = pytest.mark.anyio

HANG_GUARD = 20  # seconds; only stops a hung test, never decides an outcome
ACQUIRE, EXTEND, RELEASE = "asyncredlock.acquire", "asyncredlock.extend", "asyncredlock.release"
HOLD, LOST = "asyncredlock.hold.duration", "asyncredlock.lease.lost"


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    yield from installed(monkeypatch)


def _warnings(caplog: pytest.LogCaptureFixture, resource: str, text: str) -> list[str]:
    """The WARNINGs about ``resource`` whose message holds ``text``."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING
        and getattr(record, "resource", None) == resource
        and text in record.getMessage()
    ]


ORPHANED = "open (e.g. an async generator suspended inside it)"


# -- (1) a block whose entering task ended ------------------------------------------


async def _rows(lock: Lock, leases: list[Lease]) -> AsyncIterator[int]:
    async with lock as lease:
        leases.append(lease)
        yield 1
        yield 2


async def _nested(first: Lock, second: Lock, leases: list[Lease]) -> AsyncIterator[int]:
    async with first as one, second as two:
        leases.extend((one, two))
        yield 1


async def _step_in_a_task(agen: AsyncIterator[int]) -> int:
    """One step of ``agen`` in a task of its own, which then ends."""

    async def step() -> int:
        return await anext(agen)

    task = asyncio.get_running_loop().create_task(step())
    result = await task
    ended = anyio.Event()
    task.add_done_callback(lambda _: ended.set())  # runs after the ones added before
    await ended.wait()
    return result


async def _close_elsewhere(agen: Any) -> BaseException | None:
    """Close ``agen`` from a new task; the exception the close raised."""
    closing = asyncio.get_running_loop().create_task(agen.aclose())
    with anyio.fail_after(HANG_GUARD):
        await asyncio.wait([closing])
    return closing.exception()


async def test_an_orphaned_block_warns_once_and_its_exit_is_one_release(
    masters: Masters, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """The WARNING names the resource (extra field) and the lock (its repr), once (a
    second task ending inside the block adds none); the lease is neither lost nor
    released meanwhile; the exit from another task is one release
    round (span ``ok``, hold ``released``), no loss, no other WARNING."""
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    name = "robs2-orphan"
    async with AsyncRedlock(masters.urls, ttl=0.5) as redlock:
        lock = redlock.lock(name)
        leases: list[Lease] = []
        agen = _rows(lock, leases)
        assert await _step_in_a_task(agen) == 1
        (lease,) = leases
        (warning,) = _warnings(caplog, name, ORPHANED)
        assert repr(lock) in warning
        assert await _step_in_a_task(agen) == 2  # still inside: a second task ends there
        assert len(_warnings(caplog, name, ORPHANED)) == 1
        stats = redlock.statistics()
        assert (stats.held, stats.lost, stats.releases) == (1, 0, 0)
        error = await _close_elsewhere(agen)
        assert isinstance(error, RuntimeError)
        await redlock.settle()
        stats = redlock.statistics()
        assert (stats.held, stats.lost, stats.releases) == (0, 0, 1)
        assert redlock.resource_statistics()[name].lost == 0
    (release,) = otel.spans(RELEASE)
    assert attrs(release)["asyncredlock.outcome"] == "ok"
    assert otel.points(HOLD) == {outcome("released"): 1}
    assert otel.points(LOST) == {}
    others = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and getattr(r, "resource", None) == name
    ]
    assert len(others) == 1, [r.getMessage() for r in others]
    assert not lease.held


async def test_each_orphaned_block_warns_once_naming_its_own_lock(
    masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    """Two blocks open in one generator (two locks): one WARNING each, each naming
    its lock; stepping the generator again from another task adds none."""
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    async with AsyncRedlock(masters.urls, ttl=0.5) as redlock:
        first, second = redlock.lock("robs2-nest-a"), redlock.semaphore("robs2-nest-b", 2)
        leases: list[Lease] = []
        agen = _nested(first, second, leases)
        assert await _step_in_a_task(agen) == 1
        (one,) = _warnings(caplog, "robs2-nest-a", ORPHANED)
        (two,) = _warnings(caplog, "robs2-nest-b", ORPHANED)
        assert repr(first) in one
        assert repr(second) in two
        assert "<Semaphore 'robs2-nest-b' limit=2" in two
        with pytest.raises(RuntimeError, match="another task"):  # both exit in another
            await _step_in_a_task(agen)
        await redlock.settle()
        assert len(_warnings(caplog, "robs2-nest-a", ORPHANED)) == 1
        assert len(_warnings(caplog, "robs2-nest-b", ORPHANED)) == 1
        assert [lease.held for lease in leases] == [False, False]
        assert redlock.statistics().releases == 2
    assert await masters.keys() == [[]] * len(masters)


async def test_an_orphaned_block_ended_by_max_hold_is_one_loss_then_no_release(
    masters: Masters, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """max_hold ends the kept lease: one loss (cause ``max_hold``, hold ``lost``, the
    log's reason); the block's later exit from another task raises RuntimeError from
    HoldLimitError and adds no release round, no second loss."""
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    name = "robs2-orphan-bound"
    async with AsyncRedlock(masters.urls, ttl=0.3) as redlock:
        leases: list[Lease] = []
        agen = _rows(redlock.lock(name, max_hold=0.6), leases)
        assert await _step_in_a_task(agen) == 1
        (lease,) = leases
        with anyio.fail_after(HANG_GUARD):
            assert await lease.wait_lost()
        error = await _close_elsewhere(agen)
        assert isinstance(error, RuntimeError)
        assert "its lease was lost" in str(error)
        assert isinstance(error.__cause__, HoldLimitError)
        await redlock.settle()
        stats = redlock.statistics()
        assert (stats.held, stats.lost, stats.releases) == (0, 1, 0)
        assert redlock.resource_statistics()[name].lost == 1
    assert len(_warnings(caplog, name, "lost: held for its max_hold")) == 1
    assert len(_warnings(caplog, name, ORPHANED)) == 1
    assert otel.spans(RELEASE) == []
    assert otel.points(LOST) == {cause("max_hold"): 1}
    assert otel.points(HOLD) == {outcome("lost"): 1}
    assert await masters.keys() == [[]] * len(masters)


# -- (4) semaphores and read-write locks, as plain locks ------------------------------


async def test_a_semaphore_cycle_has_a_locks_spans_metrics_and_counters(
    masters: Masters, otel: Telemetry
) -> None:
    name = "robs2-sem"
    async with AsyncRedlock(masters.urls) as redlock:
        semaphore = redlock.semaphore(name, 2)
        with otel.tracer.start_as_current_span("request") as request:
            lease = await semaphore.acquire()
            await lease.extend()
            await lease.release()
        stats, mine = redlock.statistics(), semaphore.statistics()
        per_resource = redlock.resource_statistics()[name]
    quorum = len(masters) // 2 + 1
    (acquire,) = otel.spans(ACQUIRE)
    (extend,) = otel.spans(EXTEND)
    (release,) = otel.spans(RELEASE)
    assert quorum <= attrs(acquire)["asyncredlock.masters.granted"] <= len(masters)
    assert attrs(acquire) | {"asyncredlock.masters.granted": 0} == {
        "asyncredlock.resource": name,
        "asyncredlock.attempts": 1,
        "asyncredlock.masters.granted": 0,
        "asyncredlock.outcome": "acquired",
        "asyncredlock.source": "attempt",
    }
    for span in (extend, release):
        assert attrs(span)["asyncredlock.resource"] == name
        assert attrs(span)["asyncredlock.outcome"] == "ok"
        assert quorum <= attrs(span)["asyncredlock.masters.granted"]
    for span in (acquire, extend, release):
        assert span.parent is not None
        assert span.parent.span_id == request.get_span_context().span_id
    assert otel.points("asyncredlock.acquire.duration") == {outcome("acquired"): 1}
    assert otel.points(HOLD) == {outcome("released"): 1}
    assert (stats.attempts, stats.acquisitions, stats.extensions, stats.releases) == (1, 1, 1, 1)
    assert (mine.acquisitions, mine.attempts, mine.timeouts) == (1, 1, 0)
    assert (per_resource.acquisitions, per_resource.hold.count) == (1, 1)


async def test_a_semaphore_timeout_and_loss_are_counted_as_a_locks(
    masters: Masters, otel: Telemetry
) -> None:
    name = "robs2-sem-lost"
    async with AsyncRedlock(masters.urls) as redlock:
        semaphore = redlock.semaphore(name, 1)
        with otel.tracer.start_as_current_span("holder"):
            lease = await semaphore.acquire()
            with pytest.raises(LockTimeoutError):
                await redlock.semaphore(name, 1, timeout=0).acquire()
            # acquire() returned at a quorum: a SET still out could land after the
            # DELETE below; settle() waits for every call still out
            await redlock.settle()
            assert await masters.holding(lease.key) == len(masters)
            for client in masters.clients:
                await client.delete(lease.key)
            with pytest.raises(LockNotOwnedError):
                await lease.extend()
        stats = redlock.statistics()
        per_resource = redlock.resource_statistics()[name]
    assert (stats.timeouts, stats.lost, stats.failed_extensions) == (1, 1, 1)
    assert (per_resource.timeouts, per_resource.lost) == (1, 1)
    (timed_out,) = [s for s in otel.spans(ACQUIRE) if s.status.is_ok is False]
    assert attrs(timed_out)["asyncredlock.outcome"] == "timeout"
    assert attrs(timed_out)["error.type"] == "LockTimeoutError"
    (holder,) = otel.spans("holder")
    (event,) = [e for e in holder.events if e.name == "asyncredlock.lease.lost"]
    assert dict(event.attributes or {}) == {
        "asyncredlock.resource": name,
        "asyncredlock.reason": "a majority of masters no longer hold it",
        "asyncredlock.cause": "gone",
    }
    (extend,) = otel.spans(EXTEND)
    assert attrs(extend)["asyncredlock.outcome"] == "not-held"
    assert otel.points(LOST) == {cause("gone"): 1}
    assert otel.points(HOLD) == {outcome("lost"): 1}


async def test_read_and_write_leases_have_a_locks_spans_metrics_and_counters(
    masters: Masters, otel: Telemetry
) -> None:
    name = "robs2-rw"
    async with AsyncRedlock(masters.urls) as redlock:
        rw = redlock.rwlock(name)
        with otel.tracer.start_as_current_span("request"):
            async with rw.read() as reader:
                await reader.extend()
            async with rw.write(fencing=True) as writer:
                await writer.extend()
        stats, sides = redlock.statistics(), rw.statistics()
    acquires = otel.spans(ACQUIRE)
    assert [attrs(s)["asyncredlock.outcome"] for s in acquires] == ["acquired"] * 2
    assert [attrs(s)["asyncredlock.resource"] for s in acquires] == [name] * 2
    assert "asyncredlock.fencing_token" not in attrs(acquires[0])
    assert attrs(acquires[1])["asyncredlock.fencing_token"] == writer.token
    for span in otel.spans(EXTEND) + otel.spans(RELEASE):
        assert attrs(span)["asyncredlock.outcome"] == "ok"
    assert len(otel.spans(EXTEND)) == len(otel.spans(RELEASE)) == 2
    assert otel.points(HOLD) == {outcome("released"): 2}
    assert (stats.acquisitions, stats.extensions, stats.releases, stats.lost) == (2, 2, 2, 0)
    assert (sides.read.acquisitions, sides.write.acquisitions) == (1, 1)


async def test_a_forced_reader_is_a_loss_with_cause_forced(
    masters: Masters, otel: Telemetry
) -> None:
    name = "robs2-rw-forced"
    async with AsyncRedlock(masters.urls) as redlock:
        with otel.tracer.start_as_current_span("holder"):
            reader = await redlock.rwlock(name).read().acquire()
            await redlock.force_release(name)
        assert reader.lost
        assert redlock.statistics().lost == 1
    (holder,) = otel.spans("holder")
    (event,) = [e for e in holder.events if e.name == "asyncredlock.lease.lost"]
    assert dict(event.attributes or {})["asyncredlock.cause"] == "forced"
    assert otel.points(LOST) == {cause("forced"): 1}
    assert otel.points(HOLD) == {outcome("lost"): 1}


# -- (2) round deadlines that look again ---------------------------------------------


@contextlib.contextmanager
def _thawed_in_a_busy_poll(group: ServerGroup) -> Iterator[Callable[[], None]]:
    """A function that makes the loop's next poll run, among its I/O callbacks (a
    reader's), the thaw of ``group``'s frozen masters and then a blocking call (0.4
    s): their replies to what was sent while they were frozen arrive during it,
    after that poll, unread when the loop's timers run (first, on uvloop)."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)

    def busy() -> None:
        ours.recv(1)
        for server in group:
            server.resume()
        time.sleep(0.4)

    def poke() -> None:
        loop.call_soon(theirs.send, b"x")

    loop.add_reader(ours.fileno(), busy)
    try:
        yield poke
    finally:
        loop.remove_reader(ours.fileno())
        ours.close()
        theirs.close()
        for server in group:
            if server.paused:
                server.resume()


async def test_a_round_whose_replies_sat_unread_in_a_busy_loop_is_no_failure(
    make_servers: MakeServers, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """An extension round is sent to frozen masters; the loop then thaws them and stays
    busy past the round's deadline and ``node_timeout`` while their replies arrive:
    the deadline, run late, looks again and the round succeeds. No failed extension
    is counted or logged, its span is ``ok``; no master is counted silent."""
    caplog.set_level(logging.DEBUG, logger="asyncredlock")
    group = make_servers(3)
    async with AsyncRedlock(group.urls, node_timeout=0.05, socket_timeout=0.1) as redlock:
        lease = await redlock.lock("robs2-busy", ttl=5, auto_extend=False).acquire()
        with _thawed_in_a_busy_poll(group) as busy:
            for server in group:
                server.pause()
            await _sent_then(lease.extend(), busy)
        stats = redlock.statistics()
        assert (stats.extensions, stats.failed_extensions) == (1, 0)
        await lease.release()
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert failed == []
    (extend,) = otel.spans(EXTEND)
    assert attrs(extend)["asyncredlock.outcome"] == "ok"
    assert otel.points("asyncredlock.master.timeouts") == {}


async def test_an_attempt_whose_replies_sat_unread_in_a_busy_loop_takes_the_lock(
    make_servers: MakeServers, otel: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """The same for an acquisition round (whose masters, once silent for
    ``node_timeout``, are given up on): its one attempt takes the lock."""
    caplog.set_level(logging.DEBUG, logger="asyncredlock")
    group = make_servers(3)
    async with AsyncRedlock(group.urls, node_timeout=0.05, socket_timeout=0.1) as redlock:
        await (await redlock.lock("robs2-warm").acquire()).release()  # connections open
        with _thawed_in_a_busy_poll(group) as busy:
            for server in group:
                server.pause()
            lease = await _sent_then(redlock.lock("robs2-busy-acquire", timeout=0).acquire(), busy)
        stats = redlock.statistics()
        assert (stats.attempts, stats.acquisitions, stats.failed_attempts) == (2, 2, 0)
        await lease.release()
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert failed == []
    spans = otel.spans(ACQUIRE)
    assert [attrs(s)["asyncredlock.outcome"] for s in spans] == ["acquired"] * 2
    assert otel.points("asyncredlock.master.timeouts") == {}


T = TypeVar("T")


async def _sent_then(call: Coroutine[Any, Any, T], then: Callable[[], None]) -> T:
    """Run ``call`` in a task, ``then()`` right after its first step (its round sent)."""
    task = asyncio.get_running_loop().create_task(call)
    then()
    with anyio.fail_after(HANG_GUARD):
        return await task


# -- (3) the cap a later round puts on an earlier one ---------------------------------


async def test_a_longer_round_confirmed_before_a_shorter_one_sent_after_it_is_capped(
    masters: Masters, otel: Telemetry
) -> None:
    """extend(ttl=30) and, while it is out, extend(ttl=6): the masters keep the later
    PX, so the validity, the TTL and the next automatic extension go by 6 s; both are
    successful extensions with ``ok`` spans. (An automatic extension, due a third of
    the TTL later, may add an ``ok`` span of its own on a slow machine: with a TTL of
    2 s one did, in CI.)"""
    async with AsyncRedlock(masters.urls) as redlock:
        lease = await redlock.lock("robs2-cap", ttl=10).acquire()
        with anyio.fail_after(HANG_GUARD):  # (sent in this order: gather's tasks run so)
            await asyncio.gather(lease.extend(30), lease.extend(6))
        assert lease.validity <= 6
        assert lease.ttl == 6
        assert lease.statistics().extensions == 2
        pttls = [await client.pttl(lease.key) for client in masters.clients]
        assert all(0 < pttl <= 6000 for pttl in pttls), pttls
        await lease.release()
    outcomes = [attrs(s)["asyncredlock.outcome"] for s in otel.spans(EXTEND)]
    assert outcomes[:2] == ["ok", "ok"], outcomes
    assert set(outcomes) == {"ok"}, outcomes
