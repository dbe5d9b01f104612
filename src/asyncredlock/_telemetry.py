"""OpenTelemetry spans and metrics, through the OpenTelemetry API only (the ``otel``
extra): the application's SDK, if it configures one, decides where they go.

Without the API installed every hook here returns at once; with the API but no
SDK, its no-op tracer and meter make each well under a microsecond (measured by
``benchmarks/otel_overhead.py``). Spans are made only where the API says they
record, so attributes cost nothing otherwise. Metric attributes stay of bounded
cardinality (outcome, master): resources name spans, never metric series.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol, TypeVar

from ._version import __version__

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the otel extra is not installed: every hook is a no-op
    ENABLED = False
else:
    ENABLED = True

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "ACQUIRE",
    "ENABLED",
    "EXTEND",
    "RELEASE",
    "Span",
    "caller_span",
    "end_span",
    "master_error",
    "master_silent",
    "note_attempts",
    "record_acquire",
    "record_hold",
    "record_lost",
    "start_span",
    "traced",
]

NAME = "asyncredlock"
ACQUIRE, EXTEND, RELEASE = "asyncredlock.acquire", "asyncredlock.extend", "asyncredlock.release"
RESOURCE = "asyncredlock.resource"
OUTCOME = "asyncredlock.outcome"
MASTER = "asyncredlock.master"
#: Histogram buckets in seconds: loopback rounds take under a millisecond, waits
#: for a contended lock up to a minute.
BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
BUCKETS += (10.0, 30.0, 60.0)


def _instruments() -> tuple[Tracer, Histogram, Histogram, Counter, Counter, Counter]:
    tracer = trace.get_tracer(NAME, __version__)
    meter = metrics.get_meter(NAME, __version__)
    return (
        tracer,
        meter.create_histogram(
            "asyncredlock.acquire.duration",
            unit="s",
            description="From each acquire() call to its lease or its error, by outcome.",
            explicit_bucket_boundaries_advisory=BUCKETS,
        ),
        meter.create_histogram(
            "asyncredlock.hold.duration",
            unit="s",
            description="From each lease to its end (release, loss or hand-off), by outcome.",
            explicit_bucket_boundaries_advisory=BUCKETS,
        ),
        meter.create_counter(
            "asyncredlock.lease.lost", unit="{lease}", description="Leases lost while held."
        ),
        meter.create_counter(
            "asyncredlock.master.errors",
            unit="{call}",
            description="Calls to a master that failed, by master and error type.",
        ),
        meter.create_counter(
            "asyncredlock.master.timeouts",
            unit="{timeout}",
            description="Times a master turned silent: calls out and no reply for node_timeout.",
        ),
    )


if ENABLED:
    _TRACER, _ACQUIRE, _HOLD, _LOST, _ERRORS, _SILENT = _instruments()

# one attribute set per outcome, made once (metrics are recorded on the hot path)
_OUTCOMES: dict[str, dict[str, str]] = {}


def _outcome(outcome: str) -> dict[str, str]:
    attributes = _OUTCOMES.get(outcome)
    if attributes is None:
        attributes = _OUTCOMES[outcome] = {OUTCOME: outcome}
    return attributes


def caller_span() -> Span | None:
    """The caller's current span, if it records (a lost lease's event goes there)."""
    if not ENABLED:
        return None
    span = trace.get_current_span()
    return span if span.is_recording() else None


def start_span(name: str, resource: str, parent: Span | None = None) -> Span | None:
    """A span ``name`` on ``resource``, child of ``parent`` (or of the current
    span); ``None`` when it would not record."""
    if not ENABLED:
        return None
    context = None if parent is None else trace.set_span_in_context(parent)
    span = _TRACER.start_span(name, context, SpanKind.INTERNAL)
    if not span.is_recording():
        return None
    span.set_attribute(RESOURCE, resource)
    return span


def note_attempts(span: Span | None, attempts: int, granted: int | None) -> None:
    """Add how many rounds an acquisition sent, and how many masters granted
    its last one."""
    if span is None:
        return
    span.set_attribute("asyncredlock.attempts", attempts)
    if granted is not None:
        span.set_attribute("asyncredlock.masters.granted", granted)


def end_span(
    span: Span | None,
    outcome: str,
    *,
    granted: int | None = None,
    token: int | None = None,
    error: BaseException | None = None,
    source: str | None = None,
) -> None:
    """End ``span`` with its outcome, masters granted, fencing token, error, and
    how the lease was taken."""
    if span is None:
        return
    span.set_attribute(OUTCOME, outcome)
    if source is not None:
        span.set_attribute("asyncredlock.source", source)
    if granted is not None:
        span.set_attribute("asyncredlock.masters.granted", granted)
    if token is not None:
        span.set_attribute("asyncredlock.fencing_token", token)
    if error is not None:
        span.set_attribute("error.type", type(error).__qualname__)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()


class Decided(Protocol):
    """What `traced` reads of a round's decision (a ``_quorum.Decision``)."""

    @property
    def yes(self) -> int: ...
    @property
    def reached(self) -> bool: ...
    @property
    def unavailable(self) -> bool: ...


D = TypeVar("D", bound=Decided)


class Traced(Protocol):
    """What `traced` reads of a lease."""

    resource: str
    token: int | None
    _holder: Span | None


def traced(name: str, lease: Traced, deciding: Awaitable[D]) -> Awaitable[D]:
    """``deciding`` (a lease's round) in a span ``name``, if one records: its
    outcome (``ok``: a quorum took it, ``unavailable``: failures alone prevented
    that, ``not-held``: a majority no longer held the lease), masters granted and
    token. Otherwise ``deciding`` itself, with no coroutine around it."""
    span = start_span(name, lease.resource, lease._holder)
    return deciding if span is None else _traced(span, lease, deciding)


async def _traced(span: Span, lease: Traced, deciding: Awaitable[D]) -> D:
    try:
        decision = await deciding
    except BaseException:
        end_span(span, "cancelled", token=lease.token)
        raise
    outcome = "ok" if decision.reached else "unavailable" if decision.unavailable else "not-held"
    end_span(span, outcome, granted=decision.yes, token=lease.token)
    return decision


def record_acquire(seconds: float, outcome: str) -> None:
    """Record an ``acquire()`` call's duration by outcome."""
    if ENABLED:
        _ACQUIRE.record(seconds, _outcome(outcome))


def record_hold(seconds: float, lost: bool) -> None:
    """Record how long a lease was held, by how it ended."""
    if ENABLED:
        _HOLD.record(seconds, _outcome("lost" if lost else "released"))


def record_lost(holder: Span | None, resource: str, token: int | None, reason: str) -> None:
    """Count a lost lease; add the event to its holder's span (the one current
    when it was acquired), if that still records."""
    if not ENABLED:
        return
    _LOST.add(1)
    if holder is not None and holder.is_recording():
        attributes: dict[str, str | int] = {RESOURCE: resource, "asyncredlock.reason": reason}
        if token is not None:
            attributes["asyncredlock.fencing_token"] = token
        holder.add_event("asyncredlock.lease.lost", attributes)


def master_error(master: str, error: BaseException) -> None:
    """Count a call to ``master`` that failed with ``error`` (an error reply, or
    a connection that failed or timed out)."""
    if ENABLED:
        _ERRORS.add(1, {MASTER: master, "error.type": type(error).__qualname__})


def master_silent(master: str) -> None:
    """Count a master turning silent: calls out, nothing heard for ``node_timeout``."""
    if ENABLED:
        _SILENT.add(1, {MASTER: master})
