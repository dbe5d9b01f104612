"""Master URLs (``redis://``, ``rediss://``, ``unix://``) checked at construction,
and shown without their password; a ready client's connection settings checked by
the same rules."""

from __future__ import annotations

import codecs
import ssl
from collections.abc import Mapping
from urllib.parse import SplitResult, parse_qs, unquote_to_bytes, urlsplit, urlunsplit

from ._config import check_seconds
from ._identity import DEFAULT_PORT

__all__ = [
    "QUERY",
    "SCHEMES",
    "SENTINEL",
    "bracketed",
    "check_client_settings",
    "check_sendable",
    "checked",
    "display",
    "is_number",
    "options",
    "redacted",
]

SCHEMES = ("redis", "rediss", "unix")
#: The scheme of a master named by its sentinels (read by `_sentinel`).
SENTINEL = "redis-sentinel"
_COMMON = ("db", "username", "password", "client_name", "socket_timeout", "socket_connect_timeout")
#: Query parameters that hold a password (see `options`).
_SECRETS = frozenset({"password", "sentinel_password", "ssl_password"})
_HIDDEN = (
    "an unknown parameter (its name not shown: the query holds a password, in which"
    " an '&' must be %-encoded: %26)"
)
_TLS = (
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_ca_data",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_password",
    "ssl_cert_reqs",
    "ssl_check_hostname",
    "ssl_min_version",
    "ssl_ciphers",
    "ssl_include_verify_flags",
    "ssl_exclude_verify_flags",
)
_TLS_VERSIONS = frozenset(version.value for version in ssl.TLSVersion)
#: Flags redis-py reads as true unless one of its false words: a typo of "false"
#: would turn one on. Only its words are taken (any case; empty: not set).
_FLAGS = frozenset({"socket_keepalive", "ssl_check_hostname", "retry_on_timeout"})
_FLAG_WORDS = frozenset({"", "0", "F", "FALSE", "N", "NO", "1", "T", "TRUE", "Y", "YES"})
#: Taken as redis-py takes them, to no effect on the connections asyncredlock opens
#: (it sets RESP2, no retries and no health checks itself, parses the replies itself
#: and keeps no pool): a URL shared with redis-py clients works as it is.
_NO_EFFECT = (
    "protocol",
    "health_check_interval",
    "retry_on_timeout",
    "max_connections",
    "decode_responses",
    "encoding",
    "encoding_errors",
    "socket_read_size",
)
#: The query parameters a master URL may carry, by scheme: those redis-py reads
#: into the settings of the connections asyncredlock opens (the rest would reach
#: its connection class only when the first connection opens, and fail there).
QUERY = {
    "redis": (*_COMMON, "socket_keepalive", *_NO_EFFECT),
    "rediss": (*_COMMON, "socket_keepalive", *_TLS, *_NO_EFFECT),
    "unix": (*_COMMON, *_NO_EFFECT),
}


def checked(url: str) -> tuple[SplitResult, int | None]:
    """``url`` split, and its port.

    Raises:
        ValueError: The URL is not one of a master, named without its password.
    """
    shown = redacted(url)  # errors never show the password
    check_sendable(url, shown)
    if "," in url.partition("?")[0]:
        raise ValueError(
            f"master URL {shown!r} has a comma: one host per URL (only {SENTINEL}:// URLs"
            " list several, their sentinels), and each URL starts with its scheme"
        )
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(
            f"master URL {shown!r} must start with redis://, rediss://, unix:// or {SENTINEL}://"
        )
    if "#" in url:
        raise ValueError(f"master URL {shown!r} has a fragment ('#...'): %-encode a '#'")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"master URL {shown!r} has an invalid port") from exc
    given = options(parts.query, QUERY[parts.scheme], shown)
    if parts.scheme == "unix":
        _check_unix(parts, port, shown)
        return parts, port
    _check_host(parts.hostname, f"master URL {shown!r}")
    if port is not None:  # a port out of range failed to parse above
        _check_port(port, f"master URL {shown!r}")
    if parts.path not in ("", "/") and not _db_number(parts.path[1:]):
        raise ValueError(f"master URL {shown!r}: the path must be a database number")
    _check_one_db(parts.path, given.get("db"), shown)
    return parts, port


def _check_one_db(path: str, db: str | None, shown: str) -> None:
    """Refuse a path's database and a different ``db`` parameter: redis-py would use
    the parameter's, where errors, ``inspect()`` and the CLI show the path's. The
    parameter's value is not quoted (it may be a password's tail)."""
    if path not in ("", "/") and db is not None and int(db) != int(path[1:]):
        raise ValueError(
            f"master URL {shown!r} names two databases: {path} in its path and another in"
            " its db parameter, which redis-py would use (give one)"
        )


