"""The ``/items`` race, replayed without and with a Redlock (``asyncredlock demo``).

A FastAPI handler allows at most ``limit`` items: it counts them (``LLEN``), pauses
for 0.1 s as real work would, then appends (``RPUSH``). Concurrent requests all count
before any of them appends, so without a lock every one of them is accepted. Around
the same check-sleep-append, ``async with redlock.lock(...)`` makes the handlers take
turns, and the limit holds.

Everything runs on this machine: ``masters`` real servers as the Redlock masters, one
more as the application's database, and the app served in-process through
``httpx.ASGITransport``. FastAPI and httpx are imported only when the demo runs, so
``import asyncredlock`` never needs them.
"""

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import anyio
import anyio.to_thread
from redis.asyncio import Redis

from .._errors import RedlockError
from .._quorum import quorum_of
from .._redlock import AsyncRedlock
from .._stats import RedlockStatistics
from ._group import ServerGroup
from ._servers import ServerProcess
from ._support import registry

if TYPE_CHECKING:
    import httpx
    from fastapi import FastAPI, Request, Response

__all__ = ["DemoDependencyError", "DemoResult", "RunResult", "run_demo"]

ITEMS_KEY = "items"
LOCK_NAME = "items:create"
WORK_SECONDS = 0.1
# Five handlers that each hold the lock ~0.1 s finish well within the timeout; the
# TTL only matters if the demo process dies while holding the lock.
LOCK_TTL = 5.0
LOCK_TIMEOUT = 10.0
MAX_CELL = 60  # characters of a table cell; the default run's cells fit

Guard = Callable[[], AbstractAsyncContextManager[object]]


class DemoDependencyError(ImportError):
    """FastAPI or httpx, which only the demo needs, is not installed."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one round of concurrent ``POST /items`` gave.

    Attributes:
        statuses: The HTTP status of each request, in the order they were sent.
        bodies: Each response body as compact JSON, in the same order.
        stored: How many items the database held after the round.
        seconds: Wall-clock duration of the round.
    """

    statuses: tuple[int, ...]
    bodies: tuple[str, ...]
    stored: int
    seconds: float

    def count(self, status: int) -> int:
        """How many requests got ``status``."""
        return self.statuses.count(status)


@dataclass(frozen=True, slots=True)
class DemoResult:
    """Both rounds of the demo and what the lock did.

    Attributes:
        requests: Concurrent requests per round.
        limit: Items the handler allows.
        unlocked: The round without a lock.
        locked: The round with ``redlock.lock("items:create")``.
        statistics: The ``AsyncRedlock``'s counters after the locked round.
    """

    requests: int
    limit: int
    unlocked: RunResult
    locked: RunResult
    statistics: RedlockStatistics

    @property
    def expected_created(self) -> int:
        """How many requests a correct handler accepts: ``min(limit, requests)``."""
        return min(self.limit, self.requests)

    @property
    def race_shown(self) -> bool:
        """Whether the round without a lock stored more than ``limit`` items."""
        return self.unlocked.stored > self.limit

    @property
    def lock_held_limit(self) -> bool:
        """Whether the locked round gave exactly the correct statuses and item count."""
        created = self.expected_created
        locked = self.locked
        return (
            locked.count(201) == created
            and locked.count(400) == self.requests - created
            and locked.stored == created
        )


async def run_demo(
    *, masters: int = 5, requests: int = 5, limit: int = 3, out: TextIO = sys.stdout
) -> DemoResult:
    """Start the servers, run both rounds, print the comparison, stop everything.

    Args:
        masters: Redlock masters to start (one more server is the database).
        requests: Concurrent ``POST /items`` per round.
        limit: Items the handler allows.
        out: Where the report is printed.

    Returns:
        Both rounds' outcomes; ``lock_held_limit`` tells whether the lock worked.

    Raises:
        ValueError: ``masters`` or ``requests`` is below 1, or ``limit`` below 0.
        DemoDependencyError: FastAPI or httpx is not installed.
        asyncredlock.testing.ServerBinaryNotFoundError: No server binary is available.
        asyncredlock.testing.ServerStartError: A server did not come up.
    """
    _check_counts(masters=masters, requests=requests, limit=limit)
    _require_web()
    async with _servers(masters) as (urls, database_url):
        _print_setup(out, urls, database_url)
        result = await _play(urls, database_url, requests=requests, limit=limit)
    _print_report(out, result)
    return result


