"""The masters an ``AsyncRedlock`` is given (URLs, or redis-py clients) made into
`Node` objects: one connection of its own per master, set up like the client's."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.connection import SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from ._config import Settings
from ._identity import Identity, client_identity, url_identity
from ._node import Node
from ._sentinel import SCHEME as SENTINEL
from ._sentinel import OwnedClient, display_name, parse_sentinel_url
from ._tls import (
    CLIENT_CERTIFICATE_HINT,
    certificate_error,
    ended_by_master,
    lost_reason,
    settings_error,
)
from ._urls import bracketed, check_client_settings, checked, display, redacted
from ._wire import Stream

__all__ = ["NO_CLIENT_SETINFO", "ClusterOpener", "RedisPyOpener", "make_node", "make_nodes"]

#: redis-py settings that send no CLIENT SETINFO on a new connection (one round trip
#: instead of three; a user made from `acl_rules()` may not run it).
try:  # redis-py >= 7.1 names the library through driver_info
    from redis.driver_info import DriverInfo

    NO_CLIENT_SETINFO: dict[str, Any] = {"driver_info": DriverInfo(name=None, lib_version=None)}
except ImportError:  # pragma: no cover - older redis-py
    NO_CLIENT_SETINFO = {"lib_name": None, "lib_version": None}


class RedisPyOpener:
    """Opens connections with a redis-py connection class and its settings.

    redis-py connects and runs the handshake (TLS, AUTH, SELECT, CLIENT SETNAME...);
    a TLS certificate that fails verification raises a `CertificateError` that
    names the master and why. Then the socket is detached from its stream reader
    and writer and given to ``protocol``: redis-py keeps no reference to it.

    Args:
        connection_class: A ``redis.asyncio`` connection class (TCP, TLS, unix
            socket, Sentinel-managed).
        kwargs: Its constructor arguments.
    """

    def __init__(self, connection_class: Any, kwargs: dict[str, Any]) -> None:
        self.connection_class = connection_class
        self.kwargs = kwargs

    async def __call__(self, protocol: Stream) -> None:
        connection = self.connection_class(**self.kwargs)
        try:
            await connection.connect()
            reader: asyncio.StreamReader = connection._reader
            writer: asyncio.StreamWriter = connection._writer
        except BaseException as exc:
            _forget(connection, close=True)
            refused = certificate_error(exc, _address(connection))
            if refused is not None:
                raise refused from exc
            tls = isinstance(connection, SSLConnection)  # never a cancellation turned error
            if tls and isinstance(exc, Exception) and ended_by_master(exc):
                raise RedisConnectionError(f"{exc}{CLIENT_CERTIFICATE_HINT}") from exc
            raise
        leftover = bytes(getattr(reader, "_buffer", b""))
        _forget(connection, close=False)
        transport = cast(asyncio.Transport, writer.transport)
        said = _refusal(leftover) if leftover else None
        if said or transport.is_closing() or reader.exception() is not None or reader.at_eof():
            # ended before it was ours (the master, or the loop busy since the handshake),
            # or refused: an error nothing asked for (maxclients, protected mode's -DENIED)
            transport.abort()
            unanswered = None if said else transport
            why = lost_reason(_address(connection), reader.exception(), unanswered, said)
            raise RedisConnectionError(why)
        protocol.opened_by = writer
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if leftover:
            protocol.data_received(leftover)
        if not transport.is_reading():  # a full stream buffer may have paused it
            transport.resume_reading()


class ClusterOpener:
    """Opens the wake-up subscription of a Redis Cluster master: a connection to
    one node of the cluster, with that node's settings from the cluster client.

    A ``PUBLISH`` (a release's announcement) in a cluster is passed to every node
    over the cluster bus, so a subscription on any one node hears the releases of
    every slot. The first call takes a node at random (so that the clients of a
    cluster spread their subscriptions over its nodes), each later one the next
    node the client knows of, so that after a node is lost the listener comes back
    on another one.

    Args:
        client: The ``RedisCluster`` (or ``ValkeyCluster``) client of the master.
        connect_timeout: Connect timeout when the client sets none.
    """

    def __init__(self, client: Any, connect_timeout: float) -> None:
        self.client = client
        self.connect_timeout = connect_timeout
        self.turn = secrets.randbelow(1 << 16)

    async def __call__(self, protocol: Stream) -> None:
        nodes = self.client.get_nodes()
        if not nodes:
            raise ConnectionError("the cluster client knows no node yet")
        node = nodes[self.turn % len(nodes)]
        self.turn += 1
        kwargs = dict(node.connection_kwargs)
        if kwargs.get("socket_connect_timeout") is None:
            kwargs["socket_connect_timeout"] = self.connect_timeout
        await RedisPyOpener(node.connection_class, {**kwargs, **_OWN_CONNECTION})(protocol)


def _address(connection: Any) -> str:
    """``host:port`` of a redis-py TCP or TLS connection (its master, once a
    Sentinel-managed one has connected), for errors."""
    return f"{getattr(connection, 'host', '?')}:{getattr(connection, 'port', '?')}"


def _refusal(leftover: bytes) -> str | None:
    """The error reply ``leftover`` (read with the handshake's replies, before any request
    of ours) begins with, if any: a master refusing the connection says why, then closes."""
    reader = hiredis.Reader()
    reader.feed(leftover)
    with contextlib.suppress(hiredis.ProtocolError):
        reply = reader.gets()
        return str(reply) if isinstance(reply, hiredis.ReplyError) else None
    return None


def _forget(connection: Any, *, close: bool) -> None:
    """Make redis-py let go of its socket (closing it, or leaving it to us)."""
    if close and getattr(connection, "_writer", None) is not None:
        connection._writer.close()
    parser = getattr(connection, "_parser", None)
    if parser is not None:
        with contextlib.suppress(Exception):
            parser.on_disconnect()
    connection._reader = connection._writer = None


#: Said to a caller who gave one URL where a list of them belongs.
_ONE_URL = ": pass the URLs in a list ([url] for one master)"


def make_nodes(masters: object, settings: Settings) -> list[Node]:
    if isinstance(masters, str | bytes) or not isinstance(masters, Sequence):
        raise TypeError(
            "masters must be a sequence of URLs or redis.asyncio/valkey.asyncio clients,"
            f" not {type(masters).__name__}{_ONE_URL if isinstance(masters, str) else ''}"
        )
    if not masters:
        raise ValueError("masters must name at least one Redis/Valkey master")
    nodes: list[Node] = []
    seen: dict[object, str] = {}  # each key of an identity: the name it came with
    for master in masters:
        node, identity = make_node(master, settings)
        other = next((seen[key] for key in identity if key in seen), None)
        if other is not None:
            spelled = "" if other == node.name else f" (first as {other!r}: one server)"
            raise ValueError(f"master {node.name!r} is given twice{spelled}")
        seen.update(dict.fromkeys(identity, node.name))
        nodes.append(node)
    return nodes


def make_node(master: object, settings: Settings) -> tuple[Node, Identity]:
    if isinstance(master, str):
        return _node_from_url(master, settings)
    kind = _valkey_kind(master)
    client: Any = master  # a redis-py client, or valkey-py's fork with the same API
    if isinstance(master, RedisCluster) or kind == "cluster":
        _check_client(client)
        listen = ClusterOpener(client, settings.socket_timeout)
        node = Node(
            _client_name(client),
            client=client,
            owned=False,
            listen_opener=listen,
            node_timeout=settings.node_timeout,
            socket_timeout=settings.socket_timeout,
        )
        return node, client_identity(master)
    if isinstance(master, Redis) or kind == "client":
        pool = client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        _check_client(client)
        _check_client_tls(client, pool.connection_class, kwargs)
        for timeout in ("socket_connect_timeout", "socket_timeout"):  # the handshake too
            if kwargs.get(timeout) is None:
                kwargs[timeout] = settings.socket_timeout
        opener = RedisPyOpener(pool.connection_class, {**kwargs, **_OWN_CONNECTION})
        node = _linked(_client_name(client), opener, settings)
        node.client = client  # kept alive: a Sentinel pool is referenced weakly
        return node, client_identity(master)
    raise TypeError(
        "each master must be a URL string or a redis.asyncio Redis/RedisCluster or"
        f" valkey.asyncio Valkey/ValkeyCluster client, not {type(master).__name__}"
    )


def _check_client(client: Any) -> None:
    """Refuse a ready client whose connection settings asyncredlock copies (or, for
    a cluster, whose startup nodes it uses as they are) by the rules of a URL's: a
    bad port, no host or socket path, a timeout NaN, negative or infinite, a bad
    database or client name. A Sentinel-managed client's master has no address of
    its own (its sentinels say where it is): its sentinels' are checked instead,
    and a ``slave_for()`` client is refused (a replica answers each SET READONLY)."""
    master = f"master {_client_name(client)!r}"
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:
        for node in manager.startup_nodes.values():
            check_client_settings(node.connection_kwargs, master, address=True)
        return
    pool = client.connection_pool
    sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", None)
    if sentinels is not None and not getattr(pool, "is_master", True):
        service = getattr(pool, "service_name", None)
        raise ValueError(
            f"{master} is a Sentinel slave_for() client, connecting to a replica, which"
            f" refuses every write: give master_for({service!r}) instead"
        )
    check_client_settings(pool.connection_kwargs, master, address=sentinels is None)
    for sentinel in sentinels or ():
        kwargs = sentinel.connection_pool.connection_kwargs
        where = f"{bracketed(kwargs.get('host'))}:{kwargs.get('port')}"
        check_client_settings(kwargs, f"the sentinel {where} of {master}", address=True)


def _check_client_tls(client: Any, connection_class: Any, kwargs: dict[str, Any]) -> None:
    """Refuse a redis-py client whose TLS settings would fail each connect (a file
    missing, a wrong ``ssl_password``, a value redis-py refuses such as
    ``ssl_cert_reqs="maybe"``...), with `ValueError`, as a URL's are."""
    if not (isinstance(connection_class, type) and issubclass(connection_class, SSLConnection)):
        return
    # its TLS settings only: a Sentinel-managed connection class needs its pool
    tls = {key: value for key, value in kwargs.items() if key.startswith("ssl_")}
    try:
        refused = _tls_refused(SSLConnection(**tls))
    except (TypeError, ValueError, RedisError) as exc:
        raise ValueError(f"master {_client_name(client)!r}: {exc}") from None
    if refused is not None:
        raise ValueError(f"master {_client_name(client)!r}: {refused}")


def _valkey_kind(master: object) -> str | None:
    """``"client"`` or ``"cluster"`` for a ``valkey.asyncio`` client (the Valkey
    project's fork of redis-py, with the same connection internals); else None.
    Checked only if valkey is imported already (a client of it implies it is)."""
    valkey = sys.modules.get("valkey.asyncio")
    if valkey is None:
        return None
    if isinstance(master, valkey.ValkeyCluster):
        return "cluster"
    return "client" if isinstance(master, valkey.Valkey) else None


#: What asyncredlock's own connections need, whatever the client they copy:
#: no retries (the lock retries itself), RESP2 (the replies it parses), and no
#: health checks (its connection watches itself).
_OWN_CONNECTION: dict[str, Any] = {
    "retry": Retry(NoBackoff(), 0),
    "protocol": 2,
    "health_check_interval": 0,
}


def _linked(name: str, opener: RedisPyOpener, settings: Settings) -> Node:
    return Node(
        name,
        opener=opener,
        node_timeout=settings.node_timeout,
        socket_timeout=settings.socket_timeout,
        busy_poll=settings.busy_poll,
    )


def _node_from_url(url: str, settings: Settings) -> tuple[Node, Identity]:
    if url.startswith(f"{SENTINEL}://"):
        return _node_from_sentinel(url, settings)
    parts, port = checked(url)
    opener = _url_opener(url, settings)
    # Two databases of one server are one failure domain: one master, not two.
    return _linked(display(parts), opener, settings), url_identity(parts, port)


def _url_opener(url: str, settings: Settings) -> RedisPyOpener:
    """The opener of a checked URL's connections. One connection object is made
    (not opened) now, so that a value redis-py refuses (``ssl_cert_reqs=maybe``) is
    refused at construction rather than when the first connection opens."""
    try:
        # The pool only parses the URL into connection settings; it opens nothing.
        pool = ConnectionPool.from_url(
            url,
            socket_timeout=settings.socket_timeout,
            socket_connect_timeout=settings.socket_timeout,
            # One round trip per new connection instead of three (two CLIENT SETINFO).
            **NO_CLIENT_SETINFO,
        )
        kwargs = {**pool.connection_kwargs, **_OWN_CONNECTION}
        refused = _tls_refused(pool.connection_class(**kwargs))
    except (TypeError, ValueError, RedisError) as exc:
        raise ValueError(f"master URL {redacted(url)!r}: {exc}") from None
    if refused is not None:
        raise ValueError(f"master URL {redacted(url)!r}: {refused}")
    return RedisPyOpener(pool.connection_class, kwargs)


def _tls_refused(connection: Any) -> str | None:
    """Why a (not opened) redis-py connection's TLS settings would fail each of its
    connects: a file missing or unreadable, a wrong ``ssl_password``...; else None."""
    context = getattr(connection, "ssl_context", None)
    return None if context is None else settings_error(context)


def _node_from_sentinel(url: str, settings: Settings) -> tuple[Node, Identity]:
    """A master found through its sentinels, again on every new connection."""
    master = parse_sentinel_url(url)
    client = master.client(settings.socket_timeout)
    pool = client.connection_pool
    opener = RedisPyOpener(pool.connection_class, {**pool.connection_kwargs, **_OWN_CONNECTION})
    node = _linked(master.name, opener, settings)
    node.client, node.owned = OwnedClient(client), True
    return node, master.identity


def _client_name(client: Any) -> str:
    """A client's display name: its URL, ``redis-cluster://host:port`` (the first
    startup node) or ``redis-sentinel://host:port/service`` (the first sentinel)."""
    if isinstance(client, RedisCluster) or hasattr(client, "nodes_manager"):
        node = next(iter(client.nodes_manager.startup_nodes.values()), None)
        if node is not None:
            return f"redis-cluster://{bracketed(node.host)}:{node.port}"
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", ())
    if service is not None and sentinels:
        first = sentinels[0].connection_pool.connection_kwargs
        return display_name(first.get("host"), first.get("port"), service)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {})
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host, port = kwargs.get("host"), kwargs.get("port")
    if host is not None:
        return f"redis://{bracketed(host)}:{port}/{kwargs.get('db', 0)}"
    return f"{type(client).__name__}@{id(client):x}"
