"""What ``AsyncRedlock.inspect()`` reports: a lock's state on every master."""

from __future__ import annotations

from dataclasses import dataclass

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._config import Settings
from ._keys import identity_of
from ._node import Reply
from ._quorum import quorum_of

__all__ = ["LockState", "NodeLockState", "no_reply", "node_state", "not_asked", "reply_error"]


@dataclass(frozen=True, slots=True)
class NodeLockState:
    """A lock's state on one master, as ``AsyncRedlock.inspect()`` saw it.

    Attributes:
        node: The master's display name.
        holder: The value in the lock key (the holder's identity and random id),
            or ``None``; bytes that are not UTF-8 (another client's) shown escaped.
        ttl: Seconds until the key expires, or ``None`` when there is no key or
            it has no expiry.
        fence: The resource's fence counter there, or ``None`` when it has none.
        error: Why the master could not be read, or ``None``.
        readers: The readers of the resource's read-write lock there: each
            reader's value and the seconds until its entry lapses.
        queue: The waiters queued there for a fair or read-write lock, in
            arrival order: ``r:...`` for a reader, ``w:...`` for a writer. The
            holder is not among them, although a writer granted the lock while
            queued, or handed it, stays in the masters' queue until its release
            (or the end of its ``acquire()``) takes it out.
    """

    node: str
    holder: str | None
    ttl: float | None
    fence: int | None
    error: str | None = None
    readers: tuple[tuple[str, float], ...] = ()
    queue: tuple[str, ...] = ()

    @property
    def identity(self) -> str | None:
        """The holder's identity (``AsyncRedlock(identity=...)``, by default
        ``"<hostname>:<pid>"``), read from its value; ``None`` when the lock is
        free here or its value was not written by asyncredlock."""
        return None if self.holder is None else identity_of(self.holder)


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

    @property
    def identity(self) -> str | None:
        """The identity of the majority `holder`, or ``None`` (see
        `NodeLockState.identity`)."""
        holder = self.holder
        return None if holder is None else identity_of(holder)


def reply_error(reply: Reply | None, settings: Settings) -> str | None:
    """Why a master's reply (``None``: none came in time) holds no value, or ``None``."""
    if reply is None:
        wait = max(settings.node_timeout, settings.socket_timeout)
        return f"no reply within {wait:g} s"
    if reply.error is not None:
        return f"{type(reply.error).__name__}: {reply.error}"
    return None


def no_reply(reply: Reply | None) -> bool:
    """Whether the master gave no reply (``reply`` is ``None``: none came in time), or
    could not be reached: a silent or lost master, not a refusal of its own."""
    return reply is None or isinstance(reply.error, (RedisConnectionError, RedisTimeoutError))


def not_asked(error: str) -> str:
    """The error of a master not asked, as an earlier call there failed with ``error``."""
    return f"not read, as an earlier call failed there: {error}"


def node_state(name: str, reply: Reply | None, settings: Settings) -> NodeLockState:
    error = reply_error(reply, settings)
    if reply is None or error is not None:
        return NodeLockState(name, None, None, None, error)
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
    # another client's value need not be UTF-8 (the reference Redlock uses random bytes)
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else str(value)