def _check_unix(parts: SplitResult, port: int | None, shown: str) -> None:
    if parts.hostname or port is not None:
        raise ValueError(
            f"master URL {shown!r} names a host: a socket path starts after"
            " 'unix://' (unix:///run/valkey.sock, with three slashes)"
        )
    _check_path(parts.path, f"master URL {shown!r}")


def _check_host(host: object, master: str) -> None:
    if not isinstance(host, str) or not host:
        raise ValueError(f"{master} names no host")


def _check_port(port: object, master: str) -> None:
    """Refuse a port no connection could use: 0, or not a number from 1 to 65535
    (a client's may be one in ASCII digits: redis-py takes ``int(port)``)."""
    if isinstance(port, str) and is_number(port):
        port = int(port)
    if port == 0:
        raise ValueError(f"{master} has port 0")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{master} has an invalid port")


def _check_path(path: object, master: str) -> None:
    if not isinstance(path, str) or not path:
        raise ValueError(f"{master} names no socket path")


def check_client_settings(kwargs: Mapping[str, object], master: str, *, address: bool) -> None:
    """Refuse the settings of a ready client's connections (a pool's or a cluster
    node's ``connection_kwargs``) by the rules of a URL's, which would fail (or hang
    on) each connection: its host and port, or socket path (``path``), if
    ``address``; ``db``, ``socket_timeout``, ``socket_connect_timeout`` and
    ``client_name``, when set. Errors start with ``master`` (who they are of).

    Raises:
        TypeError: A timeout is not a number.
        ValueError: A setting is refused (see `checked`, `options`).
    """
    if "path" in kwargs:  # a UnixDomainSocketConnection's
        _check_path(kwargs["path"], master)
        _check_sendable(str(kwargs["path"]), master)
    elif address:  # else a Sentinel-managed connection's: its sentinels say where
        _check_host(kwargs.get("host"), master)
        _check_sendable(str(kwargs.get("host")), master)
        _check_port(kwargs.get("port", DEFAULT_PORT), master)
    for name in ("socket_timeout", "socket_connect_timeout"):
        if kwargs.get(name) is not None:
            try:
                check_seconds(name, kwargs[name])
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{master}: {exc}") from None
    db = kwargs.get("db")  # redis-py sends SELECT with it: an int, or one in digits
    if db is not None and (isinstance(db, bool) or not _db_number(str(db))):
        raise ValueError(f"{master}: db must be a database number, got {db!r}")
    client_name = kwargs.get("client_name")
    why = _invalid("client_name", client_name) if isinstance(client_name, str) else None
    if why:
        raise ValueError(f"{master}: {why}")


def options(query: str, known: tuple[str, ...], shown: str) -> dict[str, str]:
    """The parameters of a URL's ``query``, each once and named in ``known``;
    ``db`` a number, ``socket_timeout`` and ``socket_connect_timeout`` durations
    as the `socket_timeout` setting takes.

    Raises:
        ValueError: One is not, named with the URL ``shown``.
    """
    if "@" in query:  # likely a password's tail: not quoted in the error
        raise ValueError(
            f"master URL {shown!r}: its query holds an '@' (a '?' or '#' in a password,"
            " or an '@' in a value, must be %-encoded: %3F, %23, %40)"
        )
    found = parse_qs(query, keep_blank_values=True)
    # A password holding an unencoded '&' splits: its tail reads as a parameter of
    # its own. With a password in the query, no name or value beyond it is quoted.
    secret = not _SECRETS.isdisjoint(found)
    for name, values in found.items():
        if name not in known:
            hidden = secret and name not in _SECRETS  # a password's tail, maybe
            what = _HIDDEN if hidden else f"unknown parameter {name!r}"
            raise ValueError(f"master URL {shown!r}: {what} (it takes {', '.join(known)})")
        if len(values) > 1:
            raise ValueError(f"master URL {shown!r} gives the parameter {name!r} twice")
        why = _invalid(name, values[0])
        if why:
            shown_why = f"the value of {name!r} is not valid (not shown)" if secret else why
            raise ValueError(f"master URL {shown!r}: {shown_why}")
    return {name: values[0] for name, values in found.items()}


