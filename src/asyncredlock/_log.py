"""The library's log, on the ``asyncredlock`` logger: one line per event that changes
a lease or a master's standing, the facts also given as ``extra`` fields
(``resource``, ``identity``, ``token``, ``masters``, ``reason``), so structured
handlers (JSON, structlog) get them as fields."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import ResponseError

from ._errors import NodeOutcome
from ._keys import identity_of
from ._telemetry import master_silent, record_lost

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "Held",
    "log_acquired",
    "log_block_orphaned",
    "log_extension_failed",
    "log_lost",
    "log_master_readmitted",
    "log_master_silent",
    "log_ping_refusal",
    "log_ping_refused",
    "log_release_short",
    "log_subscribe_refused",
    "log_unsubscribe_refusal",
    "refuses_ping",
    "turned_silent",
]

logger = logging.getLogger("asyncredlock")


class Held(Protocol):
    """What the log reads of a lease."""

    resource: str
    value: str
    token: int | None
    _holder: Span | None  # the span current where it was acquired


def _facts(lease: Held, outcomes: Sequence[NodeOutcome], reason: str) -> dict[str, object]:
    return {
        "resource": lease.resource,
        "identity": identity_of(lease.value),
        "token": lease.token,
        "masters": {outcome.node: outcome.detail for outcome in outcomes},
        "reason": reason,
    }


def _failed(outcomes: Sequence[NodeOutcome]) -> str:
    """The masters that did not take the operation, and why."""
    return "; ".join(str(o) for o in outcomes if not o.ok) or "no master reported"


def log_acquired(lease: Held, attempts: int, waited: float) -> None:
    """A lease taken after waiting: more than one attempt, or handed over (INFO).
    Nothing is built when INFO is off (every waited acquisition passes here)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    reason = f"waited {waited:.3f} s, {attempts} attempt{'' if attempts == 1 else 's'}"
    logger.info(
        "acquired %r after waiting (%s)", lease.resource, reason, extra=_facts(lease, (), reason)
    )


def log_extension_failed(
    lease: Held, outcomes: Sequence[NodeOutcome], reason: str, repeated: bool
) -> None:
    """An extension round that did not reach a quorum in time, for ``reason``:
    WARNING, or DEBUG when the round before failed too (an outage retries every
    fraction of a TTL)."""
    logger.log(
        logging.DEBUG if repeated else logging.WARNING,
        "extending %r failed (%s): %s",
        lease.resource,
        reason,
        _failed(outcomes),
        extra=_facts(lease, outcomes, reason),
    )


def log_lost(lease: Held, outcomes: Sequence[NodeOutcome], reason: str) -> None:
    """A lease ended lost (WARNING): why, and what the masters said last; also
    counted, and an event on its holder's span, in OpenTelemetry."""
    logger.warning(
        "lease on %r lost: %s [%s]",
        lease.resource,
        reason,
        _failed(outcomes),
        extra=_facts(lease, outcomes, reason),
    )
    record_lost(lease._holder, lease.resource, lease.token, reason)


def log_release_short(lease: Held, outcomes: Sequence[NodeOutcome]) -> None:
    """A release that reached too few masters; their keys expire with the TTL
    (WARNING)."""
    reason = "released on too few masters; the rest expire with the TTL"
    logger.warning(
        "releasing %r: %s: %s",
        lease.resource,
        reason,
        _failed(outcomes),
        extra=_facts(lease, outcomes, reason),
    )


def log_block_orphaned(lease: Held, block: object, task: str) -> None:
    """The task that entered the lease's ``async with`` block (of ``block``) ended
    with the block open: the lease is kept until the block exits (WARNING)."""
    reason = (
        f"task {task!r} ended with the async with block of {block!r} open (e.g. an"
        " async generator suspended inside it)"
    )
    logger.warning(
        "keeping %r: %s; the block can no longer be cancelled on a lost lease; its lease"
        " is kept (extending itself, unless auto_extend=False) until the block exits, the"
        " generator is closed or finalised, or max_hold ends it",
        lease.resource,
        reason,
        extra=_facts(lease, (), reason),
    )


