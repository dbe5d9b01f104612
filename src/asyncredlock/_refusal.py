"""Failures that retrying cannot mend: a master refuses the user or password (AUTH),
its ACL refuses a command, key or channel, or its TLS certificate fails
verification. When such refusals alone put the quorum out of reach, an acquisition
stops at once instead of retrying until its timeout, and every error says which kind
of refusal it was."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import LockTimeoutError, QuorumUnavailableError, RedlockError
from ._tls import REFUSED as CERTIFICATE_REFUSED

if TYPE_CHECKING:
    from ._quorum import Decision
    from ._stats import Counters

__all__ = ["acquisition_error", "refusal", "why_refused", "why_unavailable"]

#: How a master says a command, key or channel is not the user's to use: ``NOPERM``
#: for a command sent; for one a script calls, ``ACL failure in script`` (Valkey,
#: Redis 7.2+) or ``The user executing the script can't ...`` (Redis 7.0: run this
#: command, access at least one of the keys, publish to the channel).
# (redis-py strips NOPERM from a refusal during its handshake: NoPermissionError)
_ACL = (
    "NOPERM",
    "ACL failure in script",
    "The user executing the script can't",
    "NoPermissionError",
)

#: A master whose certificate failed verification (see `asyncredlock._tls`).
_TLS = (CERTIFICATE_REFUSED,)

#: A master that refused the user or password during the handshake: redis-py's
#: ``AuthenticationError`` (``WRONGPASS``: an unknown user or a wrong password;
#: ``NOAUTH``: a password is required and none was given), or the reply itself.
_AUTH = ("AuthenticationError", "WRONGPASS", "NOAUTH")


def _refused(detail: str, marks: tuple[str, ...]) -> bool:
    return any(mark in detail for mark in marks)


def _refusals(decision: Decision) -> list[str]:
    """The failed masters' accounts that are refusals, when there are enough of them
    that no quorum can be reached; else none."""
    if not decision.unavailable:
        return []
    refused = [
        outcome.detail
        for outcome in decision.outcomes
        if not outcome.ok and _refused(outcome.detail, _AUTH + _ACL + _TLS)
    ]
    return refused if len(refused) > decision.masters - decision.quorum else []


def refusal(decision: Decision) -> str | None:
    """The first refusal (of the user or password, by an ACL, of a certificate),
    when refusals on enough masters put the quorum out of reach (retrying cannot
    help); else ``None``."""
    refused = _refusals(decision)
    return refused[0] if refused else None


def why_unavailable(decision: Decision) -> str:
    """Why a round could not reach a quorum, for an error: the refusals that made it
    impossible (the first of each kind), or too many failures and silences."""
    refused = _refusals(decision)
    auth = [detail for detail in refused if _refused(detail, _AUTH)]
    acl = [detail for detail in refused if _refused(detail, _ACL)]
    tls = [detail for detail in refused if _refused(detail, _TLS)]
    reasons = []
    if auth:
        reasons.append(f"refused by the masters' AUTH (user or password): {auth[0]}")
    if acl:
        reasons.append(f"refused by the masters' ACL (see asyncredlock.acl_rules()): {acl[0]}")
    if tls:
        reasons.append(f"TLS certificates refused (see ssl_ca_certs, the host names): {tls[0]}")
    return "; ".join(reasons) or "too many masters failed or did not answer"


def acquisition_error(
    decision: Decision, counters: Counters, *, resource: str, doing: str, timeout: float, why: str
) -> RedlockError:
    """The error of an ``acquire()`` that ends without the lock, counted: an outage
    (`QuorumUnavailableError`, naming the refusal that made it one, if any), else
    ``why`` what it was ``doing`` stayed out of reach for ``timeout`` seconds
    (`LockTimeoutError`)."""
    if decision.unavailable:
        counters.unavailable += 1
        return QuorumUnavailableError(
            f"could not {doing}: {why_unavailable(decision)}",
            resource=resource,
            outcomes=decision.outcomes,
        )
    counters.timeouts += 1
    wait = "one attempt" if timeout == 0 else f"{timeout:g} s"
    return LockTimeoutError(
        f"could not {doing} within {wait}: {why}", resource=resource, outcomes=decision.outcomes
    )


#: What a master refusing an attempt says (see ``classify_acquire``), and the headline
#: of the error for it, the first found in this order.
_REFUSED_BY = (
    ("held by another holder", "held by another holder"),
    ("held by readers", "held by readers"),
    ("free, but an earlier waiter", "free, but another waiter is first in line"),
)


def why_refused(decision: Decision) -> str:
    """Why the masters refused an attempt, for an error: a holder, readers, or an
    earlier waiter first in the queue of a free lock (in that order, the first that
    a refusing master said)."""
    details = [outcome.detail for outcome in decision.outcomes if not outcome.ok]
    for said, why in _REFUSED_BY:
        if any(detail.startswith(said) for detail in details):
            return why
    return "held by another holder"
