"""``RWLock``: many readers or one writer over the quorum (``AsyncRedlock.rwlock()``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._config import Role
from ._lock import Lock
from ._stats import LockCounters, RWLockStatistics

if TYPE_CHECKING:
    from ._core import Core

__all__ = ["RWLock"]


class RWLock:
    """A read-write lock on one resource, made by ``AsyncRedlock.rwlock()``.

    `read` and `write` make `Lock` objects, used like any lock (``async with``
    or ``acquire()``) and giving leases like any lease: extended in the
    background, lost with their block cancelled, released by compare on every
    master, safe to cancel. Many read leases may be held at once; a write lease
    is held alone, and is the same lock as ``redlock.lock(name)``: an exclusive
    lock on the name excludes readers and writers, and writers get their fencing
    tokens from the same counter.

    On each master the writer holds the lock key (``SET NX PX``) and each reader
    an entry in a sorted set ``{K}:readers``, scored by when the entry lapses on
    the master's own clock. A writer is granted on a master only when no reader
    entry is left there; a reader only when no writer holds the key. Both need
    a majority, so a reader and a writer never hold at the same time.

    Attributes:
        name: The resource name.
        key: The lock key.
    """

    def __init__(self, core: Core, name: str, key: str, *, fair: bool, patience: float) -> None:
        self._core = core
        self.name = name
        self.key = key
        self._fair = fair
        self._patience = patience
        self._read, self._write = LockCounters(), LockCounters()

    @property
    def fair(self) -> bool:
        """Whether readers and writers are served in arrival order."""
        return self._fair

    @property
    def patience(self) -> float:
        """Unfair mode: seconds a writer waits before readers that come after it
        queue behind it (``math.inf``: never); not used when `fair`."""
        return self._patience

    def statistics(self) -> RWLockStatistics:
        """The ``acquire()`` calls of the locks `read` and `write` made so far, by
        side (see `RWLockStatistics`)."""
        return RWLockStatistics(self._read.snapshot(), self._write.snapshot())

    def __repr__(self) -> str:
        mode = "fair" if self.fair else f"patience={self.patience:g}s"
        return f"<RWLock {self.name!r} {mode}>"

    def read(
        self,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
    ) -> Lock:
        """The read side: leases held together with other readers, never with a writer.

        Read leases carry no fencing token (``lease.token`` is ``None``). Tasks
        of one ``AsyncRedlock`` read at once: each sends its own attempts, and
        none waits for another reader.

        Args:
            ttl: Time to live of the reader's entry in seconds; the
                ``AsyncRedlock``'s default if omitted.
            timeout: Seconds to wait while a writer holds or is queued (``0``:
                one attempt, ``math.inf``: no limit); the default if omitted.
            auto_extend: Whether leases extend themselves; the default if omitted.
            max_hold: The longest a lease is held (see `AsyncRedlock.lock`); the
                default if omitted.

        Raises:
            TypeError: A setting has the wrong type.
            ValueError: ``ttl`` or ``max_hold`` is under 0.01 s or not finite
                (``max_hold`` may be ``math.inf``), or ``timeout`` is negative or
                NaN.
            RuntimeError: The ``AsyncRedlock`` is closed.
        """
        return Lock.make(
            self._core,
            (self.name,),
            ttl=ttl,
            timeout=timeout,
            auto_extend=auto_extend,
            max_hold=max_hold,
            fencing=False,
            fair=self.fair,
            role=Role.READER,
            counters=self._read,
        )

    def write(
        self,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        auto_extend: bool | None = None,
        max_hold: float | None = None,
        fencing: bool | None = None,
    ) -> Lock:
        """The write side: leases held alone, with a fencing token by default.

        A writer is granted once the readers have left. Unfair (the default), a
        writer that has waited ``patience`` seconds queues on the masters, and
        readers that arrive after that wait for it. Unfair writers of one
        ``AsyncRedlock`` queue for the key locally (one at a time asks the
        masters), but never pass a write lease on without the masters, so
        readers elsewhere get their turn.

        Args:
            ttl: Time to live in seconds; the ``AsyncRedlock``'s default if omitted.
            timeout: Seconds to wait (``0``: one attempt, ``math.inf``: no
                limit); the default if omitted.
            auto_extend: Whether leases extend themselves; the default if omitted.
            max_hold: The longest a lease is held (see `AsyncRedlock.lock`); the
                default if omitted.
            fencing: Whether leases carry a fencing token; the default if omitted.

        Raises:
            TypeError: A setting has the wrong type.
            ValueError: ``ttl`` or ``max_hold`` is under 0.01 s or not finite
                (``max_hold`` may be ``math.inf``), or ``timeout`` is negative or
                NaN.
            RuntimeError: The ``AsyncRedlock`` is closed.
        """
        return Lock.make(
            self._core,
            (self.name,),
            ttl=ttl,
            timeout=timeout,
            auto_extend=auto_extend,
            max_hold=max_hold,
            fencing=fencing,
            fair=self.fair,
            role=Role.WRITER,
            patience=self.patience,
            counters=self._write,
        )
