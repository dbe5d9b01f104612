"""``AsyncRedlock``: the masters, the settings, and the locks made over them."""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import SplitResult, urlsplit, urlunsplit

import anyio
from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ._config import Settings, check_name, check_seconds
from ._core import Core, channel, classify_deleted, queue_keys, readers_key
from ._errors import QuorumUnavailableError
from ._keys import aux_key, lock_key
from ._lock import Lock
from ._node import Node, Reply
from ._quorum import quorum_of
from ._rwlock import RWLock
from ._scripts import DELETE, INSPECT
from ._transport import RedisPyOpener

__all__ = ["AsyncRedlock", "LockState", "NodeLockState", "RedlockStatistics"]

logger = logging.getLogger("asyncredlock")

_SCHEMES = ("redis", "rediss", "unix")

try:  # redis-py >= 7.1 names the library through driver_info
    from redis.driver_info import DriverInfo

    _NO_CLIENT_SETINFO: dict[str, Any] = {"driver_info": DriverInfo(name=None, lib_version=None)}
except ImportError:  # pragma: no cover - older redis-py
    _NO_CLIENT_SETINFO = {"lib_name": None, "lib_version": None}


@dataclass(frozen=True, slots=True)
class RedlockStatistics:
    """Counters and gauges of one ``AsyncRedlock`` (see ``AsyncRedlock.statistics()``).

    Attributes:
        attempts: Acquisition rounds sent to the masters (including rounds cut
            short by cancellation, which count in neither of the next two).
        acquisitions: Attempts that took the lock.
        failed_attempts: Attempts that did not (contention, outage or validity).
        timeouts: ``LockTimeoutError`` raised.
        unavailable: ``QuorumUnavailableError`` raised by acquisition.
        extensions: Successful extensions (automatic or explicit).
        failed_extensions: Extension rounds that did not reach a quorum in time.
        releases: Release rounds started.
        lost: Leases lost while held (not extended in time, or found taken).
        handoffs: Leases passed on release straight to the next task of this
            ``AsyncRedlock`` waiting for the same key, with no call to the masters
            (counted in neither ``acquisitions`` nor ``releases``).
        held: Leases held right now.
        background_tasks: Background tasks running (calls still out, extenders).
        in_flight: Calls to masters waiting for a reply right now.
        notifications: Release announcements received from the masters (each
            release is announced by every master that deleted the key).
        wakeups: Waiting acquisitions woken by a release announcement (at most
            one per release), instead of waiting out their retry delay.
    """

    attempts: int
    acquisitions: int
    failed_attempts: int
    timeouts: int
    unavailable: int
    extensions: int
    failed_extensions: int
    releases: int
    lost: int
    handoffs: int
    held: int
    background_tasks: int
    in_flight: int
    notifications: int
    wakeups: int


@dataclass(frozen=True, slots=True)
class NodeLockState:
    """A lock's state on one master, as ``AsyncRedlock.inspect()`` saw it.

    Attributes:
        node: The master's display name.
        holder: The value in the lock key (the holder's random id), or ``None``.
        ttl: Seconds until the key expires, or ``None`` when there is no key or
            it has no expiry.
        fence: The resource's fence counter there, or ``None`` when it has none.
        error: Why the master could not be read, or ``None``.
        readers: The readers of the resource's read-write lock there: each
            reader's value and the seconds until its entry lapses.
        queue: The waiters queued there for a fair or read-write lock, in
            arrival order: ``r:...`` for a reader, ``w:...`` for a writer.
    """

    node: str
    holder: str | None
    ttl: float | None
    fence: int | None
    error: str | None = None
    readers: tuple[tuple[str, float], ...] = ()
    queue: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LockState:
    """A lock's state on every master.

    Attributes:
        resource: The resource name.
        key: The lock key.
        nodes: One entry per master, in the order they were given.
    """

    resource: str
    key: str
    nodes: tuple[NodeLockState, ...]

    @property
    def holder(self) -> str | None:
        """The holder value found on a majority of masters, or ``None``."""
        quorum = quorum_of(len(self.nodes))
        values = [n.holder for n in self.nodes if n.holder is not None]
        for value in set(values):
            if values.count(value) >= quorum:
                return value
        return None


