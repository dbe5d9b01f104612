"""The exceptions of asyncredlock, one tree under `RedlockError`.

```
RedlockError
├── LockTimeoutError        the lock stayed contended past the caller's timeout
├── QuorumUnavailableError  too many masters failed or were silent: an outage, not contention
├── LockLostError           a lease ended while its holder still relied on it
│   ├── HoldLimitError          ... because it reached its max_hold
│   └── LostLeaseError          ... found by release/extend (also a LockNotOwnedError)
├── LockNotOwnedError       release/extend of a lease that no longer holds a quorum
├── StaleTokenError         a guarded write carried a fencing token older than one seen
└── MissingRecordError      a fenced update of a record that does not exist (a LookupError)
```

Every error carries the resource name and what each master said (``outcomes``), so
the caller can tell which master refused, timed out or failed. The two fencing errors
are raised by the resource-side guards of `asyncredlock.fencing`: their resource is
the guarded key or record id, and their outcomes are empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "HoldLimitError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "LostLeaseError",
    "MissingRecordError",
    "NodeOutcome",
    "QuorumUnavailableError",
    "RedlockError",
    "StaleTokenError",
]


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """What one master answered to one operation.

    Attributes:
        node: The master's display name (its URL without password).
        ok: Whether the operation took effect on this master.
        detail: A short human-readable account: ``"granted"``, ``"held by another
            holder (812 ms left)"``, ``"master silent for over 0.1 s"``,
            ``"ConnectionError: ..."``.
    """

    node: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.node}: {self.detail}"


class RedlockError(Exception):
    """Base class of every error raised by asyncredlock.

    Attributes:
        resource: The lock's resource name.
        outcomes: What each master answered to the operation that failed
            (empty where no master was asked).
    """

    def __init__(
        self, message: str, *, resource: str, outcomes: Sequence[NodeOutcome] = ()
    ) -> None:
        super().__init__(message)
        self.resource = resource
        self.outcomes: tuple[NodeOutcome, ...] = tuple(outcomes)

    def __str__(self) -> str:
        base = super().__str__()
        if not self.outcomes:
            return base
        return base + " [" + "; ".join(str(o) for o in self.outcomes) + "]"


class LockTimeoutError(RedlockError):
    """The lock was held by others for the whole of the caller's ``timeout``."""


class QuorumUnavailableError(RedlockError):
    """Too many masters failed or did not answer for a majority to be reached.

    This is an outage, not contention: retrying later or fixing the masters helps,
    waiting longer for the holder does not.
    """


class LockLostError(RedlockError):
    """A lease was lost while its ``async with`` block ran.

    Raised when the block exits after its lease could not be extended in time, or
    when release shows that a majority no longer held it. The block was cancelled
    as soon as the loss was known.
    """


class HoldLimitError(LockLostError):
    """A lease reached its ``max_hold`` while its ``async with`` block ran.

    Not a fault: the lease was held as long as it was allowed to be, so its block
    was cancelled at the bound and the lock released (see ``max_hold`` on
    ``AsyncRedlock`` and ``lock()``).
    """


class LockNotOwnedError(RedlockError):
    """``release()`` or ``extend()`` of a lease that no longer holds a quorum.

    Whatever the lease still held on some masters has been removed. A lease that
    was lost (``lease.lost``) raises `LostLeaseError`, this error's subclass; a plain
    `LockNotOwnedError` is of a lease already released: the caller's bug.
    """


class LostLeaseError(LockNotOwnedError, LockLostError):
    """``release()`` or ``extend()`` of a lease that was lost: found gone from a
    majority by that call, or lost before it (not extended in time, taken away,
    forced free, held for its ``max_hold``). Raised too at the exit of an
    ``async with`` block whose own call, or the release at its exit, found the loss
    (the block was not cancelled for it).

    A `LockNotOwnedError`, as these calls raised before, and a `LockLostError`: the
    holder relied on a lease it no longer had, and whatever it did under that lease
    is not to be trusted (the web helpers answer it as such, with 503).
    """


class StaleTokenError(RedlockError):
    """A guarded write carried a fencing token older than the newest the guard has seen.

    The writer's lease was superseded: another holder has since acquired the lock and
    written with a larger token. The write was not applied.

    Args:
        message: The error message.
        resource: The guarded key or record id.
        token: The token the refused write carried.
        newest: The newest token the guard had seen.
        outcomes: Per-master outcomes; empty, no master is asked.

    Attributes:
        token: The token the refused write carried.
        newest: The newest token the guard had seen (greater than ``token``).
    """

    def __init__(
        self,
        message: str,
        *,
        resource: str,
        token: int,
        newest: int,
        outcomes: Sequence[NodeOutcome] = (),
    ) -> None:
        super().__init__(message, resource=resource, outcomes=outcomes)
        self.token = token
        self.newest = newest


class MissingRecordError(RedlockError, LookupError):
    """A fenced update of a record that does not exist; nothing was written.

    Also a `LookupError`, like `KeyError`.
    """
