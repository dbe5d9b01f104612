"""OpenTelemetry: the spans and metric points of lock cycles, read back from the SDK's
in-memory exporters, and the library working with the API alone, with an older API, or
without it.

Each test gets SDK providers of its own, installed in asyncredlock's telemetry module
for the test only (the process-wide providers are never set: other tests run as
without an SDK)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack
from typing import Any

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LockNotOwnedError,
    LockTimeoutError,
    QuorumUnavailableError,
    _telemetry,
)
from asyncredlock._keeping import BOUND, EXPIRED, GONE, LATE
from asyncredlock.testing import FaultProxy, ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Heard, Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


class _Spans(SpanExporter):
    """Keeps the spans ended; sets ``awaited`` once ``until`` of them are named
    ``name``."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self.awaited: tuple[str, int, anyio.Event] | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        if self.awaited is not None:
            name, until, event = self.awaited
            if len(self.named(name)) >= until:
                event.set()
        return SpanExportResult.SUCCESS

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans if span.name == name]


class Telemetry:
    """The test's SDK: its tracer (for the test's own spans), what was exported,
    and the metric points so far."""

    def __init__(self) -> None:
        self.exporter = _Spans()
        self.reader = InMemoryMetricReader()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("test")

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], float]:
        """Each attribute set's value of metric ``name`` (histograms: how many)."""
        found: dict[frozenset[tuple[str, Any]], float] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if scope.scope.name != "asyncredlock" or metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        value = getattr(point, "count", None)
                        value = getattr(point, "value", value)
                        found[frozenset((point.attributes or {}).items())] = value
        return {attributes: value for attributes, value in found.items() if value}

    def spans(self, name: str) -> list[ReadableSpan]:
        return self.exporter.named(name)

    async def wait_spans(self, name: str, count: int) -> None:
        """Until ``count`` spans named ``name`` have ended (a span ends, and is
        exported, on the event loop's thread: `SimpleSpanProcessor`)."""
        event = anyio.Event()
        self.exporter.awaited = (name, count, event)
        try:
            if len(self.spans(name)) < count:
                await event.wait()
        finally:
            self.exporter.awaited = None


_INSTRUMENTS = ("_TRACER", "_ACQUIRE", "_HOLD", "_LOST", "_ERRORS", "_SILENT")


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    """SDK providers of the test's own, in asyncredlock's telemetry for the test."""
    yield from installed(monkeypatch)


def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    """A `Telemetry` installed in asyncredlock's telemetry module until it is resumed
    (the body of an ``otel`` fixture)."""
    sdk = Telemetry()
    made = _telemetry._instruments(sdk.tracer_provider, sdk.meter_provider)
    for name, instrument in zip(_INSTRUMENTS, made, strict=True):
        monkeypatch.setattr(_telemetry, name, instrument)
    yield sdk
    sdk.tracer_provider.shutdown()
    sdk.meter_provider.shutdown()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def outcome(value: str) -> frozenset[tuple[str, Any]]:
    return frozenset({("asyncredlock.outcome", value)})


def cause(value: str) -> frozenset[tuple[str, Any]]:
    return frozenset({("asyncredlock.cause", value)})