class AsyncRedlock:
    """Redlock over N independent Redis or Valkey masters.

    Construction does no I/O: connections open on first use. Use it as
    ``async with AsyncRedlock(...) as redlock:`` or call `aclose` when done.

    Args:
        masters: The masters, as URLs (``redis://``, ``rediss://``, ``unix://``) or
            ready ``redis.asyncio`` clients (``Redis`` or ``RedisCluster``); any mix.
            A client you pass is used as configured and not closed by ``aclose()``.
            Use an odd number: N masters tolerate ``(N - 1) // 2`` failures.
        ttl: Default time to live of a lock key, in seconds (10.0). Long enough to
            ride out a GC pause or a network blip, short enough that a crashed
            holder frees the resource soon; leases extend themselves, so work
            longer than the TTL is covered.
        timeout: Default time `Lock.acquire` waits for a contended lock
            (10.0 s); ``0`` makes one attempt, ``math.inf`` waits without limit.
        node_timeout: How long a master may stay silent before an acquisition
            round counts its call as failed (0.1 s): far above a LAN round trip,
            small against the TTL, so a dead master costs at most 1% of a default
            lease's validity. A master that keeps answering other calls is waited
            for (up to ``socket_timeout``), and so is every master while this
            process's event loop runs late: an overloaded client does not take
            healthy masters for dead ones. Release waits for masters up to
            ``socket_timeout``; extension up to the lease's remaining validity.
        retry_delay: Upper bound of the jittered pause between attempts (0.2 s);
            each pause is uniform in ``[0, retry_delay]`` (full jitter).
        drift_factor: Clock drift allowance as a fraction of the TTL (0.01, as in
            the Redlock description); 2 ms are always added. Must be in ``[0, 0.5)``.
        prefix: Prepended to every resource name to form its key (none by default,
            so the key is the name and other Redlock clients interoperate).
        max_connections: Deprecated, and ignored: each master is reached through
            one pipelined connection (plus one for wake-ups), whatever the
            number of concurrent lockers. Passing it warns.
        socket_timeout: The connect timeout (unless a client you pass sets its
            own), how long a master may stay silent with calls out before its
            connection is dropped and those calls fail (5.0 s), and the longest
            any round waits.
        auto_extend: Whether leases extend themselves by default (True).
        fencing: Whether leases carry fencing tokens by default (True). A fenced
            acquisition takes the lock and counts the resource's fence counter
            up on each master, then commits the token on a majority in a second
            round, unless a majority already counted exactly that token (the
            usual case once the counters are in step). ``False`` gives plain
            Redlock, with ``lease.token`` ``None``.
        clock: The monotonic clock for validity (``time.monotonic``); replace it
            only in tests.

    Raises:
        TypeError: A master or setting has the wrong type.
        ValueError: No masters, a duplicated or malformed master, or a setting out
            of range.
    """

    def __init__(
        self,
        masters: Sequence[str | Redis | RedisCluster],
        *,
        ttl: float = 10.0,
        timeout: float = 10.0,
        node_timeout: float = 0.1,
        retry_delay: float = 0.2,
        drift_factor: float = 0.01,
        prefix: str = "",
        max_connections: int | None = None,
        socket_timeout: float = 5.0,
        auto_extend: bool = True,
        fencing: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_connections is not None:
            warnings.warn(
                "max_connections is deprecated and ignored: asyncredlock sends every call to"
                " a master on one pipelined connection",
                DeprecationWarning,
                stacklevel=2,
            )
        self._settings = Settings(
            ttl=ttl,
            timeout=timeout,
            node_timeout=node_timeout,
            retry_delay=retry_delay,
            drift_factor=drift_factor,
            socket_timeout=socket_timeout,
            max_connections=max_connections,
            prefix=prefix,
            auto_extend=auto_extend,
            fencing=fencing,
            clock=clock,
        )
        self._core = Core(_make_nodes(masters, self._settings), self._settings)

    def __repr__(self) -> str:
        names = ", ".join(node.name for node in self._core.nodes)
        return f"<AsyncRedlock [{names}] quorum={self.quorum}>"

    @property
    def masters(self) -> tuple[str, ...]:
        """The masters' display names (URLs without passwords), in order."""
        return tuple(node.name for node in self._core.nodes)

    @property
    def quorum(self) -> int:
        """How many masters must agree: ``N // 2 + 1``."""
        return self._core.quorum

    def lock(
        self,
        name: str | Sequence[str],
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        auto_extend: bool | None = None,
        fencing: bool | None = None,
        fair: bool = False,
    ) -> Lock:
        """A lock on the resource ``name``; nothing is sent until it is acquired.

        The lock is exclusive: it is also the write side of ``rwlock(name)``, so
        it waits while readers of that read-write lock hold it.

        Args:
            name: The resource name; the key is ``prefix + name``. A list or tuple
                of names makes one lock on all of them: each master grants all or
                none (one script), the lease holds them together, and with fencing
                it carries one token per resource (``lease.tokens``). With cluster
                clients as masters, their keys must share one cluster slot (give
                them a common hash tag, e.g. ``"{order:7}:items"``).
            ttl: Time to live in seconds; the ``AsyncRedlock``'s default if omitted.
            timeout: Seconds to wait when contended (``0``: one attempt,
                ``math.inf``: no limit); the default if omitted.
            auto_extend: Whether leases extend themselves; the default if omitted.
            fencing: Whether leases carry a fencing token; the default if omitted.
            fair: Serve waiters in arrival order, through a queue on the masters
                (one resource only). Each waiting ``acquire()`` has an entry there,
                refreshed by its attempts, that lapses about a second after its
                last one if it dies; the lock goes only to the first entry. Off by
                default: unfair is faster (tasks of one process pass the lock on
                between them).

        Raises:
            TypeError: ``name`` is not a str (or a list or tuple of them), or a
                setting has the wrong type.
            ValueError: A name is empty, the list is empty or names a resource
                twice, ``fair=True`` is asked of several resources, the keys span
                several cluster slots on cluster masters, ``ttl`` is not positive
                and finite, or ``timeout`` is negative or NaN.
            RuntimeError: This ``AsyncRedlock`` is closed.
        """
        self._check_open()
        names = _check_names(name)
        if not isinstance(fair, bool):
            raise TypeError("fair must be a bool")
        if fair and len(names) > 1:
            raise ValueError("fair=True takes one resource, not a list of them")
        return Lock.make(
            self._core,
            names,
            ttl=ttl,
            timeout=timeout,
            auto_extend=auto_extend,
            fencing=fencing,
            fair=fair,
        )

    def rwlock(self, name: str, *, fair: bool = False, patience: float = 1.0) -> RWLock:
        """A read-write lock on the resource ``name``: many readers or one writer.

        ``rw.read()`` and ``rw.write()`` make locks used like ``lock()``'s. The
        write side is the exclusive lock on ``name`` (``lock(name)`` excludes
        readers too). See `RWLock`.

        Args:
            name: The resource name; the key is ``prefix + name``.
            fair: Serve readers and writers in arrival order, through a queue on
                the masters: a writer that arrives after readers waits for them,
                and readers that arrive after a waiting writer wait for it.
            patience: Unfair mode: seconds a writer waits before it queues on the
                masters, after which readers that arrive later wait behind it
                (1.0; ``0``: at once, ``math.inf``: never, readers first). Not
                used with ``fair=True``, where every waiter queues at once.

        Raises:
            TypeError: ``name`` is not a str, or a setting has the wrong type.
            ValueError: ``name`` is empty, or ``patience`` is negative or NaN.
            RuntimeError: This ``AsyncRedlock`` is closed.
        """
        self._check_open()
        name = check_name(name)
        if not isinstance(fair, bool):
            raise TypeError("fair must be a bool")
        patience = check_seconds("patience", patience, allow_zero=True, allow_inf=True)
        key = lock_key(self._settings.prefix, name)
        return RWLock(self._core, name, key, fair=fair, patience=patience)

    async def inspect(self, name: str) -> LockState:
        """Read a lock's state on every master: holder (the writer), time left,
        fence counter, readers and queue.

        Waits for every master, at most ``max(node_timeout, socket_timeout)``; one
        that did not answer by then is reported with its error.

        Raises:
            TypeError: ``name`` is not a str.
            ValueError: ``name`` is empty.
            RuntimeError: This ``AsyncRedlock`` is closed.
        """
        key = lock_key(self._settings.prefix, check_name(name))
        keys = (key, aux_key(key, "fence"), readers_key(key), *queue_keys(key))
        rnd = self._core.fan_out(lambda _, node: node.call(INSPECT, keys, ()))
        await asyncio.wait(rnd.tasks, timeout=self._core.timing.max_wait)
        nodes = tuple(
            _node_state(node.name, task.result() if task.done() else None, self._settings)
            for node, task in zip(self._core.nodes, rnd.tasks, strict=True)
        )
        return LockState(name, key, nodes)

    async def force_release(self, name: str) -> int:
        """Delete a lock's key on every master, whoever holds it: an operator's tool.

        The readers of a read-write lock on ``name`` are removed too.

        A holder elsewhere is not told until its next extension finds the lock
        gone (then its lease is lost); leases of this ``AsyncRedlock`` on the
        lock are lost at once (their ``async with`` blocks are cancelled), and its
        tasks waiting for the lock go on to acquire it. Use it only to free a lock
        whose holder is known dead.
        Waits for every master up to ``max(node_timeout, socket_timeout)`` in all;
        a master that did not answer by then is not counted (its delete may still
        land).

        Returns:
            On how many masters a key was deleted.

        Raises:
            TypeError: ``name`` is not a str.
            ValueError: ``name`` is empty.
            QuorumUnavailableError: So many masters failed or did not answer that
                the lock may still be held.
            RuntimeError: This ``AsyncRedlock`` is closed.
        """
        key = lock_key(self._settings.prefix, check_name(name))
        args = (channel(key),)
        keys = (key, readers_key(key), *queue_keys(key))
        rnd = self._core.fan_out(lambda _, node: node.call(DELETE, keys, args))
        wait = self._core.timing.max_wait
        deadline = time.monotonic() + wait
        decision = await self._core.decide(rnd, classify_deleted, wait=wait)
        if decision.unavailable:
            raise QuorumUnavailableError(
                f"could not force {name!r} free: too many masters failed or did not answer",
                resource=name,
                outcomes=decision.outcomes,
            )
        for lease in [lease for lease in self._core.held if key in lease.keys]:
            lease._lose(decision)
        await asyncio.wait(rnd.tasks, timeout=max(0.0, deadline - time.monotonic()))
        return sum(1 for t in rnd.tasks if t.done() and t.result().value == 1)

    def statistics(self) -> RedlockStatistics:
        """A snapshot of this ``AsyncRedlock``'s counters and gauges."""
        c = self._core.counters
        return RedlockStatistics(
            attempts=c.attempts,
            acquisitions=c.acquisitions,
            failed_attempts=c.failed_attempts,
            timeouts=c.timeouts,
            unavailable=c.unavailable,
            extensions=c.extensions,
            failed_extensions=c.failed_extensions,
            releases=c.releases,
            lost=c.lost,
            handoffs=c.handoffs,
            **self._core.describe(),
        )

    async def settle(self) -> None:
        """Wait until no call to any master is still out.

        Rounds return at quorum; the other masters' replies, and the cleanup that
        follows a failed or cancelled attempt, finish in the background. Await
        this to know they are done (tests, graceful shutdown). Lease extenders
        keep running.
        """
        await self._core.settle()

    async def aclose(self) -> None:
        """Release held leases, finish background calls, close the connections.

        Waits at most ``node_timeout`` in all for the held leases' releases and
        the calls still out, then fails every call still out (the calls waiting
        on them end with an error: ``QuorumUnavailableError`` whose outcomes say
        the ``AsyncRedlock`` was closed) and closes the connections. A lock key
        whose undo was cut short expires with its TTL. Safe to call twice.
        """
        core = self._core
        if core.closed:
            return
        core.gates.close()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self._settings.node_timeout):
                async with anyio.create_task_group() as group:
                    for lease in list(core.held):
                        group.start_soon(lease._release_quietly)
                await core.settle()
            core.closed = True
            # Fail every call still out: the rounds waiting on them decide, and
            # their callers get an error instead of waiting for a hung master.
            for node in core.nodes:
                await node.aclose()
            await core.waker.aclose()
            await core.tracker.aclose()

    def _check_open(self) -> None:
        if self._core.closed:
            raise RuntimeError("this AsyncRedlock is closed")

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _node_state(name: str, reply: Reply | None, settings: Settings) -> NodeLockState:
    if reply is None:
        wait = max(settings.node_timeout, settings.socket_timeout)
        return NodeLockState(name, None, None, None, f"no reply within {wait:g} s")
    if reply.error is not None:
        return NodeLockState(name, None, None, None, f"{type(reply.error).__name__}: {reply.error}")
    value, pttl, fence, readers, queue = reply.value
    holder = _text(value)
    ttl = None if holder is None or pttl is None or int(pttl) < 0 else int(pttl) / 1000
    return NodeLockState(
        name,
        holder,
        ttl,
        None if fence is None else int(fence),
        readers=tuple(
            (str(_text(readers[i])), int(readers[i + 1]) / 1000) for i in range(0, len(readers), 2)
        ),
        queue=tuple(str(_text(queue[i])) for i in range(0, len(queue), 2)),
    )


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _make_nodes(masters: object, settings: Settings) -> list[Node]:
    if isinstance(masters, str | bytes) or not isinstance(masters, Sequence):
        raise TypeError("masters must be a sequence of URLs or redis.asyncio clients")
    if not masters:
        raise ValueError("masters must name at least one Redis/Valkey master")
    nodes: list[Node] = []
    seen: set[object] = set()
    for master in masters:
        node, identity = _make_node(master, settings)
        if identity in seen:
            raise ValueError(f"master {node.name!r} is given twice")
        seen.add(identity)
        nodes.append(node)
    return nodes


