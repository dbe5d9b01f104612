"""Masters named by a Sentinel URL: ``redis-sentinel://host:port,host:port/service``.

The master is found through the sentinels (redis-py's ``Sentinel``) each time a
connection is opened, so after a failover the next connection goes to the promoted
replica.
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import unquote

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from ._identity import Identity, sentinel_identity
from ._urls import SENTINEL, bracketed, check_sendable, is_number, options, redacted

__all__ = ["SCHEME", "OwnedClient", "SentinelMaster", "display_name", "parse_sentinel_url"]

SCHEME = SENTINEL
DEFAULT_PORT = 26379
#: The query parameters a Sentinel URL may carry (the sentinels' own credentials).
_QUERY = ("sentinel_username", "sentinel_password")


class SentinelMaster:
    """What a Sentinel URL names: the sentinels, the service, and the master's
    credentials and database.

    Attributes:
        sentinels: ``(host, port)`` of each sentinel, in the URL's order.
        service: The name the sentinels monitor the master under.
        db: The database number on the master.
        username: The master's ACL user, if any.
        password: The master's password, if any.
        sentinel_kwargs: Credentials for the sentinels themselves.
    """

    def __init__(
        self,
        sentinels: list[tuple[str, int]],
        service: str,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        sentinel_kwargs: dict[str, str] | None = None,
    ) -> None:
        self.sentinels = sentinels
        self.service = service
        self.db = db
        self.username = username
        self.password = password
        self.sentinel_kwargs = sentinel_kwargs or {}

    @property
    def name(self) -> str:
        """The display name: the first sentinel and the service, no password."""
        host, port = self.sentinels[0]
        return display_name(host, port, self.service)

    @property
    def identity(self) -> Identity:
        """Shares a key with that of another URL naming the same master: the same
        service through a sentinel in common (see `sentinel_identity`)."""
        return sentinel_identity(self.service, self.sentinels)

    def client(self, timeout: float) -> Redis:
        """A client of the master through the sentinels (opening nothing yet);
        ``timeout`` bounds each connection attempt and reply, sentinels included.
        The sentinels' clients retry nothing (redis-py's default would retry a
        sentinel that is down with seconds of backoff, on every new connection):
        one that fails is passed over for the next."""
        timeouts: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        sentinel_kwargs = {**timeouts, "retry": Retry(NoBackoff(), 0), **self.sentinel_kwargs}
        sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            self.sentinels, sentinel_kwargs=sentinel_kwargs, **timeouts
        )
        client: Redis = sentinel.master_for(
            self.service, db=self.db, username=self.username, password=self.password
        )
        return client


class OwnedClient:
    """A client made by `SentinelMaster.client`, kept by its node (the connection
    settings copied from it refer to its pool weakly) and closed with the
    sentinels' clients when the node closes."""

    def __init__(self, client: Redis) -> None:
        self.client = client

    async def aclose(self) -> None:
        manager: Any = getattr(self.client.connection_pool, "sentinel_manager", None)
        await self.client.aclose()
        for sentinel in getattr(manager, "sentinels", ()):
            with contextlib.suppress(Exception):
                await sentinel.aclose()


def display_name(host: object, port: object, service: str) -> str:
    """``redis-sentinel://host:port/service``: how a Sentinel-managed master shows,
    named by its first sentinel (an IPv6 address in brackets)."""
    return f"{SCHEME}://{bracketed(host)}:{port}/{service}"


def parse_sentinel_url(url: str) -> SentinelMaster:
    """Read ``redis-sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]``
    (``?sentinel_username=...&sentinel_password=...`` for the sentinels' own ACL).

    Raises:
        ValueError: The URL is not of that form.
    """
    shown = redacted(url)  # errors never show a password
    check_sendable(url, shown)
    if "#" in url:
        raise ValueError(f"master URL {shown!r} has a fragment ('#...'): %-encode a '#'")
    rest = url[len(SCHEME) + 3 :]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    if "@" in path:  # a password holding a '/': it would read as the service name
        raise ValueError(
            f"master URL {shown!r}: an '@' after the sentinels (a '/' in a password must"
            " be %-encoded: %2F)"
        )
    credentials, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = [_address(shown, part) for part in hosts.split(",")]
    service, _, db_text = path.partition("/")
    if not service:
        raise ValueError(f"master URL {shown!r} names no service (…/SERVICE after the sentinels)")
    if db_text and not is_number(db_text):
        raise ValueError(f"master URL {shown!r}: after the service, only a database number")
    return SentinelMaster(
        sentinels,
        unquote(service),
        db=int(db_text or 0),
        username=username,
        password=password,
        sentinel_kwargs=_sentinel_credentials(shown, query),
    )


def _address(shown: str, part: str) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[v6 address]:port`` (``shown``: the URL for errors)."""
    port_text: str | None
    if part.startswith("["):
        host, bracket, rest = part[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
        if not bracket or (rest and port_text is None):
            raise ValueError(
                f"master URL {shown!r} has a malformed sentinel address{_quoted(part, shown)}"
            )
    else:
        host, colon, after = part.partition(":")
        port_text = after if colon else None
    if not host:
        raise ValueError(f"master URL {shown!r} names a sentinel without a host")
    if port_text is None:
        return host.lower(), DEFAULT_PORT
    if not is_number(port_text) or not 0 < int(port_text) < 65536:
        raise ValueError(
            f"master URL {shown!r} has an invalid sentinel port{_quoted(port_text, shown)}"
        )
    return host.lower(), int(port_text)


def _quoted(text: str, shown: str) -> str:
    """`` 'text'`` for a message, if ``shown`` (the URL without its password) holds
    it: a URL that does not parse may have put part of a password there."""
    return f" {text!r}" if text in shown else ""


def _sentinel_credentials(shown: str, query: str) -> dict[str, str]:
    found = options(query, _QUERY, shown)  # the same rules as other master URLs
    return {name[len("sentinel_") :]: value for name, value in found.items()}
