"""A master's TLS certificate that fails verification, told apart from other
connection failures: it is a configuration error, which no retry mends."""

from __future__ import annotations

import ssl

from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["REFUSED", "CertificateError", "certificate_error"]

#: How the account of a certificate that failed verification begins.
REFUSED = "TLS certificate verification failed"


class CertificateError(RedisConnectionError):
    """A master's TLS certificate failed verification (an untrusted issuer, another
    host name, expired...): the connection was not made, and retrying cannot help."""


def certificate_error(exc: BaseException, address: str) -> CertificateError | None:
    """A `CertificateError` for ``address`` if ``exc`` (or an exception it was raised
    from or while handling) is a certificate verification failure; else ``None``.

    redis-py raises its ``ConnectionError`` while handling the
    ``ssl.SSLCertVerificationError``, so the cause is found in the chain.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLCertVerificationError):
            # set by the ssl module when it raises; absent from one made by hand
            why = getattr(cause, "verify_message", None) or str(cause)
            error = CertificateError(f"{REFUSED} for {address}: {why}")
            error.__cause__ = cause
            return error
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None