class TestSpans:
    async def test_a_fenced_cycle_gives_acquire_extend_release_under_the_caller(
        self, servers: ServerGroup, otel: Telemetry
    ) -> None:
        tracer = otel.tracer
        async with AsyncRedlock(servers.urls) as redlock:
            with tracer.start_as_current_span("request") as request:
                lease = await redlock.lock("otel:cycle", fencing=True).acquire()
                await lease.extend()
                await lease.release()
        (acquire,) = otel.spans("asyncredlock.acquire")
        (extend,) = otel.spans("asyncredlock.extend")
        (release,) = otel.spans("asyncredlock.release")
        quorum = len(servers.urls) // 2 + 1
        # the masters that had granted when the quorum decided the round
        for span in (acquire, extend, release):
            assert quorum <= attrs(span)["asyncredlock.masters.granted"] <= len(servers.urls)
        assert attrs(acquire) | {"asyncredlock.masters.granted": 0} == {
            "asyncredlock.resource": "otel:cycle",
            "asyncredlock.attempts": 1,
            "asyncredlock.masters.granted": 0,
            "asyncredlock.outcome": "acquired",
            "asyncredlock.source": "attempt",
            "asyncredlock.fencing_token": lease.token,
        }
        for span in (extend, release):
            assert attrs(span) | {"asyncredlock.masters.granted": 0} == {
                "asyncredlock.resource": "otel:cycle",
                "asyncredlock.outcome": "ok",
                "asyncredlock.masters.granted": 0,
                "asyncredlock.fencing_token": lease.token,
            }
        request_id = request.get_span_context().span_id
        for span in (acquire, extend, release):
            assert span.parent is not None
            assert span.parent.span_id == request_id
            assert span.kind is trace.SpanKind.INTERNAL
            assert span.status.status_code is StatusCode.UNSET
        assert otel.points("asyncredlock.acquire.duration") == {outcome("acquired"): 1}
        assert otel.points("asyncredlock.hold.duration") == {outcome("released"): 1}

    async def test_automatic_extensions_are_children_of_the_acquirers_span(
        self, servers: ServerGroup, otel: Telemetry
    ) -> None:
        tracer = otel.tracer
        async with AsyncRedlock(servers.urls) as redlock:
            with tracer.start_as_current_span("job") as job:
                lease = await redlock.lock("otel:auto", ttl=0.3).acquire()
            with anyio.fail_after(HANG_GUARD):
                await otel.wait_spans("asyncredlock.extend", 2)
            await lease.release()
        extensions = otel.spans("asyncredlock.extend")
        assert len(extensions) >= 2
        job_id = job.get_span_context().span_id
        assert all(s.parent is not None and s.parent.span_id == job_id for s in extensions)
        assert {attrs(s)["asyncredlock.outcome"] for s in extensions} == {"ok"}

    async def test_a_timeout_is_an_error_span_with_its_attempts(
        self, servers: ServerGroup, otel: Telemetry
    ) -> None:
        async with AsyncRedlock(servers.urls) as holder, AsyncRedlock(servers.urls) as other:
            lease = await holder.lock("otel:busy").acquire()
            with pytest.raises(LockTimeoutError):
                await other.lock("otel:busy", timeout=0).acquire()
            await lease.release()
        failed = [s for s in otel.spans("asyncredlock.acquire") if s.status.is_ok is False]
        (span,) = failed
        assert span.status.status_code is StatusCode.ERROR
        assert attrs(span)["asyncredlock.outcome"] == "timeout"
        assert attrs(span)["error.type"] == "LockTimeoutError"
        assert attrs(span)["asyncredlock.attempts"] == 1
        assert attrs(span)["asyncredlock.masters.granted"] == 0
        assert otel.points("asyncredlock.acquire.duration") == {
            outcome("acquired"): 1,
            outcome("timeout"): 1,
        }

    async def test_a_cancelled_acquire_ends_its_span_without_error(
        self, servers: ServerGroup, otel: Telemetry
    ) -> None:
        async with AsyncRedlock(servers.urls) as holder, AsyncRedlock(servers.urls) as other:
            lease = await holder.lock("otel:cancel").acquire()
            with anyio.move_on_after(0.2):  # cancels the wait; the outcome is counted
                await other.lock("otel:cancel", timeout=60).acquire()
            await lease.release()
        (cancelled,) = [
            s
            for s in otel.spans("asyncredlock.acquire")
            if attrs(s)["asyncredlock.outcome"] == "cancelled"
        ]
        assert cancelled.status.status_code is StatusCode.UNSET
        assert cancelled.end_time is not None
        assert otel.points("asyncredlock.acquire.duration")[outcome("cancelled")] == 1

    async def test_a_round_neither_refuted_nor_an_outage_is_unavailable(
        self, make_servers: MakeServers, otel: Telemetry
    ) -> None:
        """Of three masters one answers *not held* (restarted empty), one fails: no
        quorum, not refuted (extend() and release() raise QuorumUnavailableError, the
        lease is not lost), and their spans say so: `unavailable`, not `not-held`."""
        group = make_servers(3)
        direct = Masters(group.urls)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(direct.aclose)
            proxies = [
                await stack.enter_async_context(FaultProxy("127.0.0.1", s.port)) for s in group
            ]
            redlock = await stack.enter_async_context(AsyncRedlock([p.url for p in proxies]))
            lease = await redlock.lock("otel:minority", ttl=30, auto_extend=False).acquire()
            # acquire() returns at a quorum: a SET may still be in a proxy, and land after
            # the delete below. inspect() reads every master after it, in order.
            state = await redlock.inspect("otel:minority")
            assert [node.holder for node in state.nodes] == [lease.value] * 3
            await direct.clients[0].delete("otel:minority")
            proxies[1].refuse = True
            proxies[1].reset_connections()
            with anyio.fail_after(HANG_GUARD):
                with pytest.raises(QuorumUnavailableError):
                    await lease.extend()
                with pytest.raises(QuorumUnavailableError):
                    await lease.release()
            assert not lease.lost
            proxies[1].refuse = False
            await redlock.settle()
        spans = otel.spans("asyncredlock.extend") + otel.spans("asyncredlock.release")
        assert [attrs(span)["asyncredlock.outcome"] for span in spans] == ["unavailable"] * 2


