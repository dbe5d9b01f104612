"""OpenTelemetry spans and metrics, through the OpenTelemetry API only (the ``otel``
extra): the application's SDK, if it configures one, decides where they go.

Without the API installed every hook here returns at once; with the API but no
SDK, its no-op tracer and meter take the calls (``benchmarks/otel_overhead.py``
measures the whole cost on the throughput workload). Spans are made only where the API says they
record, so attributes cost nothing otherwise. Metric attributes stay of bounded
cardinality (outcome, master): resources name spans, never metric series.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from ._version import __version__

try:
    from opentelemetry import metrics, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the otel extra is not installed: every hook is a no-op
    ENABLED = False
else:
    ENABLED = True

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = [
    "ACQUIRE",
    "ENABLED",
    "EXTEND",
    "RELEASE",
    "end_span",
    "holder_span",
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
ATTEMPTS = "asyncredlock.attempts"
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


def _instruments(
    tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
) -> tuple[Tracer, Histogram, Histogram, Counter, Counter, Counter]:
    """The tracer and the instruments, from the global providers unless given."""
    tracer = trace.get_tracer(NAME, __version__, tracer_provider)
    meter = metrics.get_meter(NAME, __version__, meter_provider=meter_provider)
    return (
        tracer,
        _histogram(
            meter,
            "asyncredlock.acquire.duration",
            "From each acquire() call to its lease or its error, by outcome.",
        ),
        _histogram(
            meter,
            "asyncredlock.hold.duration",
            "From each lease to its end (release, loss or hand-off), by outcome.",
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


def _histogram(meter: Meter, name: str, description: str) -> Histogram:
    """A histogram in seconds with `BUCKETS` advised (an API older than 1.30, pulled
    in by another package, takes no advice: its SDK's default buckets then apply)."""
    try:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=BUCKETS
        )
    except TypeError:
        return meter.create_histogram(name, unit="s", description=description)


if ENABLED:
    _TRACER, _ACQUIRE, _HOLD, _LOST, _ERRORS, _SILENT = _instruments()

# one attribute set per outcome, made once (metrics are recorded on the hot path)
_OUTCOMES: dict[str, dict[str, str]] = {}


def _outcome(outcome: str) -> dict[str, str]:
    attributes = _OUTCOMES.get(outcome)
    if attributes is None:
        attributes = _OUTCOMES[outcome] = {OUTCOME: outcome}
    return attributes


def holder_span(acquire: Span | None) -> Span | None:
    """What a lease's spans hang from (its ``_holder``), given its acquire span: the
    caller's current span if it records (a lost lease's event goes there too); else,
    if the acquire span recorded, the invalid span (lease spans become roots); else
    ``None``: the lease is not traced (no SDK when it was taken), at no cost."""
    if not ENABLED:
        return None
    span = trace.get_current_span()
    if span.is_recording():
        return span
    return trace.INVALID_SPAN if acquire is not None else None


def start_span(name: str, resource: str) -> Span | None:
    """An acquire span on ``resource``, child of the current span; ``None`` when it
    would not record. Its attempts are 0 until `note_attempts` says otherwise (a
    lease passed on in process, or a wait in the process's own queue, sends none)."""
    if not ENABLED:
        return None
    span = _TRACER.start_span(name, None, SpanKind.INTERNAL)
    if not span.is_recording():
        return None
    span.set_attributes({RESOURCE: resource, ATTEMPTS: 0})
    return span


def _lease_span(name: str, lease: Traced) -> Span | None:
    """A span of a lease's round: a child of its holder's span, or a root when that is
    the invalid span (see `holder_span`), never of whatever is current (an automatic
    extension runs in a background task, and a lease passed on in process was made
    in the previous holder's); ``None`` for a lease not traced."""
    holder = lease._holder
    if holder is None:  # not traced when acquired
        return None
    context = trace.set_span_in_context(holder, Context())
    span = _TRACER.start_span(name, context, SpanKind.INTERNAL)
    if not span.is_recording():
        return None
    span.set_attribute(RESOURCE, lease.resource)
    return span


