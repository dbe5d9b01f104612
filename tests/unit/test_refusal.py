"""Refusals that retrying cannot mend (AUTH, ACL, TLS certificates), told apart from an
outage: which decisions stop an acquisition at once, and how the error says why."""

from __future__ import annotations

import ssl

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from asyncredlock import NodeOutcome
from asyncredlock._quorum import Decision
from asyncredlock._refusal import refusal, why_unavailable
from asyncredlock._tls import CertificateError, certificate_error

CERTIFICATE = (
    "CertificateError: TLS certificate verification failed for 127.0.0.1:7000:"
    " unable to get local issuer certificate"
)
ACL = "NoPermissionError: this user has no permissions to run the 'select' command"
AUTH = "AuthenticationError: invalid username-password pair or user is disabled."
NOAUTH = "AuthenticationError: Authentication required."
SILENT = "master silent for over 0.1 s"
OUTAGE = "ConnectionError: Error 111 connecting to 127.0.0.1:7001. Connection refused."


def failed(*details: str) -> Decision:
    """A round where the first masters failed with ``details``, the rest granted."""
    outcomes = [NodeOutcome(f"m{i}", False, detail) for i, detail in enumerate(details)]
    outcomes += [NodeOutcome(f"m{i}", True, "granted") for i in range(len(details), 3)]
    return Decision(3 - len(details), 0, len(details), tuple(outcomes))


@pytest.mark.parametrize(
    ("details", "why"),
    [
        (
            (CERTIFICATE, CERTIFICATE),
            f"TLS certificates refused (see ssl_ca_certs, the host names): {CERTIFICATE}",
        ),
        (
            (ACL, ACL, ACL),
            f"refused by the masters' ACL (see asyncredlock.acl_rules()): {ACL}",
        ),
        (
            (ACL, CERTIFICATE),
            f"refused by the masters' ACL (see asyncredlock.acl_rules()): {ACL};"
            f" TLS certificates refused (see ssl_ca_certs, the host names): {CERTIFICATE}",
        ),
        ((AUTH, AUTH), f"refused by the masters' AUTH (user or password): {AUTH}"),
        ((NOAUTH, NOAUTH), f"refused by the masters' AUTH (user or password): {NOAUTH}"),
        (
            (AUTH, ACL),
            f"refused by the masters' AUTH (user or password): {AUTH};"
            f" refused by the masters' ACL (see asyncredlock.acl_rules()): {ACL}",
        ),
    ],
    ids=["certificates", "acl", "both", "auth", "noauth", "auth and acl"],
)
def test_refusals_that_put_the_quorum_out_of_reach(details: tuple[str, ...], why: str) -> None:
    decision = failed(*details)
    assert refusal(decision) == details[0]
    assert why_unavailable(decision) == why


@pytest.mark.parametrize(
    "details",
    [(CERTIFICATE,), (CERTIFICATE, SILENT), (OUTAGE, ACL), (AUTH, OUTAGE), (OUTAGE, OUTAGE)],
    ids=["a minority", "with a silence", "with an outage", "auth with an outage", "no refusal"],
)
def test_an_outage_is_retried(details: tuple[str, ...]) -> None:
    """Refusals on too few masters to rule out a quorum: the others may come back."""
    decision = failed(*details)
    assert refusal(decision) is None
    assert why_unavailable(decision) == "too many masters failed or did not answer"


def test_a_verification_failure_in_the_chain_is_a_certificate_error() -> None:
    cause = ssl.SSLCertVerificationError(1, "certificate verify failed")
    with pytest.raises(RedisConnectionError) as caught:
        try:
            raise cause
        except OSError:
            # as redis-py does: its own error, raised while handling the ssl one
            raise RedisConnectionError("Error 1 connecting to 127.0.0.1:7000.")  # noqa: B904
    error = certificate_error(caught.value, "127.0.0.1:7000")
    assert isinstance(error, CertificateError)
    assert isinstance(error, RedisConnectionError)
    assert str(error).startswith("TLS certificate verification failed for 127.0.0.1:7000: ")
    assert error.__cause__ is cause


def test_other_connection_failures_are_left_alone() -> None:
    assert certificate_error(RedisConnectionError("refused"), "127.0.0.1:7000") is None
    assert certificate_error(ssl.SSLError(1, "wrong version number"), "127.0.0.1:7000") is None