def log_master_silent(master: str, seconds: float) -> None:
    """A master counted as silent: calls out and no byte for ``seconds`` (WARNING)."""
    reason = f"no reply for {seconds:g} s with calls out"
    logger.warning(
        "master %s silent: %s",
        master,
        reason,
        extra={"masters": {master: "silent"}, "reason": reason},
    )


def turned_silent(master: str, seconds: float, watchers: Iterable[Callable[[], None]]) -> None:
    """A master turned silent (calls out, nothing heard for ``seconds``): log and
    count it, and tell the ``watchers`` (the rounds waiting on it decide)."""
    log_master_silent(master, seconds)
    master_silent(master)
    for watcher in list(watchers):
        watcher()


def log_master_readmitted(master: str) -> None:
    """A silent master answered again (INFO)."""
    logger.info(
        "master %s answers again",
        master,
        extra={"masters": {master: "answering"}, "reason": "answered"},
    )


def refuses_ping(error: BaseException | None) -> bool:
    """Whether ``error`` is a master's ACL refusing a PING (``NOPERM``), not a failure
    that may pass (``BUSY``, ``LOADING``...)."""
    return isinstance(error, ResponseError) and str(error).startswith("NOPERM")


def log_ping_refused(master: str, ping: asyncio.Future[Any]) -> None:
    """An idle connection's PING was refused (WARNING, once per master and process):
    most likely an ACL user whose rules lack ``+ping``. The refusal still shows the
    master alive (the connection stays), but every idle spell is refused again.
    ``ping`` resolves with the PING's `Reply`."""
    error = ping.result().error
    if refuses_ping(error):
        log_ping_refusal(master, str(error))


def log_ping_refusal(master: str, error: str) -> None:
    """A master's ACL refused the PING of an idle connection, a command connection's
    or the wake-up subscription's (``error``; WARNING, once per master and process)."""
    advice = "grant +ping (acl_rules() includes it)"
    _log_refused(master, "PING", "the PING of idle connections", error, advice)


def log_subscribe_refused(master: str, error: str) -> None:
    """A master refused the wake-up subscription's SUBSCRIBE (``NOPERM``; WARNING,
    once per master and process): an ACL user without ``+subscribe`` or the
    channels of `acl_rules`. Locks still work, but waiters are woken by no release:
    they poll at their retry delay."""
    advice = (
        "waiters poll at their retry delay instead; grant +subscribe and the channels"
        " of acl_rules()"
    )
    _log_refused(master, "SUBSCRIBE", "the wake-up subscription", error, advice)


def log_unsubscribe_refusal(master: str, error: str) -> None:
    """A master refused the wake-up subscription's UNSUBSCRIBE (``NOPERM``; WARNING,
    once per master and process): an ACL user without ``+unsubscribe``. The
    subscription works, but keeps the channels nobody waits on (their releases still
    come) until its connection is reopened."""
    advice = (
        "the channels nobody waits on stay subscribed until the connection is reopened;"
        " grant +unsubscribe (acl_rules() includes it)"
    )
    _log_refused(master, "UNSUBSCRIBE", "UNSUBSCRIBE", error, advice)


_REFUSALS_LOGGED: set[tuple[str, str]] = set()  # (command, master) already logged


def _log_refused(master: str, command: str, what: str, error: str, advice: str) -> None:
    """A master's ACL refused ``command`` (``what`` it is for): WARNING, once per
    master and command in this process (the refusal comes back at every try)."""
    if (command, master) in _REFUSALS_LOGGED:
        return
    _REFUSALS_LOGGED.add((command, master))
    logger.warning(
        "master %s refuses %s (%s): %s",
        master,
        what,
        error,
        advice,
        extra={"masters": {master: f"refuses {command}"}, "reason": error},
    )
