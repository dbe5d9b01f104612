"""One job on one process at a time: the lock's holder runs it, the others wait to
take over (leader election)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from ._errors import LockLostError, QuorumUnavailableError
from ._lease import Lease
from ._lock import Lock

__all__ = ["run_singleton"]

logger = logging.getLogger("asyncredlock")

T = TypeVar("T")


async def run_singleton(lock: Lock, job: Callable[[Lease], Awaitable[T]], *, pause: float) -> T:
    """Run ``job(lease)`` while holding ``lock`` (which waits without limit); when
    the lease is lost the job is cancelled and the lock waited for again, and the
    job starts anew once it is held. Returns what the job returns; an outage of
    the masters is waited out, ``pause`` seconds between tries."""
    while True:
        try:
            async with lock as lease:
                return await job(lease)
        except LockLostError:
            logger.warning("singleton %r lost its lock; waiting to take over again", lock.name)
        except QuorumUnavailableError:
            logger.warning("singleton %r: no quorum of masters; trying again", lock.name)
            await anyio.sleep(pause)