def _invalid(name: str, value: str) -> str | None:
    """Why redis-py would take ``value`` of the parameter ``name`` in vain, if so."""
    if name == "db" and not _db_number(value):
        return f"db must be a database number, got {value!r}"
    if name in _FLAGS and value.upper() not in _FLAG_WORDS:
        return f"{name} must be true or false (or 1, 0, yes, no), got {value!r}"
    if name in ("socket_timeout", "socket_connect_timeout"):
        try:
            check_seconds(name, float(value))
        except ValueError as exc:  # float() of a word, or a duration out of range
            return str(exc) if name in str(exc) else f"{name} must be seconds, got {value!r}"
    if name == "client_name" and not all("!" <= char <= "~" for char in value):
        return f"client_name may not hold spaces or special characters, got {value!r}"
    if name == "ssl_min_version" and not (is_number(value) and int(value) in _TLS_VERSIONS):
        return f"ssl_min_version must be an ssl.TLSVersion number, got {value!r}"
    if name in ("encoding", "encoding_errors"):
        try:
            (codecs.lookup if name == "encoding" else codecs.lookup_error)(value)
        except LookupError:
            return f"{name} must name a codec or error handler Python knows, got {value!r}"
    return None


def check_sendable(url: str, shown: str) -> None:
    """Refuse, at construction, a URL no connection could send: a lone surrogate
    (no UTF-8 encoding) or a NUL (plain or %-encoded), which would fail every
    connection to that master later.

    Raises:
        ValueError: It holds one, named with the URL ``shown``.
    """
    _check_sendable(url, f"master URL {shown!r}", quoted=True)


def _check_sendable(text: str, master: str, *, quoted: bool = False) -> None:
    """Refuse ``text`` (%-encoded if ``quoted``) holding a lone surrogate or a NUL."""
    try:
        raw = text.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{master} holds a character with no UTF-8 encoding") from None
    if b"\0" in (unquote_to_bytes(text) if quoted else raw):
        raise ValueError(f"{master} holds a NUL character")


def _db_number(text: str) -> bool:
    """A database number ``SELECT`` takes: ASCII digits, at most 2**31 - 1."""
    return is_number(text) and int(text) < 2**31


def is_number(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits (`str.isdigit` also takes
    ``'²'`` and ``'٣'``)."""
    return text.isascii() and text.isdigit()


def display(parts: SplitResult) -> str:
    """The URL with any password (and query) removed; an IPv6 address in brackets."""
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    netloc = bracketed(parts.hostname or "")
    if parts.port:
        netloc += f":{parts.port}"
    if parts.username:
        netloc = f"{parts.username}@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def bracketed(host: object) -> str:
    """A host for a URL: an IPv6 address in brackets."""
    text = str(host)
    return f"[{text}]" if ":" in text else text


def redacted(url: str) -> str:
    """``url`` without its password, query or fragment, for a message about a URL
    that may not parse: the user part ends at the last ``@`` (as in `urllib.parse`),
    its password at the first ``:`` after ``//``; ``?`` and ``#`` end the rest (a
    Sentinel URL's query may hold the sentinels' password). An ``@`` after the
    first ``?`` or ``#`` leaves no telling what is a password (one holding an
    unencoded ``?``, or one in the query): only the scheme is shown."""
    start = url.find("//")
    prefix = url[: start + 2] if start >= 0 else ""
    rest = url[len(prefix) :]
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    if "@" in rest[cut:]:
        return f"{prefix}..."
    head, at, tail = url.rpartition("@")
    if at:
        start = head.find("//")
        prefix, userinfo = (head[: start + 2], head[start + 2 :]) if start >= 0 else ("", head)
        user = userinfo.partition(":")[0]
        for end in "/?#":  # an "@" in the path or query: nothing before it is shown
            user = user.partition(end)[0]
        url = f"{prefix}{user}@{tail}" if user else f"{prefix}{tail}"
    return _ports_hidden(url.partition("?")[0].partition("#")[0])


def _ports_hidden(url: str) -> str:
    """``url`` with each port that is not a number shown as ``...``: it may be a
    password (``redis://user:secret``, its ``@`` and host forgotten or cut off)."""
    start = url.find("//")
    if start < 0:
        return url
    end = url.find("/", start + 2)
    end = len(url) if end < 0 else end
    user, at, hosts = url[start + 2 : end].rpartition("@")
    shown = ",".join(map(_port_hidden, hosts.split(",")))  # a Sentinel URL's list too
    return f"{url[: start + 2]}{user}{at}{shown}{url[end:]}"


def _port_hidden(host: str) -> str:
    name, colon, port = host.rpartition(":")
    if not colon or not port or host.endswith("]") or (port.isascii() and port.isdigit()):
        return host
    return f"{name}:..."
