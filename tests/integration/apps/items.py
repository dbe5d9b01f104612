"""Seed 003's ``/items`` race as FastAPI and aiohttp apps, with and without a lock.

``POST /items/{shop}`` allows ``limit`` items per shop: it counts them (``LLEN``),
works for ``WORK`` seconds, then appends (``RPUSH``). Without a lock, the handler
also waits after counting until all ``REQUESTS`` concurrent requests have counted
(a barrier on the database, bounded), so the race is certain, not a matter of timing:
every one is accepted. With ``locked("items:{shop}")`` they take turns and the limit
holds.

``fastapi_from_env()`` is the factory uvicorn's worker processes call: it reads
``ITEMS_MASTERS`` (comma-separated URLs), ``ITEMS_DB``, ``ITEMS_LIMIT`` and
``ITEMS_LOCKED`` (``1`` or ``0``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated

import anyio
from aiohttp import web
from fastapi import Depends, FastAPI, Response
from redis.asyncio import Redis

from asyncredlock import Lease
from asyncredlock.contrib import aiohttp as redlock_aiohttp
from asyncredlock.contrib.fastapi import add_exception_handlers, lifespan, locked

LIMIT, REQUESTS, ROUNDS = 3, 5, 10  # items allowed; concurrent POSTs; rounds per test
HANG_GUARD = 60  # seconds; only stops a hung test, never decides an outcome
WORK = 0.05  # seconds between the count and the append, as real work would take
TIMEOUT = 20.0  # seconds a request waits for the lock: five turns of WORK fit easily
BARRIER = 10  # seconds an unlocked handler waits at most for the others to count


async def create(
    db: Redis, shop: str, limit: int, *, barrier: bool
) -> tuple[int, dict[str, object]]:
    """The handler's work: the status and body of one ``POST``; ``barrier``: wait
    after counting until every request of the round has counted."""
    key = f"items:{shop}"
    count = await db.llen(key)
    if barrier:
        await all_counted(db, shop)
    if count >= limit:
        return 400, {"detail": "limit reached", "pid": os.getpid()}
    await anyio.sleep(WORK)
    await db.rpush(key, "item")
    return 201, {"stored": count + 1, "pid": os.getpid()}


async def all_counted(db: Redis, shop: str) -> None:
    """Return once ``REQUESTS`` handlers of this shop have counted (or BARRIER s)."""
    if await db.incr(f"counted:{shop}") == REQUESTS:
        await db.rpush(f"go:{shop}", *["go"] * REQUESTS)
    await db.blpop([f"go:{shop}"], timeout=BARRIER)


def fastapi_app(masters: Sequence[str], db_url: str, limit: int, *, lock: bool) -> FastAPI:
    """The FastAPI app; ``lock``: with ``locked("items:{shop}")`` around the handler."""
    redlock_lifespan = lifespan(masters, ttl=10.0)

    @asynccontextmanager
    async def app_lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with redlock_lifespan(app):  # composed with the app's own startup
            app.state.db = Redis.from_url(db_url)
            yield
            await app.state.db.aclose()

    app = FastAPI(lifespan=app_lifespan)
    add_exception_handlers(app)
    guard = [Depends(locked("items:{shop}", timeout=TIMEOUT))] if lock else []

    @app.post("/items/{shop}", dependencies=guard)
    async def post_item(shop: str, response: Response) -> dict[str, object]:
        response.status_code, body = await create(app.state.db, shop, limit, barrier=not lock)
        return body

    @app.put("/once/{shop}")
    async def once(
        shop: str, lease: Annotated[Lease, Depends(locked("once:{shop}", timeout=0))]
    ) -> dict[str, object]:
        return {"token": lease.token}  # timeout=0: a lock still held would be 423

    @app.get("/health")
    async def health() -> dict[str, int]:
        return {"pid": os.getpid()}

    return app


def fastapi_from_env() -> FastAPI:
    """The app of a uvicorn worker process, configured by the environment."""
    return fastapi_app(
        os.environ["ITEMS_MASTERS"].split(","),
        os.environ["ITEMS_DB"],
        int(os.environ["ITEMS_LIMIT"]),
        lock=os.environ["ITEMS_LOCKED"] == "1",
    )


DB: web.AppKey[Redis] = web.AppKey("db", Redis)


def aiohttp_app(masters: Sequence[str], db_url: str, limit: int, *, lock: bool) -> web.Application:
    """The aiohttp app; ``lock``: the handler decorated with ``locked("items:{shop}")``."""
    app = web.Application()
    redlock_aiohttp.setup(app, masters, ttl=10.0)

    async def own_db(app: web.Application) -> AsyncIterator[None]:
        app[DB] = Redis.from_url(db_url)
        yield
        await app[DB].aclose()

    app.cleanup_ctx.append(own_db)

    async def post_item(request: web.Request) -> web.Response:
        shop = request.match_info["shop"]
        status, body = await create(request.app[DB], shop, limit, barrier=not lock)
        return web.json_response(body, status=status)

    handler = redlock_aiohttp.locked("items:{shop}", timeout=TIMEOUT)(post_item)
    app.router.add_post("/items/{shop}", handler if lock else post_item)
    return app
