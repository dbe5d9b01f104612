"""Master URLs (``redis://``, ``rediss://``, ``unix://``) checked at construction,
and shown without their password."""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["SCHEMES", "SENTINEL", "bracketed", "checked", "display", "is_number", "redacted"]

SCHEMES = ("redis", "rediss", "unix")
#: The scheme of a master named by its sentinels (read by `_sentinel`).
SENTINEL = "redis-sentinel"


def checked(url: str) -> tuple[SplitResult, int | None]:
    """``url`` split, and its port.

    Raises:
        ValueError: The URL is not one of a master, named without its password.
    """
    shown = redacted(url)  # errors never show the password
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
    if parts.scheme == "unix":
        _check_unix(parts, port, shown)
        return parts, port
    if not parts.hostname:
        raise ValueError(f"master URL {shown!r} names no host")
    if port == 0:
        raise ValueError(f"master URL {shown!r} has port 0")
    if parts.path not in ("", "/") and not is_number(parts.path[1:]):
        raise ValueError(f"master URL {shown!r}: the path must be a database number")
    return parts, port


def _check_unix(parts: SplitResult, port: int | None, shown: str) -> None:
    if parts.hostname or port is not None:
        raise ValueError(
            f"master URL {shown!r} names a host: a socket path starts after"
            " 'unix://' (unix:///run/valkey.sock, with three slashes)"
        )
    if not parts.path:
        raise ValueError(f"master URL {shown!r} names no socket path")


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
    Sentinel URL's query may hold the sentinels' password)."""
    head, at, tail = url.rpartition("@")
    if at:
        start = head.find("//")
        prefix, userinfo = (head[: start + 2], head[start + 2 :]) if start >= 0 else ("", head)
        user = userinfo.partition(":")[0]
        for end in "/?#":  # an "@" in the path or query: nothing before it is shown
            user = user.partition(end)[0]
        url = f"{prefix}{user}@{tail}" if user else f"{prefix}{tail}"
    return url.partition("?")[0].partition("#")[0]
