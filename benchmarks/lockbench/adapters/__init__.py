"""The libraries under test: one module per adapter, and the registry ``PEERS``."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ..settings import AIOREDLOCK_WAIT_RETRIES
from .base import Handle, Mode, NotAcquiredError, Session, defaults, jsonable, redis_client_settings
from .ours import AsyncredlockHandle, AsyncredlockSession
from .peer_aioredlock import AioredlockHandle, AioredlockSession
from .peer_pottery import PotteryHandle, PotterySession
from .peer_python_redis_lock import PythonRedisLockHandle, PythonRedisLockSession
from .peer_redis_py import RedisPyHandle, RedisPySession
from .peer_redlock_ng import RedlockNgHandle, RedlockNgSession

__all__ = [
    "PEERS",
    "UNCONTENDED",
    "AioredlockHandle",
    "AioredlockSession",
    "AsyncredlockHandle",
    "AsyncredlockSession",
    "Handle",
    "LibraryInfo",
    "Mode",
    "NotAcquiredError",
    "Peer",
    "PotteryHandle",
    "PotterySession",
    "PythonRedisLockHandle",
    "PythonRedisLockSession",
    "RedisPyHandle",
    "RedisPySession",
    "RedlockNgHandle",
    "RedlockNgSession",
    "Session",
    "defaults",
    "describe",
    "jsonable",
    "probe",
    "redis_client_settings",
]


@dataclass(frozen=True, slots=True)
class Peer:
    """A library under test.

    Attributes:
        id: Its name on the command line (``--only``) and in the JSON.
        label: Its name in tables and plots.
        distributions: The installed packages whose versions are recorded.
        modules: What must import for it to run.
        single_server: A lock on one server, not Redlock: runs with N = 1 only.
        opener: Makes a session on the given masters.
        scenarios: The scenarios it runs in (all when None).
        note: How it is set up, for the notes under the tables.
    """

    id: str
    label: str
    distributions: tuple[str, ...]
    modules: tuple[str, ...]
    single_server: bool
    opener: Callable[[Sequence[str], Mode], Session]
    scenarios: frozenset[str] | None = None
    note: str = ""


PEERS = (
    Peer(
        "asyncredlock",
        "asyncredlock",
        ("asyncredlock",),
        ("asyncredlock",),
        False,
        functools.partial(AsyncredlockSession, fencing=True),
        note="its defaults: auto-extension on, fencing on (a second round commits the "
        "token, skipped when a majority counted the same one); "
        "a released lease passes to the next waiting task of the same AsyncRedlock "
        "without a call to the masters",
    ),
    Peer(
        "asyncredlock-unfenced",
        "asyncredlock fencing=False",
        ("asyncredlock",),
        ("asyncredlock",),
        False,
        functools.partial(AsyncredlockSession, fencing=False),
        frozenset("abe"),
        "plain Redlock, one round, auto-extension on; measured in the latency scenarios",
    ),
    Peer(
        "asyncredlock-fair",
        "asyncredlock fair=True",
        ("asyncredlock",),
        ("asyncredlock",),
        False,
        functools.partial(AsyncredlockSession, fencing=True, fair=True),
        frozenset("d"),
        "its defaults with fair=True: every task queues on the masters in arrival order "
        "(no in-process hand-off); measured in the contention scenario",
    ),
    Peer(
        "asyncredlock-nopoll",
        "asyncredlock busy_poll=0",
        ("asyncredlock",),
        ("asyncredlock",),
        False,
        functools.partial(AsyncredlockSession, fencing=True, busy_poll=0),
        frozenset("ad"),
        "its defaults with busy_poll=0: the event loop sleeps until every reply, as "
        "every peer's does; measured in the latency and contention scenarios",
    ),
    Peer(
        "aioredlock",
        "aioredlock",
        ("aioredlock", "aioredis"),
        ("aioredlock",),
        False,
        AioredlockSession,
        note=f"3 attempts, 0.1-0.3 s apart; {AIOREDLOCK_WAIT_RETRIES} where a scenario waits",
    ),
    Peer(
        "pottery",
        "pottery AIORedlock",
        ("pottery",),
        ("pottery",),
        False,
        PotterySession,
        note="blocking acquire(timeout=10), retries uniform(0, 0.2) s apart",
    ),
    Peer(
        "redlock-ng",
        "redlock-ng",
        ("redlock-ng",),
        ("redlock",),
        False,
        RedlockNgSession,
        note="non-blocking (3 retries 0.1-0.3 s apart); blocking=True where a scenario waits",
    ),
    Peer(
        "redis-py",
        "redis-py Lock",
        ("redis",),
        ("redis.asyncio.lock",),
        True,
        RedisPySession,
        note="one server; blocking acquire polls every 0.1 s (its default sleep)",
    ),
    Peer(
        "python-redis-lock",
        "python-redis-lock",
        ("python-redis-lock",),
        ("redis_lock",),
        True,
        PythonRedisLockSession,
        note="one server; synchronous, in threads; a waiter blocks in BLPOP until signalled",
    ),
)


UNCONTENDED = Mode("uncontended", waiting=False, workers=1)


class LibraryInfo(TypedDict):
    """What a run records about one library under test (the report's ``"libraries"``)."""

    label: str
    single_server: bool
    note: str  # how it is set up
    versions: dict[str, str | None]  # per distribution; None: not installed
    requires: list[str]  # its declared requirements
    available: bool  # whether it imports here
    reason: str | None  # why not, when not
    settings: dict[str, Any]  # per mode (uncontended, ...), every setting in force


def probe(peer: Peer) -> LibraryInfo:
    """Whether ``peer`` imports here, its versions, and its declared requirements."""
    reason: str | None = None
    try:
        for module in peer.modules:
            importlib.import_module(module)
        if peer.id == "redlock-ng" and not hasattr(sys.modules["redlock"], "RedlockConfig"):
            raise ImportError("the installed 'redlock' module is not redlock-ng's")
    except Exception as exc:  # any import-time failure makes it unavailable, with why
        reason = describe(exc)
    return LibraryInfo(
        label=peer.label,
        single_server=peer.single_server,
        note=peer.note,
        versions={d: _version(d) for d in peer.distributions},
        requires=_requires(peer.distributions[0]),
        available=reason is None,
        reason=reason,
        settings={},
    )


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _requires(distribution: str) -> list[str]:
    try:
        return importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []


def describe(exc: BaseException) -> str:
    """``module.Type: message``, short enough for a table note."""
    kind = type(exc)
    text = f"{kind.__module__}.{kind.__qualname__}: {exc}".replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."