def _check_counts(*, masters: int, requests: int, limit: int) -> None:
    for name, value, minimum in (("masters", masters, 1), ("requests", requests, 1)):
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


def _require_web() -> None:
    try:
        import fastapi  # noqa: F401
        import httpx  # noqa: F401
    except ImportError as exc:
        raise DemoDependencyError(
            f"the demo needs FastAPI and httpx ({exc.name} is missing): "
            'pip install "asyncredlock[demo]"'
        ) from exc


# -- servers -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _servers(masters: int) -> AsyncIterator[tuple[list[str], str]]:
    """The masters' URLs and the database's URL; every server stops at exit."""
    stack = contextlib.ExitStack()
    registry.watch_sigterm()  # here: the servers start in a worker thread, which cannot
    try:
        group, database = await anyio.to_thread.run_sync(_start_servers, stack, masters)
        yield group.urls, database.url
    finally:
        # Shielded, so that Ctrl-C (a cancellation under asyncio.run) still stops them.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(stack.close)


def _start_servers(stack: contextlib.ExitStack, masters: int) -> tuple[ServerGroup, ServerProcess]:
    group = stack.enter_context(ServerGroup(masters))
    database = stack.enter_context(ServerProcess())
    return group, database


# -- the application -----------------------------------------------------------------


async def _play(urls: Sequence[str], database_url: str, *, requests: int, limit: int) -> DemoResult:
    """Run the round without a lock, then the round with one."""
    async with contextlib.AsyncExitStack() as stack:
        database = Redis.from_url(database_url, decode_responses=True)
        stack.push_async_callback(_shielded, database.aclose)
        redlock = await stack.enter_async_context(AsyncRedlock(urls))
        lock = redlock.lock(LOCK_NAME, ttl=LOCK_TTL, timeout=LOCK_TIMEOUT)
        unlocked_app = _build_app(database, limit, contextlib.nullcontext)
        unlocked = await _round(unlocked_app, database, requests)
        locked = await _round(_build_app(database, limit, lambda: lock), database, requests)
        return DemoResult(requests, limit, unlocked, locked, redlock.statistics())


async def _shielded(close: Callable[[], Awaitable[None]]) -> None:
    """Run ``close()`` to the end even while the demo is being cancelled."""
    with anyio.CancelScope(shield=True):
        await close()


def _build_app(database: "Redis", limit: int, guard: Guard) -> "FastAPI":
    """The seed's FastAPI app; ``guard()`` wraps each check-sleep-append."""
    from fastapi import Body, FastAPI, status

    app = FastAPI(title="asyncredlock demo")
    app.add_exception_handler(RedlockError, _unavailable)

    @app.post("/items", status_code=status.HTTP_201_CREATED)
    async def create_item(name: Annotated[str, Body(embed=True)]) -> dict[str, Any]:
        async with guard():
            return await _check_sleep_append(database, name, limit)

    return app


