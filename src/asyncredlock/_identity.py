"""Which server a master is, in a normal form, so that one server given twice,
spelled two ways, is refused rather than counted as two masters of a quorum.

A master's identity is a set of keys; two masters sharing a key are one server.
Nothing is looked up (no DNS, no I/O): a host is taken as the connection would
read it (redis-py %-decodes a URL's host and socket path), an IP address in its
one spelling, a name lower-cased. The database is no part of it: two databases
of one server are one process, lost together.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import SplitResult, unquote

__all__ = ["DEFAULT_PORT", "Identity", "client_identity", "sentinel_identity", "url_identity"]

#: The port redis-py connects to when a URL or client names none.
DEFAULT_PORT = 6379
#: The keys of one master (see the module's docstring).
Identity = frozenset[tuple[object, ...]]


def normal_host(host: str) -> str:
    """``host`` as one server has it whatever its spelling: an IP address in any
    form the system's resolver reads without DNS (``0:0::1``, ``::ffff:127.0.0.1``,
    ``127.1``) in its short form, an IPv4-mapped IPv6 address as the IPv4 one, a
    scoped IPv6 address with its zone (``fe80::1%lo`` and ``fe80::1%eth0`` are on
    different links: different machines); a name lower-cased, without a final dot."""
    try:
        info = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
        sockaddr = info[0][4]
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
    except (OSError, UnicodeError, ValueError, IndexError):  # a name, not an address
        return host.lower().removesuffix(".")
    mapped = getattr(address, "ipv4_mapped", None)
    scope = sockaddr[3] if len(sockaddr) > 3 else 0  # an IPv6 zone: the link it is on
    return str(mapped or address) + (f"%{scope}" if scope and mapped is None else "")


def _tcp(host: str, port: object) -> tuple[object, ...]:
    return ("tcp", normal_host(host), int(str(port or DEFAULT_PORT)))


def _unix(path: str) -> tuple[object, ...]:
    path = os.path.normpath(path)
    if path.startswith("//"):  # POSIX keeps a leading "//"; Linux reads it as "/"
        path = "/" + path.lstrip("/")
    return ("unix", path)


def url_identity(parts: SplitResult, port: int | None) -> Identity:
    """The identity of a checked ``redis://``, ``rediss://`` or ``unix://`` URL,
    its host or socket path %-decoded as redis-py decodes them."""
    if parts.scheme == "unix":
        return frozenset({_unix(unquote(parts.path))})
    return frozenset({_tcp(unquote(parts.hostname or ""), port)})


def sentinel_identity(service: str, sentinels: Iterable[tuple[str, object]]) -> Identity:
    """The identity of a master found through ``sentinels`` under ``service``: a
    sentinel monitors one master by a name, so two lists with one sentinel in
    common name one master."""
    return frozenset((("sentinel", service), _tcp(str(host), port)) for host, port in sentinels)


def client_identity(client: Any) -> Identity:
    """The identity of a ready redis-py (or valkey-py) client, read from its
    connection settings as a URL's would be: its host and port or socket path, its
    sentinels and service, or a cluster's startup nodes; itself, if none is known."""
    own: Identity = frozenset({("client", id(client))})
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:  # a cluster client: one server of it is one master
        nodes = getattr(manager, "startup_nodes", {}).values()
        return own | {_tcp(node.host, node.port) for node in nodes}
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", ())
    if service is not None and sentinels:
        found = [sentinel.connection_pool.connection_kwargs for sentinel in sentinels]
        return own | sentinel_identity(service, ((k.get("host"), k.get("port")) for k in found))
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {})
    if kwargs.get("path"):
        return own | {_unix(str(kwargs["path"]))}
    if kwargs.get("host"):
        return own | {_tcp(str(kwargs["host"]), kwargs.get("port"))}
    return own
