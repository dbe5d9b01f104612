"""One job on one process at a time: the lock's holder runs it, the others wait to
take over (leader election)."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from ._errors import LockLostError
from ._lease import Lease
from ._lock import Lock

__all__ = ["check_job", "check_singleton", "run_singleton"]

logger = logging.getLogger("asyncredlock")

T = TypeVar("T")

#: The singletons that the running job (and the tasks it started) leads: per
#: ``AsyncRedlock`` (its id) the lock keys. Leading one of them again from there
#: would wait for itself forever.
_LEADING: contextvars.ContextVar[frozenset[tuple[int, str]]] = contextvars.ContextVar(
    "asyncredlock_leading", default=frozenset()
)


def check_singleton(name: object, job: object) -> None:
    """Refuse, before any I/O, a name that is not one ``str`` (a list would make a
    lock on several resources, whose lease has no token) and a bad job (`check_job`).

    Raises:
        TypeError: ``name`` is not a ``str``, or ``job`` is refused by `check_job`.
    """
    if not isinstance(name, str):
        raise TypeError(f"run_singleton takes one resource name, a str, not {type(name).__name__}")
    check_job(job)


def check_job(job: object) -> None:
    """Refuse, before any I/O, a job that is not an async function taking one
    argument (the lease).

    Raises:
        TypeError: ``job`` is not a coroutine function, or cannot be called with
            the lease alone.
    """
    if not (callable(job) and inspect.iscoroutinefunction(job)):
        raise TypeError(f"the job must be an async function taking the lease, not {job!r}")
    try:
        signature = inspect.signature(job, follow_wrapped=False)  # a wrapper's own
    except (TypeError, ValueError):  # no signature to read (a builtin): found at the call
        return
    try:
        signature.bind(None)
    except TypeError as exc:
        raise TypeError(
            f"the job must be an async function taking the lease, not {job!r} ({exc})"
        ) from None


async def run_singleton(lock: Lock, job: Callable[[Lease], Awaitable[T]]) -> T:
    """Run ``job(lease)`` while holding ``lock`` (which waits without limit); when
    the lease is lost the job is cancelled and the lock waited for again, and the
    job starts anew once it is held. Returns what the job returns, once; what the
    job raises (its own `LockLostError` included) propagates, even where the
    release then found the lock gone."""
    leading = (id(lock._core), lock.key)
    if leading in _LEADING.get():
        raise RuntimeError(
            f"run_singleton({lock.name!r}) inside its own job would wait for itself forever"
        )
    while True:
        lease: Lease | None = None
        ended: list[tuple[T | None, BaseException | None]] = []  # (returned, raised)
        try:
            async with lock as lease:
                ended.append(await _run_job(job, lease, leading))
        except LockLostError:
            if lease is None or not lease.lost:
                raise  # the job's own error, not this lock's loss
            if not ended:
                if lock._core.closing:
                    raise RuntimeError("this AsyncRedlock is closed") from None
                logger.warning("singleton %r lost its lock; waiting to lead again", lock.name)
                continue
            # the job had ended; the release found the lock gone: it is still done
            logger.warning("singleton %r: its lock was gone when released", lock.name)
        returned, raised = ended[0]
        if raised is not None:
            raise raised  # (outside the except clause: its chain stays the job's)
        return cast(T, returned)  # the job returned it


async def _run_job(
    job: Callable[[Lease], Awaitable[T]], lease: Lease, leading: tuple[int, str]
) -> tuple[T | None, BaseException | None]:
    """Run the job as the leader: what it returned, or the exception it raised (a
    cancellation propagates)."""
    token = _LEADING.set(_LEADING.get() | {leading})
    try:
        return await job(lease), None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if lease.lost:  # cut off by the loss (its cleanup raised): a loss, not an end
            raise
        return None, exc
    finally:
        _LEADING.reset(token)
