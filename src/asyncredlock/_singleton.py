"""One job on one process at a time: the lock's holder runs it, the others wait to
take over (leader election)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ._errors import LockLostError
from ._lease import Lease
from ._lock import Lock

__all__ = ["check_job", "run_singleton"]

logger = logging.getLogger("asyncredlock")

T = TypeVar("T")


def check_job(job: object) -> None:
    """Refuse, before any I/O, a job that is not an async function.

    Raises:
        TypeError: ``job`` is not a coroutine function.
    """
    if not (callable(job) and inspect.iscoroutinefunction(job)):
        raise TypeError(f"the job must be an async function taking the lease, not {job!r}")


async def run_singleton(lock: Lock, job: Callable[[Lease], Awaitable[T]]) -> T:
    """Run ``job(lease)`` while holding ``lock`` (which waits without limit); when
    the lease is lost the job is cancelled and the lock waited for again, and the
    job starts anew once it is held. Returns what the job returns, once; what the
    job raises (its own `LockLostError` included) propagates."""
    while True:
        lease: Lease | None = None
        returned: list[T] = []
        try:
            async with lock as lease:
                returned.append(await job(lease))
        except LockLostError:
            if lease is None or not lease.lost:
                raise  # the job's own error, not this lock's loss
            if not returned:
                logger.warning("singleton %r lost its lock; waiting to lead again", lock.name)
                continue
            # the job had finished; the release found the lock gone: still done
            logger.warning("singleton %r: its lock was gone when released", lock.name)
        return returned[0]
