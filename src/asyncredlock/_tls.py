"""A master's TLS certificate that fails verification, told apart from other
connection failures: it is a configuration error, which no retry mends. And the
other way round, a master that may have refused the client's certificate: a TLS
connection it ended before its first reply says so (only a hint: a network fault
looks the same)."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Iterator
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = [
    "CLIENT_CERTIFICATE_HINT",
    "REFUSED",
    "CertificateError",
    "certificate_error",
    "ended_by_master",
    "lost_reason",
    "settings_error",
]

#: How the account of a certificate that failed verification begins.
REFUSED = "TLS certificate verification failed"

#: Added to the account of a TLS connection the master ended before its first reply:
#: what a master that requires client certificates does to a client that gave none
#: (TLS 1.3 finishes the client's side of the handshake before the server checks it).
CLIENT_CERTIFICATE_HINT = (
    " (before any reply over TLS: a master that requires client certificates does"
    " this when none, or one it does not trust, is given; see ssl_certfile and"
    " ssl_keyfile)"
)


class CertificateError(RedisConnectionError):
    """A master's TLS certificate failed verification (an untrusted issuer, another
    host name, expired...): the connection was not made, and retrying cannot help."""


def certificate_error(exc: BaseException, address: str) -> CertificateError | None:
    """A `CertificateError` for ``address`` if ``exc`` (or an exception it was raised
    from or while handling) is a certificate verification failure; else ``None``.

    redis-py raises its ``ConnectionError`` while handling the
    ``ssl.SSLCertVerificationError``, so the cause is found in the chain.
    """
    for cause in _chain(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            # set by the ssl module when it raises; absent from one made by hand
            why = getattr(cause, "verify_message", None) or str(cause)
            error = CertificateError(f"{REFUSED} for {address}: {why}")
            error.__cause__ = cause
            return error
    return None


def ended_by_master(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from or while handling) says
    the master ended the connection: a reset, or a TLS alert it sent (a certificate
    it refused; not our own verification of its certificate)."""
    return any(
        isinstance(cause, ConnectionResetError)
        or (
            isinstance(cause, ssl.SSLError)
            and not isinstance(cause, ssl.SSLCertVerificationError)
            and "ALERT" in str(cause).upper()
        )
        for cause in _chain(exc)
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from (or while handling), once each."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        yield cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


def lost_reason(
    address: str,
    exc: BaseException | None,
    unanswered: asyncio.BaseTransport | None,
    said: str | None = None,
) -> str:
    """The account of a connection to ``address`` that was lost (``exc``: how), with
    `CLIENT_CERTIFICATE_HINT` if the master ended it before its first reply over TLS
    (``unanswered``: the connection's transport when no reply came on it, else None),
    and the error reply the master sent last that no caller took (``said``: a master
    refusing the connection, at ``maxclients`` or in protected mode, says why)."""
    reason = f"connection to {address} lost" + (f": {exc}" if exc else "")
    if said is not None:
        reason += f" (the master said: {said})"
    if unanswered is not None and unanswered.get_extra_info("ssl_object") is not None:
        return reason + CLIENT_CERTIFICATE_HINT
    return reason


#: redis-py's TLS settings that name a file (a directory for ``ssl_ca_path``), with
#: the attribute of its ``RedisSSLContext`` that holds each.
_FILES = (
    ("ssl_certfile", "certfile"),
    ("ssl_keyfile", "keyfile"),
    ("ssl_ca_certs", "ca_certs"),
    ("ssl_ca_path", "ca_path"),
)


def settings_error(context: Any) -> str | None:
    """Why redis-py cannot build the TLS context of its ``RedisSSLContext``
    ``context`` (it does so in each ``connect()``, refusing every connection), naming
    the setting and its file; else ``None``. No password shows, and none is asked
    for on the terminal: an encrypted ``ssl_keyfile`` without ``ssl_password`` is
    refused. ``context`` is a throwaway: its settings are changed."""
    ca_path = getattr(context, "ca_path", None)
    if ca_path and not os.path.isdir(ca_path):  # OpenSSL takes any path, unchecked
        return f"ssl_ca_path {str(ca_path)!r}: no such directory (or not a directory)"
    if context.password is None:
        context.password = _no_password
    try:
        context.get()
    except (OSError, ValueError, TypeError) as exc:  # ssl.SSLError is an OSError
        return _which_setting(context, exc)
    return None


def _no_password() -> bytes:
    return b""


def _which_setting(context: Any, exc: BaseException) -> str:
    for setting, attribute in _FILES:
        path = getattr(context, attribute, None)
        if path and not os.path.exists(path):
            return f"{setting} {str(path)!r}: no such file or directory"
    if context.certfile or context.keyfile:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
                context.certfile, context.keyfile, context.password
            )
        except (OSError, ValueError, TypeError) as error:
            return (
                f"ssl_certfile {str(context.certfile)!r} with ssl_keyfile"
                f" {str(context.keyfile)!r} could not be loaded (a wrong or missing"
                f" ssl_password, a key not of that certificate, or not PEM): {error}"
            )
    return f"the TLS settings could not be loaded (ssl_ca_certs, ssl_ca_data...): {exc}"