def note_attempts(span: Span | None, attempts: int, granted: int | None) -> None:
    """Add how many rounds an acquisition sent, and how many masters granted
    its last one."""
    if span is None:
        return
    span.set_attribute(ATTEMPTS, attempts)
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
    def refuted(self) -> bool: ...


D = TypeVar("D", bound=Decided)


class Traced(Protocol):
    """What `traced` reads of a lease."""

    resource: str
    token: int | None
    _holder: Span | None


def traced(
    name: str, lease: Traced, deciding: Awaitable[D], accepted: Callable[[D], bool] | None = None
) -> Awaitable[D]:
    """``deciding`` (a lease's round) in a span ``name``, if one records, with its
    outcome: ``ok`` (``accepted`` by the lease, by default a quorum took it),
    ``not-held`` (a majority no longer held the lease: the round was refuted),
    ``unavailable`` (no quorum, and not refuted: failures kept one from being
    decided), ``expired`` (a quorum took it, but the lease did not: the round came
    after the expiry it set, or the lease ended meanwhile), ``cancelled`` or
    ``error``; masters granted and token. Otherwise ``deciding`` itself, with no
    coroutine around it."""
    span = _lease_span(name, lease) if ENABLED else None
    return deciding if span is None else _traced(span, lease, deciding, accepted)


async def _traced(
    span: Span, lease: Traced, deciding: Awaitable[D], accepted: Callable[[D], bool] | None
) -> D:
    try:
        decision = await deciding
    except asyncio.CancelledError:
        end_span(span, "cancelled", token=lease.token)
        raise
    except BaseException as exc:
        end_span(span, "error", token=lease.token, error=exc)
        raise
    outcome = _outcome_of(decision, accepted)
    failed = None if outcome == "ok" else RoundFailedError(outcome)
    end_span(span, outcome, granted=decision.yes, token=lease.token, error=failed)
    return decision


def _outcome_of(decision: D, accepted: Callable[[D], bool] | None) -> str:
    if accepted(decision) if accepted is not None else decision.reached:
        return "ok"
    if decision.reached:
        return "expired"
    return "not-held" if decision.refuted else "unavailable"


class RoundFailedError(Exception):
    """Stands for a lease's round that did not take effect, on its span (its status
    says ERROR, ``error.type`` is this class, the description the outcome)."""


def record_acquire(seconds: float, outcome: str) -> None:
    """Record an ``acquire()`` call's duration by outcome."""
    if ENABLED:
        _ACQUIRE.record(seconds, _outcome(outcome))


def record_hold(seconds: float, lost: bool) -> None:
    """Record how long a lease was held, by how it ended."""
    if ENABLED:
        _HOLD.record(seconds, _outcome("lost" if lost else "released"))


#: Each reason a lease is lost for (as the log words it), by its short cause.
CAUSES = {
    "not extended before its validity ran out": "expired",
    "extended too late: a quorum confirmed it only after the expiry it set": "expired",
    "a majority of masters no longer hold it": "gone",
    "gone from a majority when released": "gone",
    "forced free (force_release)": "forced",
    "its AsyncRedlock was closed": "closed",
    "held for its max_hold": "max_hold",
}
_CAUSES = {reason: {"asyncredlock.cause": cause} for reason, cause in CAUSES.items()}


def _cause(reason: str) -> dict[str, str]:
    return _CAUSES.get(reason, {"asyncredlock.cause": "other"})


def record_lost(holder: Span | None, resource: str, token: int | None, reason: str) -> None:
    """Count a lost lease by cause; add the event to its holder's span (the one
    current when it was acquired), if that still records."""
    if not ENABLED:
        return
    _LOST.add(1, _cause(reason))
    if holder is not None and holder.is_recording():
        attributes: dict[str, str | int] = {RESOURCE: resource, "asyncredlock.reason": reason}
        attributes.update(_cause(reason))
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