async def _unavailable(request: "Request", exc: Exception) -> "Response":
    """A lock that could not be taken (or was lost) is a 503, as a real app would say."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"detail": str(exc)}, status_code=503)


async def _check_sleep_append(database: "Redis", name: str, limit: int) -> dict[str, Any]:
    """Refuse past ``limit`` items, else append ``name``: a read-modify-write."""
    from fastapi import HTTPException, status

    if await database.llen(ITEMS_KEY) >= limit:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, detail=f"Cannot create more than {limit} items."
        )
    # Real work between the check and the write: the window other requests race into.
    await asyncio.sleep(WORK_SECONDS)
    await database.rpush(ITEMS_KEY, name)
    items = await database.lrange(ITEMS_KEY, 0, -1)
    return {"items": items, "total": len(items)}


async def _round(app: "FastAPI", database: "Redis", requests: int) -> RunResult:
    """Empty the database, send ``requests`` concurrent POSTs, count what was stored."""
    await database.delete(ITEMS_KEY)
    start = time.monotonic()
    responses = await _post_concurrently(app, requests)
    seconds = time.monotonic() - start
    return RunResult(
        statuses=tuple(response.status_code for response in responses),
        bodies=tuple(_compact(response) for response in responses),
        stored=await database.llen(ITEMS_KEY),
        seconds=seconds,
    )


async def _post_concurrently(app: "FastAPI", requests: int) -> list["httpx.Response"]:
    import httpx

    transport = httpx.ASGITransport(app=app)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://demo") as client,
        asyncio.TaskGroup() as tasks,
    ):
        posts = [
            tasks.create_task(client.post("/items", json={"name": str(i)})) for i in range(requests)
        ]
    return [post.result() for post in posts]


def _compact(response: "httpx.Response") -> str:
    try:
        return json.dumps(response.json(), separators=(",", ":"))
    except ValueError:
        return response.text


# -- the report ----------------------------------------------------------------------


def _print_setup(out: TextIO, urls: Sequence[str], database_url: str) -> None:
    quorum = quorum_of(len(urls))
    print(f"Redlock masters: {len(urls)} servers (quorum {quorum}): {', '.join(urls)}", file=out)
    print(f"Application database: {database_url}", file=out)


def _print_report(out: TextIO, result: DemoResult) -> None:
    print(file=out)
    print(
        f"{result.requests} concurrent POST /items, limit {result.limit}; the handler counts "
        f"the items (LLEN), works {WORK_SECONDS:g} s, then appends one (RPUSH).",
        file=out,
    )
    print(file=out)
    for line in _table(result):
        print(line, file=out)
    print(file=out)
    print(_lock_line(result.statistics), file=out)
    print(_verdict(result), file=out)


def _table(result: DemoResult) -> list[str]:
    """The two rounds side by side: one row per request, then the totals."""
    left = ["without a lock", *_cells(result.unlocked), *_totals(result, result.unlocked)]
    right = [
        f'with redlock.lock("{LOCK_NAME}")',
        *_cells(result.locked),
        *_totals(result, result.locked),
    ]
    first = ["request", *(f"name={i}" for i in range(result.requests)), "totals", "", ""]
    widths = [max(map(len, column)) for column in (first, left, right)]
    rows = [_row(cells, widths) for cells in zip(first, left, right, strict=True)]
    rule = "-+-".join("-" * width for width in widths)
    body_end = 1 + result.requests
    return [rows[0], rule, *rows[1:body_end], rule, *rows[body_end:]]


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    line = " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
    return line.rstrip()


def _cells(run: RunResult) -> list[str]:
    cells = (f"{status} {body}" for status, body in zip(run.statuses, run.bodies, strict=True))
    return [_clip(cell) for cell in cells]


def _clip(cell: str) -> str:
    """Long bodies (many requests) would make the table unreadable: cut them."""
    if len(cell) <= MAX_CELL:
        return cell
    return cell[: MAX_CELL - 3] + "..."


def _totals(result: DemoResult, run: RunResult) -> list[str]:
    if run is result.locked:
        verdict = "limit held" if result.lock_held_limit else "WRONG OUTCOME"
    else:
        verdict = "limit broken" if result.race_shown else "limit held (no race this time)"
    return [
        _status_counts(run),
        f"{run.stored} items stored: {verdict}",
        f"{run.seconds:.2f} s",
    ]


def _status_counts(run: RunResult) -> str:
    """``"3 x 201, 2 x 400"``, plus any other status that came back."""
    statuses = sorted({201, 400, *run.statuses})
    return ", ".join(f"{run.count(status)} x {status}" for status in statuses)


def _lock_line(stats: RedlockStatistics) -> str:
    return (
        f'lock "{LOCK_NAME}": {stats.acquisitions} acquisitions '
        f"({stats.handovers} handed over by a release) in {stats.attempts} attempts "
        f"({stats.failed_attempts} failed while another handler held it), "
        f"{stats.handoffs} passed from handler to handler in-process, "
        f"{stats.timeouts} timeouts, {stats.releases} releases, {stats.lost} lost"
    )


def _verdict(result: DemoResult) -> str:
    created = result.expected_created
    refused = result.requests - created
    if result.lock_held_limit:
        return f"OK: with the lock, exactly {created} created and {refused} refused."
    return (
        f"FAILED: with the lock, expected {created} x 201 and {refused} x 400 "
        f"with {created} items stored."
    )
