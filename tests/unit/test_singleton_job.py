"""`check_job`: what run_singleton() takes as a job, read before any I/O."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from asyncredlock._singleton import check_job


def test_a_decorated_job_taking_the_lease_alone_is_accepted() -> None:
    """A decorator that supplies a job's other arguments (dependency injection) and
    keeps its name with functools.wraps: the wrapper takes the lease alone and was
    run before 76e3182. `check_job` reads `inspect.signature`, which follows
    ``__wrapped__`` to the inner function (lease, db), and refuses it with
    TypeError."""

    def with_db(func: Callable[..., Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        @functools.wraps(func)
        async def wrapper(lease: Any) -> Any:
            return await func(lease, "db-connection")

        return wrapper

    @with_db
    async def job(lease: Any, db: str) -> str:
        return db

    check_job(job)  # raises TypeError before it read the wrapper's own signature
