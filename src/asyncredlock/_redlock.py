"""``AsyncRedlock``: the masters, the settings, and the locks made over them."""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from redis.asyncio import Redis, RedisCluster

if TYPE_CHECKING:  # the Valkey project's fork of redis-py, accepted if installed
    from valkey.asyncio import Valkey, ValkeyCluster

from ._closing import Closing
from ._config import (
    DEFAULTS,
    LockOptions,
    Settings,
    check_name,
    check_names,
    check_seconds,
    default_identity,
    warn_max_connections,
)
from ._connect import make_nodes
from ._core import Core
from ._keys import lock_key
from ._lease import Lease
from ._lock import Lock
from ._rwlock import RWLock
from ._semaphore import Semaphore, check_limit
from ._singleton import check_singleton, run_singleton
from ._template import NameTemplate, serialize
from ._tools import OperatorTools

__all__ = ["AsyncRedlock"]

P = ParamSpec("P")
T = TypeVar("T")


class AsyncRedlock(OperatorTools, Closing):
    """Redlock over N independent Redis or Valkey masters.

    Construction does no I/O: connections open on first use. Use it as
    ``async with AsyncRedlock(...) as redlock:`` or call `aclose` when done, inside
    the event loop it is used on (one used and dropped unclosed warns: a
    `ResourceWarning`).

    Args:
        masters: The masters, as URLs (``redis://``, ``rediss://``, ``unix://``) or
            ready ``redis.asyncio`` clients (``Redis`` or ``RedisCluster``), or
            ``valkey.asyncio`` ones (``Valkey`` or ``ValkeyCluster``); any mix.
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
        busy_poll: How long, in seconds, to poll for a reply instead of letting
            the event loop sleep (0.0001; 0 never; at most 0.001): after a call
            goes out on an idle connection, and only when the loop has nothing
            else to run (any event of the loop ends it), so that a master that
            answers within that is heard without the cost of waking a sleeping
            process (tens of microseconds on many virtual machines). Misses make
            it poll less and less often.
            Only on asyncio's own event loops (uvloop: never); see
            ``docs/configuration.md``.
        auto_extend: Whether leases extend themselves by default (True).
        max_hold: The longest a lease is held by default, in seconds
            (``math.inf``: no bound). At the bound it ends lost and is released;
            see `lock`.
        fencing: Whether leases carry fencing tokens by default (True). A fenced
            acquisition takes the lock and counts the resource's fence counter
            up on each master, then commits the token on a majority in a second
            round, unless a majority already counted exactly that token (the
            usual case once the counters are in step). ``False`` gives plain
            Redlock, with ``lease.token`` ``None``.
        clock: The monotonic clock for validity (``time.monotonic``); replace it
            only in tests, with a plain function (an async one is a TypeError).
        identity: Who holds the locks taken through this ``AsyncRedlock``, for
            people reading the masters (``"<hostname>:<pid>"`` of the process that
            made it, by default). Each lock value is the identity, a colon and 128
            random bits, so ``inspect()`` (`NodeLockState.identity`) and the CLI
            show it; the key and its layout stay those of every Redlock client.
            At most 128 characters, no whitespace.

    Raises:
        TypeError: A master or setting has the wrong type.
        ValueError: No masters, a duplicated or malformed master, or a setting out
            of range.
    """

    def __init__(
        self,
        masters: Sequence[str | Redis | RedisCluster | Valkey | ValkeyCluster],
        *,
        ttl: float = DEFAULTS.ttl,
        timeout: float = DEFAULTS.timeout,
        node_timeout: float = DEFAULTS.node_timeout,
        retry_delay: float = DEFAULTS.retry_delay,
        drift_factor: float = DEFAULTS.drift_factor,
        prefix: str = DEFAULTS.prefix,
        max_connections: int | None = None,
        socket_timeout: float = DEFAULTS.socket_timeout,
        busy_poll: float = DEFAULTS.busy_poll,
        auto_extend: bool = DEFAULTS.auto_extend,
        max_hold: float = DEFAULTS.max_hold,
        fencing: bool = DEFAULTS.fencing,
        clock: Callable[[], float] = DEFAULTS.clock,
        identity: str | None = None,
    ) -> None:
        if max_connections is not None:
            warn_max_connections()
        self._settings = Settings(
            ttl=ttl,
            timeout=timeout,
            node_timeout=node_timeout,
            retry_delay=retry_delay,
            drift_factor=drift_factor,
            socket_timeout=socket_timeout,
            busy_poll=busy_poll,
            max_connections=max_connections,
            prefix=prefix,
            auto_extend=auto_extend,
            max_hold=max_hold,
            fencing=fencing,
            clock=clock,
            identity=default_identity() if identity is None else identity,
        )
        self._core = Core(make_nodes(masters, self._settings), self._settings)

    def __repr__(self) -> str:
        names = ", ".join(node.name for node in self._core.nodes)
        return f"<AsyncRedlock [{names}] quorum={self.quorum}>"

    @property
    def masters(self) -> tuple[str, ...]:
        """The masters' display names, in order: URLs without passwords,
        ``redis-cluster://host:port`` for a cluster client (a display name only:
        ``masters`` takes a cluster as a ``RedisCluster`` client, not as a URL) and
        ``redis-sentinel://host:port/service`` for a Sentinel-managed one."""
        return tuple(node.name for node in self._core.nodes)

    @property
    def quorum(self) -> int:
        """How many masters must agree: ``N // 2 + 1``."""
        return self._core.quorum

    @property
    def identity(self) -> str:
        """Who holds the locks taken through this ``AsyncRedlock``, as written in
        their values (see the ``identity`` argument)."""
        return self._settings.identity

    def lock(
        self,
        name: str | Sequence[str],
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        auto_extend: bool | None = None,
        fencing: bool | None = None,
        fair: bool = False,
        max_hold: float | None = None,
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
            max_hold: The longest a lease is held, in seconds from its acquisition
                (the default if omitted; ``math.inf``: no bound). No extension,
                automatic or explicit, keeps its keys past the bound; at the bound
                the lease ends lost (`HoldLimitError` from its ``async with``
                block, which is cancelled) and is released on the masters.

        Raises:
            TypeError: ``name`` is not a str (or a list or tuple of them), or a
                setting has the wrong type.
            ValueError: A name is empty, holds a NUL, is not UTF-8 or makes a key that is
                one of the library's auxiliary keys; the list is empty, names a resource
                twice or over 1024 resources; ``fair=True`` is asked of several; the keys
                span several cluster slots on cluster masters; ``ttl`` or ``max_hold`` is
                under 0.01 s, over 1e9 s or not finite (``max_hold`` may be ``math.inf``);
                ``timeout`` is negative, NaN, or finite and over 1e9 s.
            RuntimeError: This ``AsyncRedlock`` is closed.
        """
        self._check_open()
        names = check_names(name)
        lock = Lock.make(
            self._core,
            names,
            ttl=ttl,
            timeout=timeout,
            auto_extend=auto_extend,
            fencing=fencing,
            fair=fair,
            max_hold=max_hold,
        )
        if fair and len(names) > 1:
            raise ValueError("fair=True takes one resource, not a list of them")
        return lock

    def locked(
        self,
        name: str,
        /,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        auto_extend: bool | None = None,
        fencing: bool | None = None,
        fair: bool = False,
        max_hold: float | None = None,
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T]]]:
        """A decorator: each call of a coroutine function runs holding a lock.

        ::

            @redlock.locked("jobs:{job_id}", ttl=30)
            async def run_job(job_id: int, *, dry_run: bool = False) -> None: ...

        The lock's name is ``name`` filled (as ``str.format`` does) with the
        call's arguments by parameter name, defaults included: calls that fill
        in the same name run one at a time, across every client of the masters;
        calls with different names run concurrently. The call waits for the
        lock as ``lock(...).acquire()`` does, and the lease is held, extended
        and released as in ``async with lock(...)``: a lost lease cancels the
        call and raises `LockLostError`. The other arguments are as for `lock`.

        Args:
            name: The name template: ``"jobs:{job_id}"``, ``"user:{user.id}"``;
                a name without fields is one lock for every call.

        Raises:
            TypeError: The template is not a str, a setting has the wrong type
                (here), or the decorated object is not a coroutine function.
            ValueError: The template is empty or malformed, has a positional
                field (``{}``), names a parameter the function lacks (when
                decorating), has no field and is empty, has a NUL or is not UTF-8, or a
                setting is out of range (here). At each call, `lock`'s errors for the
                filled name (a reserved key too), and ``TypeError`` for bad arguments.
        """
        template = NameTemplate(name)
        options = LockOptions(ttl, timeout, auto_extend, fencing, fair, max_hold)  # checked now
        make = functools.partial(self.lock, **options.kwargs())
        return serialize(template, make)

    async def run_singleton(
        self,
        name: str,
        job: Callable[[Lease], Awaitable[T]],
        *,
        ttl: float | None = None,
        fencing: bool | None = None,
    ) -> T:
        """Run ``job(lease)`` on one process at a time: the holder of the lock on
        ``name`` runs it; every other caller waits to take over.

        Waits for the lock without limit (woken by a release; a holder that died
        frees it when its key expires, at most ``ttl`` later; an outage of the
        masters is waited out), then runs the job inside ``async with``, the lease
        extending itself. If the lease is lost (or this ``AsyncRedlock`` closes),
        the job is cancelled; after a loss this call waits for the lock again and
        starts the job anew when it holds it. Cancelling this call cancels the
        job and releases the lock. ``ttl`` and ``fencing`` are as for `lock`; the
        ``AsyncRedlock``'s ``max_hold`` does not apply (the job may run forever).

        Args:
            name: The resource name of the lock (one ``str``, not a list).
            job: An async function taking the lease (``lease.token`` fences what
                it writes); it may run forever or return.

        Returns:
            What ``job`` returned, the one time it ran to the end.

        Raises:
            TypeError, ValueError: A bad name, job or setting, before any I/O (a
                job that cannot be called with the lease alone included).
            RuntimeError: This ``AsyncRedlock`` is closed (also once it closes
                while the job runs), or this is called from the job it would run
                (or a task the job started): it would wait for itself.
            QuorumUnavailableError: The masters refuse in a way that waiting
                cannot mend (their ACL, or their TLS certificates).
            Exception: Whatever ``job`` raises (the lock is released first).
        """
        check_singleton(name, job)
        lock = self.lock(
            name, ttl=ttl, timeout=math.inf, auto_extend=True, fencing=fencing, max_hold=math.inf
        )
        return await run_singleton(lock, job)

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
            ValueError: ``name`` is empty, holds a NUL, is not UTF-8 or makes a
                key that is one of the library's auxiliary keys, or ``patience``
                is negative, NaN or over 1e9.
            RuntimeError: This ``AsyncRedlock`` is closed.
        """
        self._check_open()
        name = check_name(name)
        if not isinstance(fair, bool):
            raise TypeError("fair must be a bool")
        patience = check_seconds("patience", patience, allow_zero=True, allow_inf=True)
        key = lock_key(self._settings.prefix, name)
        return RWLock(self._core, name, key, fair=fair, patience=patience)

    def semaphore(
        self,
        name: str,
        limit: int,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
        fair: bool = False,
    ) -> Semaphore:
        """A counting semaphore on the resource ``name``: up to ``limit`` holders at
        once, across every client of the masters; used like `lock`'s locks.

        Each holder holds one of ``limit`` slots, each a lock on its own key
        (``{K}:sem:<i>``) taken on a quorum, so at most ``limit`` leases are valid
        at once under Redlock's assumptions. See `Semaphore`.

        Args:
            name: The resource name (``K`` is ``prefix + name``).
            limit: How many may hold it at once: an ``int`` from 1 to 1024.
            ttl: As for `lock`.
            timeout: As for `lock`.
            auto_extend: As for `lock`.
            max_hold: As for `lock`.
            fair: Serve waiters in arrival order, through a queue on the masters:
                with f slots free, only the first f waiters may take them.

        Raises:
            TypeError: ``name`` is not a str, ``limit`` not an int, or a setting
                has the wrong type.
            ValueError: ``name`` is empty, holds a NUL, is not UTF-8 or makes a
                key that is one of the library's auxiliary keys, ``limit`` is out
                of range, or a setting is (as for `lock`).
            RuntimeError: This ``AsyncRedlock`` is closed.
        """
        self._check_open()
        name, limit = check_name(name), check_limit(limit)
        return Semaphore.create(
            self._core,
            name,
            limit,
            ttl=ttl,
            timeout=timeout,
            auto_extend=auto_extend,
            max_hold=max_hold,
            fair=fair,
        )