def _make_node(master: object, settings: Settings) -> tuple[Node, object]:
    if isinstance(master, str):
        return _node_from_url(master, settings)
    if isinstance(master, RedisCluster):
        node = Node(_client_name(master), client=master, owned=False)
        return node, id(master)
    if isinstance(master, Redis):
        pool = master.connection_pool
        kwargs = dict(pool.connection_kwargs)
        if kwargs.get("socket_connect_timeout") is None:
            kwargs["socket_connect_timeout"] = settings.socket_timeout
        opener = RedisPyOpener(pool.connection_class, {**kwargs, **_OWN_CONNECTION})
        node = _linked(_client_name(master), opener, settings)
        node.client = master  # kept alive: a Sentinel pool is referenced weakly
        return node, id(master)
    raise TypeError(
        "each master must be a URL string or a redis.asyncio Redis/RedisCluster client, "
        f"not {type(master).__name__}"
    )


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
    )


def _node_from_url(url: str, settings: Settings) -> tuple[Node, object]:
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"master URL {url!r} must start with redis://, rediss:// or unix://")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"master URL {url!r} has an invalid port") from exc
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"master URL {url!r} names no host")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"master URL {url!r} names no socket path")
    if parts.scheme != "unix" and port == 0:
        raise ValueError(f"master URL {url!r} has port 0")
    if parts.scheme != "unix" and parts.path not in ("", "/") and not _is_db(parts.path):
        raise ValueError(f"master URL {url!r}: the path must be a database number")
    # The pool only parses the URL into connection settings; it opens nothing.
    pool = ConnectionPool.from_url(
        url,
        socket_timeout=settings.socket_timeout,
        socket_connect_timeout=settings.socket_timeout,
        # One round trip per new connection instead of three (two CLIENT SETINFO).
        **_NO_CLIENT_SETINFO,
    )
    opener = RedisPyOpener(pool.connection_class, {**pool.connection_kwargs, **_OWN_CONNECTION})
    name = _display(parts)
    # Two databases of one server are one failure domain: one master, not two.
    host = (parts.hostname or "").lower()
    identity = (host, port or 6379) if parts.scheme != "unix" else ("unix", parts.path)
    return _linked(name, opener, settings), identity


def _is_db(path: str) -> bool:
    return path[1:].isdigit() and path.startswith("/")


def _display(parts: SplitResult) -> str:
    """The URL with any password (and query) removed."""
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    if parts.username:
        netloc = f"{parts.username}@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _client_name(client: Redis | RedisCluster) -> str:
    kwargs: dict[str, Any] = getattr(
        getattr(client, "connection_pool", None), "connection_kwargs", {}
    )
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host, port = kwargs.get("host"), kwargs.get("port")
    if host is not None:
        return f"redis://{host}:{port}/{kwargs.get('db', 0)}"
    return f"{type(client).__name__}@{id(client):x}"


def _check_names(name: object) -> tuple[str, ...]:
    """One resource name, or a non-empty list or tuple of distinct ones."""
    if isinstance(name, list | tuple):
        if not name:
            raise ValueError("a lock on several resources needs at least one name")
        names = tuple(check_name(each) for each in name)
        if len(set(names)) != len(names):
            twice = sorted({each for each in names if names.count(each) > 1})
            raise ValueError(f"a lock names each resource once; given twice: {twice}")
        return names
    return (check_name(name),)