class TestLoss:
    async def test_a_lost_lease_is_an_event_on_the_holders_span_and_counted(
        self, servers: ServerGroup, masters: Masters, otel: Telemetry
    ) -> None:
        tracer = otel.tracer
        async with AsyncRedlock(servers.urls) as redlock:
            with tracer.start_as_current_span("holder"):
                lease = await redlock.lock("otel:lost", fencing=True).acquire()
                for client in masters.clients:
                    await client.delete(lease.key)
                with pytest.raises(LockNotOwnedError):
                    await lease.extend()
        (holder,) = otel.spans("holder")
        (event,) = [e for e in holder.events if e.name == "asyncredlock.lease.lost"]
        assert dict(event.attributes or {}) == {
            "asyncredlock.resource": "otel:lost",
            "asyncredlock.reason": "a majority of masters no longer hold it",
            "asyncredlock.cause": "gone",
            "asyncredlock.fencing_token": lease.token,
        }
        (extend,) = otel.spans("asyncredlock.extend")
        assert attrs(extend)["asyncredlock.outcome"] == "not-held"
        assert attrs(extend)["asyncredlock.masters.granted"] == 0
        assert extend.status.status_code is StatusCode.ERROR
        assert attrs(extend)["error.type"] == "RoundFailedError"
        assert otel.points("asyncredlock.lease.lost") == {cause("gone"): 1}
        assert otel.points("asyncredlock.hold.duration") == {outcome("lost"): 1}

    async def test_closing_with_a_lease_held_counts_it_lost_as_closed(
        self, servers: ServerGroup, otel: Telemetry
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            await redlock.lock("otel:closed").acquire()
        assert otel.points("asyncredlock.lease.lost") == {cause("closed"): 1}

    async def test_a_lease_at_its_max_hold_counts_lost_as_max_hold(
        self, servers: ServerGroup, otel: Telemetry
    ) -> None:
        async with AsyncRedlock(servers.urls) as redlock:
            lease = await redlock.lock("otel:bound", ttl=0.3, max_hold=0.4).acquire()
            with anyio.fail_after(10):
                assert await lease.wait_lost()
        assert otel.points("asyncredlock.lease.lost") == {cause("max_hold"): 1}
        assert otel.points("asyncredlock.hold.duration") == {outcome("lost"): 1}


class TestHandOff:
    async def test_a_lease_passed_on_in_process_is_traced_under_its_new_holder(
        self, servers: ServerGroup, otel: Telemetry
    ) -> None:
        """B waits behind A in the same client; A's release passes the lease on with
        no call to the masters: B's acquire span says so (0 attempts), and the
        extension of B's lease is B's, not A's."""
        async with AsyncRedlock(servers.urls) as redlock:
            lock = redlock.lock("otel:handoff", ttl=0.3)
            with otel.tracer.start_as_current_span("a"):
                first = await lock.acquire()
            got: list[Lease] = []
            with anyio.fail_after(HANG_GUARD), Waits(redlock) as waits:
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        with otel.tracer.start_as_current_span("b"):
                            got.append(await lock.acquire())

                    tg.start_soon(take)
                    await waits.reach(queued=1)  # B waits behind A in this client
                    with otel.tracer.start_as_current_span("a-release"):
                        await first.release()
                await otel.wait_spans("asyncredlock.extend", 1)  # B's lease's own
            await got[0].release()
        handed = [
            s
            for s in otel.spans("asyncredlock.acquire")
            if attrs(s)["asyncredlock.source"] == "hand-off"
        ]
        (handed_span,) = handed
        assert attrs(handed_span)["asyncredlock.attempts"] == 0
        (b,) = otel.spans("b")
        (a_release,) = otel.spans("a-release")
        for extension in otel.spans("asyncredlock.extend"):
            assert extension.parent is not None
            assert extension.parent.span_id == b.context.span_id
            assert extension.parent.span_id != a_release.context.span_id


class TestMasters:
    async def test_a_silent_master_and_a_failing_one_are_counted_by_name(
        self, make_servers: MakeServers, otel: Telemetry
    ) -> None:
        group = make_servers(3)
        silent = anyio.Event()
        handler = Heard(f"master {group.urls[1]} silent", silent)
        logging.getLogger("asyncredlock").addHandler(handler)
        async with AsyncRedlock(group.urls, node_timeout=0.05) as redlock:
            await (await redlock.lock("otel:warm").acquire()).release()
            group[1].pause()
            try:
                with anyio.fail_after(HANG_GUARD):
                    lease = await redlock.lock("otel:paused").acquire()  # 2 of 3
                    await silent.wait()  # the call to the paused master stays out
                    await lease.release()
            finally:
                group[1].resume()
                logging.getLogger("asyncredlock").removeHandler(handler)
            group[2].stop()
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("otel:stopped").acquire()
                await lease.release()
        master = "asyncredlock.master"
        timeouts = otel.points("asyncredlock.master.timeouts")
        assert timeouts == {frozenset({(master, group.urls[1])}): 1}
        errors = otel.points("asyncredlock.master.errors")
        assert {dict(attributes)[master] for attributes in errors} == {group.urls[2]}
        assert {dict(attributes)["error.type"] for attributes in errors} == {"ConnectionError"}


def test_a_round_a_quorum_took_too_late_is_expired() -> None:
    """The extension outcome when a quorum extended it but the lease did not take it
    (its validity ran out, or it ended meanwhile)."""

    class Decision:
        yes, reached, refuted = 3, True, False

    assert _telemetry._outcome_of(Decision(), lambda d: False) == "expired"
    assert _telemetry._outcome_of(Decision(), None) == "ok"


REASONS = (EXPIRED, LATE, GONE, BOUND)


def test_every_reason_an_extension_loses_a_lease_for_has_its_cause() -> None:
    """The loss reasons of extension rounds (as logged) count under their cause."""
    causes = {reason: _telemetry._cause(reason)["asyncredlock.cause"] for reason in REASONS}
    assert causes == {EXPIRED: "expired", LATE: "expired", GONE: "gone", BOUND: "max_hold"}


def test_an_api_older_than_1_30_still_imports_and_records(servers: ServerGroup) -> None:
    """An older API (pulled in by another package) has no bucket advice: the
    histograms are made without it; the library imports and runs."""
    script = f"""
from opentelemetry.metrics._internal import _ProxyMeter

made = _ProxyMeter.create_histogram

def old(self, name, unit="", description=""):  # the signature before 1.30
    return made(self, name, unit, description)

_ProxyMeter.create_histogram = old
import asyncio
from asyncredlock import AsyncRedlock, _telemetry

async def main():
    async with AsyncRedlock({servers.urls!r}) as redlock:
        async with redlock.lock("otel:old-api"):
            pass
    print(_telemetry.ENABLED)

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


@pytest.mark.parametrize("api", ["absent", "no-sdk"])
def test_works_with_the_api_alone_and_without_it(servers: ServerGroup, api: str) -> None:
    """In a fresh interpreter: without the package ``opentelemetry`` importable, and
    with the API but no SDK, a lock cycle runs and no span records."""
    script = f"""
import sys
if {api == "absent"!r}:
    sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import asyncio
from asyncredlock import AsyncRedlock
from asyncredlock import _telemetry

async def main():
    async with AsyncRedlock({servers.urls!r}) as redlock:
        async with redlock.lock("otel:plain", fencing=True) as lease:
            assert _telemetry.start_span("x", "y") is None
            await lease.extend()
        print(_telemetry.ENABLED, lease.token > 0, redlock.statistics().releases)

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(api == "no-sdk"), "True", "1"]
