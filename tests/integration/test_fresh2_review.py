"""A fresh user's review, second round: observability.md, fastapi.md, aiohttp.md,
testing.md, singleton.md, scale.md, architecture.md and api.md, each promise checked
the way a service adopting asyncredlock would meet it, against real servers.

Only what those pages say is relied on: an app built exactly as a page shows it, the
OpenTelemetry SDK set up process-wide as observability.md does, the pytest plugin used
from a project of its own in a directory outside this repository."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi import Path as PathParam
from fastapi.testclient import TestClient as StarletteTestClient
from redis import Redis as SyncRedis
from redis.asyncio import Redis

import asyncredlock
import asyncredlock.fencing
import asyncredlock.testing
from asyncredlock import AsyncRedlock, Lease, LockTimeoutError, LostLeaseError
from asyncredlock.contrib import aiohttp as contrib_aiohttp
from asyncredlock.contrib import fastapi as contrib_fastapi
from asyncredlock.testing import ServerGroup, ServerProcess, Waits, client_state, pytest_plugin
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, polled

pytestmark = pytest.mark.anyio

GUARD = 20.0  # seconds: only stops a hung test, never decides an outcome
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SRC = ROOT / "src"


def page(name: str) -> str:
    """A docs page with its lines joined (tables and wrapped sentences read as one)."""
    return " ".join((DOCS / name).read_text().split())


def env_with_src(**extra: str) -> dict[str, str]:
    """The environment of a child interpreter that imports this worktree's library."""
    return dict(os.environ, PYTHONPATH=str(SRC), **extra)


async def held_everywhere(redlock: AsyncRedlock, lease: Lease) -> None:
    """Return once every master holds ``lease`` (``acquire()`` returns at a quorum)."""
    state = await redlock.inspect(lease.resource)
    assert [node.holder for node in state.nodes] == [lease.value] * len(state.nodes), state


# -- observability.md ----------------------------------------------------------------

#: A service set up as observability.md shows, with the SDK's in-memory exporter and
#: reader in place of OTLP: asyncredlock is imported before the SDK is configured (as an
#: app's imports come first), and one lease is even taken before. It acquires, extends
#: and releases under a request span, times out under another, loses a lease whose keys
#: are deleted under a third, finds one gone at its release under a fourth, has a
#: waiter ended by its client's aclose() under a fifth, and loses one master (a
#: password-protected one) to a kill; it prints what the SDK got.
OTEL_APP = r"""
import asyncio, json, os, sys

import asyncredlock  # before the SDK is set up, as an app's imports come first
from asyncredlock import AsyncRedlock, LockTimeoutError, LostLeaseError
from asyncredlock.testing import ServerProcess, Waits

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis

exporter = InMemorySpanExporter()
reader = InMemoryMetricReader()
tracer = trace.get_tracer("service")


def set_up_the_sdk():
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


async def scenario(urls, out):
    async with AsyncRedlock(urls, identity="web-1") as web1, AsyncRedlock(urls) as web2:
        early = await web1.lock("early").acquire()  # no SDK yet: not traced
        set_up_the_sdk()
        await early.extend()
        await early.release()
        with tracer.start_as_current_span("request-ok") as span:
            out["ok"] = format(span.get_span_context().span_id, "x")
            async with web1.lock("orders:1") as lease:
                await lease.extend()
        held = await web1.lock("orders:2").acquire()
        with tracer.start_as_current_span("request-busy") as span:
            out["busy"] = format(span.get_span_context().span_id, "x")
            try:
                await web2.lock("orders:2", timeout=0.2).acquire()
            except LockTimeoutError:
                out["timed_out"] = True
        await held.release()
        with tracer.start_as_current_span("request-lost") as span:
            out["lost"] = format(span.get_span_context().span_id, "x")
            lease = await web1.lock("orders:3", ttl=0.6).acquire()
            state = await web1.inspect("orders:3")
            assert [n.holder for n in state.nodes] == [lease.value] * len(urls), state
            for url in urls:
                client = Redis.from_url(url)
                await client.delete(lease.key)
                await client.aclose()
            await asyncio.wait_for(lease.wait_lost(), 10)
            try:
                await lease.release()
            except LostLeaseError:
                out["release_after_loss"] = "LostLeaseError"
        with tracer.start_as_current_span("request-gone") as span:
            out["gone"] = format(span.get_span_context().span_id, "x")
            quiet = await web1.lock("orders:4", ttl=30, auto_extend=False).acquire()
            state = await web1.inspect("orders:4")
            assert [n.holder for n in state.nodes] == [quiet.value] * len(urls), state
            for url in urls:
                client = Redis.from_url(url)
                await client.delete(quiet.key)
                await client.aclose()
            try:
                await quiet.release()
            except LostLeaseError:
                out["release_found_it_gone"] = "LostLeaseError"
        held = await web1.lock("orders:5").acquire()
        with tracer.start_as_current_span("request-closing") as span:
            out["closing"] = format(span.get_span_context().span_id, "x")
            web3 = AsyncRedlock(urls)
            with Waits(web3) as waits:
                waiting = asyncio.ensure_future(web3.lock("orders:5", timeout=10).acquire())
                await waits.reach(1)
            await web3.aclose()
            try:
                await waiting
            except RuntimeError:
                out["closed_while_waiting"] = "RuntimeError"
        await held.release()


async def one_master_killed(urls, guarded):
    async with AsyncRedlock(urls) as redlock:
        await (await redlock.lock("warm").acquire()).release()
        guarded.kill()
        await (await redlock.lock("after-kill").acquire()).release()


urls = os.environ["URLS"].split(",")
out = {}
asyncio.run(scenario(urls, out))
with ServerProcess(password="s3cret-pw") as guarded:
    out["guarded"] = guarded.url.replace("s3cret-pw", "")
    asyncio.run(one_master_killed([guarded.url, *urls[1:]], guarded))
out["spans"] = [
    {
        "name": s.name,
        "kind": s.kind.name,
        "scope": [s.instrumentation_scope.name, s.instrumentation_scope.version],
        "parent": format(s.parent.span_id, "x") if s.parent else None,
        "attributes": dict(s.attributes or {}),
        "status": s.status.status_code.name,
        "events": [[e.name, dict(e.attributes or {})] for e in s.events],
    }
    for s in exporter.get_finished_spans()
]
out["points"] = [
    {
        "scope": [sm.scope.name, sm.scope.version],
        "name": m.name,
        "unit": m.unit,
        "kind": type(m.data).__name__,
        "attributes": dict(p.attributes or {}),
        "bounds": list(getattr(p, "explicit_bounds", None) or []),
        "value": getattr(p, "count", getattr(p, "value", None)),
    }
    for rm in reader.get_metrics_data().resource_metrics
    for sm in rm.scope_metrics
    for m in sm.metrics
    for p in m.data.data_points
]
print(json.dumps(out))
"""

#: observability.md: "histograms advise buckets from 0.5 ms to 60 s"
DOCUMENTED_BOUNDS_ENDS = (0.0005, 60.0)


@pytest.mark.timeout(90)
async def test_the_documented_sdk_setup_gets_every_span_metric_and_attribute(
    servers: ServerGroup,
) -> None:
    """observability.md, set up as written (process-wide providers, the library
    imported first): the spans' names, kind, parents and attributes, the lost-lease
    event on the request's span, the metric names, units, attributes and buckets, the
    instrumentation scope, and a master named without its password."""
    urls = servers.urls[:3]
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [sys.executable, "-c", OTEL_APP],
            env=env_with_src(URLS=",".join(urls)),
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout)
    ours = [s for s in out["spans"] if s["scope"][0] == "asyncredlock"]
    # "A lease taken while neither its acquire span nor the caller's span recorded
    # (no SDK configured yet ...) is not traced"
    assert [s for s in ours if s["attributes"]["asyncredlock.resource"] == "early"] == []
    # "The instrumentation scope is asyncredlock, with the package's version."
    assert {tuple(s["scope"]) for s in ours} == {("asyncredlock", asyncredlock.__version__)}
    assert {s["kind"] for s in ours} == {"INTERNAL"}

    def under(parent: str) -> list[dict[str, Any]]:
        return [s for s in ours if s["parent"] == parent]

    acquire, extend, release = under(out["ok"])
    assert [acquire["name"], extend["name"], release["name"]] == [
        "asyncredlock.acquire",
        "asyncredlock.extend",
        "asyncredlock.release",
    ]
    assert acquire["attributes"]["asyncredlock.resource"] == "orders:1"
    assert acquire["attributes"]["asyncredlock.outcome"] == "acquired"
    assert acquire["attributes"]["asyncredlock.attempts"] == 1
    assert acquire["attributes"]["asyncredlock.source"] == "attempt"
    assert acquire["attributes"]["asyncredlock.masters.granted"] >= 2
    token = acquire["attributes"]["asyncredlock.fencing_token"]
    for span in (extend, release):
        assert span["attributes"]["asyncredlock.outcome"] == "ok"
        assert span["attributes"]["asyncredlock.fencing_token"] == token
        assert span["status"] == "UNSET"
    (timed_out,) = under(out["busy"])
    assert out["timed_out"]
    assert timed_out["status"] == "ERROR"
    assert timed_out["attributes"]["asyncredlock.outcome"] == "timeout"
    assert timed_out["attributes"]["error.type"] == "LockTimeoutError"
    # the loss: the failed extension under the request, the event on the request's span
    acquire3, failed = under(out["lost"])
    assert failed["name"] == "asyncredlock.extend"
    assert failed["attributes"]["asyncredlock.outcome"] == "not-held"
    assert failed["attributes"]["error.type"] == "RoundFailedError"
    assert failed["status"] == "ERROR"
    assert out["release_after_loss"] == "LostLeaseError"  # and no release span for it
    (request,) = [s for s in out["spans"] if s["name"] == "request-lost"]
    ((event, attributes),) = request["events"]
    assert event == "asyncredlock.lease.lost"
    assert attributes == {
        "asyncredlock.resource": "orders:3",
        "asyncredlock.reason": "a majority of masters no longer hold it",
        "asyncredlock.cause": "gone",
        "asyncredlock.fencing_token": acquire3["attributes"]["asyncredlock.fencing_token"],
    }
    # a release that finds the lease gone: its span says so, the event gives why
    assert out["release_found_it_gone"] == "LostLeaseError"
    _acquire4, release4 = under(out["gone"])
    assert release4["name"] == "asyncredlock.release"
    assert release4["attributes"]["asyncredlock.outcome"] == "not-held"
    assert release4["status"] == "ERROR"
    (request,) = [s for s in out["spans"] if s["name"] == "request-gone"]
    ((event, attributes),) = request["events"]
    assert (event, attributes["asyncredlock.cause"]) == ("asyncredlock.lease.lost", "gone")
    assert attributes["asyncredlock.reason"] == "gone from a majority when released"
    # an acquire ended by its client's aclose(): an error span, as the table lists
    assert out["closed_while_waiting"] == "RuntimeError"
    (closing,) = under(out["closing"])
    assert closing["attributes"]["asyncredlock.outcome"] == "error"
    assert closing["attributes"]["error.type"] == "RuntimeError"
    assert closing["status"] == "ERROR"
    # metrics: names, kinds, units and attributes as the table writes them
    points = [p for p in out["points"] if p["scope"][0] == "asyncredlock"]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for point in points:
        by_name.setdefault(point["name"], []).append(point)
    for name in ("asyncredlock.acquire.duration", "asyncredlock.hold.duration"):
        assert {(p["kind"], p["unit"]) for p in by_name[name]} == {("Histogram", "s")}
        for point in by_name[name]:
            assert (point["bounds"][0], point["bounds"][-1]) == DOCUMENTED_BOUNDS_ENDS
            assert set(point["attributes"]) == {"asyncredlock.outcome"}  # no resource
    acquired = {
        p["attributes"]["asyncredlock.outcome"]: p["value"]
        for p in by_name["asyncredlock.acquire.duration"]
    }
    assert acquired["timeout"] == 1
    held = {
        p["attributes"]["asyncredlock.outcome"]: p["value"]
        for p in by_name["asyncredlock.hold.duration"]
    }
    assert held["lost"] == 2
    assert acquired["error"] == 1
    (lost,) = by_name["asyncredlock.lease.lost"]
    assert (lost["unit"], lost["attributes"], lost["value"]) == (
        "{lease}",
        {"asyncredlock.cause": "gone"},
        2,
    )
    errors = by_name["asyncredlock.master.errors"]
    assert {p["unit"] for p in errors} == {"{call}"}
    assert {p["attributes"]["asyncredlock.master"] for p in errors} == {
        out["guarded"].replace(":@", "@").replace("redis://@", "redis://")
    }
    assert {p["attributes"]["error.type"] for p in errors} <= {"ConnectionError"}
    assert "s3cret-pw" not in json.dumps(out)


class StatsStory:
    """Reads one `RedlockStatistics` field by field, for a message that shows all."""

    FIELDS = (
        "attempts",
        "acquisitions",
        "handovers",
        "failed_attempts",
        "timeouts",
        "unavailable",
        "extensions",
        "failed_extensions",
        "releases",
        "lost",
        "handoffs",
        "held",
    )

    @classmethod
    def of(cls, redlock: AsyncRedlock) -> dict[str, int]:
        stats = redlock.statistics()
        return {name: getattr(stats, name) for name in cls.FIELDS}


@pytest.mark.timeout(60)
async def test_statistics_tell_a_contended_timed_out_and_lost_story(
    servers: ServerGroup, masters: Masters
) -> None:
    """usage.md's table (which observability.md sends to) read after a real story:
    one holder, a second client timing out on it, a lease lost to its keys being
    deleted (found by the automatic extension), and one whose release finds its keys
    gone (no extension ran): each loss counted once."""
    async with (
        AsyncRedlock(servers.urls, identity="web-1") as web1,
        AsyncRedlock(servers.urls, identity="web-2") as web2,
    ):
        held = await web1.lock("orders:1").acquire()
        with pytest.raises(LockTimeoutError):
            await web2.lock("orders:1", timeout=0.2).acquire()
        await held.release()
        # lost under its holder: the automatic extension finds it gone
        lease = await web1.lock("orders:2", ttl=0.6).acquire()
        await masters.delete_held(web1, lease)
        with anyio.fail_after(GUARD):
            await lease.wait_lost()
        assert lease.lost
        with pytest.raises(LostLeaseError):
            await lease.release()
        # gone under a holder that does not extend: its release finds it
        quiet = await web1.lock("orders:3", ttl=30, auto_extend=False).acquire()
        await masters.delete_held(web1, quiet)
        with pytest.raises(LostLeaseError):
            await quiet.release()
        with anyio.fail_after(GUARD):
            await web1.settle()
        one, two = StatsStory.of(web1), StatsStory.of(web2)
        per_resource = web1.resource_statistics()
        assert lease.statistics().source == "attempt"
        assert lease.statistics().attempts == 1
        wait, hold = web1.statistics().wait, web1.statistics().hold
    assert one == {
        "attempts": 3,
        "acquisitions": 3,
        "handovers": 0,
        "failed_attempts": 0,
        "timeouts": 0,
        "unavailable": 0,
        "extensions": 0,
        "failed_extensions": 1,  # the round that found orders:2 gone
        "releases": 2,  # orders:1, and the release that found orders:3 gone
        "lost": 2,  # orders:2 (while held), orders:3 (by its release): once each
        "handoffs": 0,
        "held": 0,
    }, one
    assert two["timeouts"] == 1
    assert two["acquisitions"] == 0
    assert two["attempts"] == two["failed_attempts"] >= 1
    assert (wait.count, hold.count) == (3, 3)
    assert per_resource["orders:2"].lost == 1
    assert per_resource["orders:3"].lost == 1
    assert per_resource["orders:1"].acquisitions == 1
    assert web2.resource_statistics()["orders:1"].timeouts == 1


async def handed_over(
    holder: AsyncRedlock, waiter: AsyncRedlock, name: str, **options: Any
) -> Lease:
    """``waiter``'s lease on ``name``, taken while ``holder`` held it: it waits, parked,
    until ``holder`` releases."""
    lease = await holder.lock(name, **options).acquire()
    got: list[Lease] = []
    with Waits(waiter) as waits, anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:

            async def take() -> None:
                got.append(await waiter.lock(name, timeout=GUARD, **options).acquire())

            tg.start_soon(take)
            await waits.reach(1)
            await lease.release()
    return got[0]


@pytest.mark.timeout(60)
async def test_acquisitions_and_failed_attempts_are_parts_of_attempts(
    servers: ServerGroup,
) -> None:
    """usage.md's table: ``attempts`` are the rounds sent, each won or failed
    (``failed_attempts``), or cut short (in neither); ``acquisitions`` the leases
    taken from the masters, ``handovers`` of them handed over by a release with no
    attempt of their own: so the attempts won and failed never add up to more than
    ``attempts``. A waiter handed the lock by the release made them do so while
    ``acquisitions`` was said to be the attempts that took the lock."""
    async with AsyncRedlock(servers.urls) as web1, AsyncRedlock(servers.urls) as web2:
        lease = await handed_over(web1, web2, "orders:42")
        await lease.release()
        source = lease.statistics().source
        stats = web2.statistics()
    assert source == "hand-over"
    assert stats.handovers == 1, stats
    won = stats.acquisitions - stats.handovers
    assert won + stats.failed_attempts == stats.attempts, stats  # none was cut short
    assert "`acquisitions - handovers + failed_attempts <= attempts`" in page("usage.md")


@pytest.mark.timeout(60)
async def test_acquired_after_waiting_counts_its_attempts_in_english(
    servers: ServerGroup, caplog: pytest.LogCaptureFixture
) -> None:
    """errors.md's INFO line ``acquired 'orders:42' after waiting (waited 0.153 s, 2
    attempts)``, for a fair lock's waiter handed the lock after its one attempt."""
    caplog.set_level(logging.INFO, logger="asyncredlock")
    async with AsyncRedlock(servers.urls) as web1, AsyncRedlock(servers.urls) as web2:
        await (await handed_over(web1, web2, "warm-up")).release()  # web2 subscribed
        for _ in range(5):  # one waiter handed the lock after a single attempt
            caplog.clear()
            lease = await handed_over(web1, web2, "orders:42", fair=True)
            await lease.release()
            if lease.statistics().attempts == 1:
                break
    assert lease.statistics().attempts == 1
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("acquired")]
    assert line.endswith(", 1 attempt)"), line


@pytest.mark.timeout(60)
async def test_every_lease_log_line_is_on_one_logger_with_the_listed_extras(
    servers: ServerGroup, masters: Masters, caplog: pytest.LogCaptureFixture
) -> None:
    """observability.md / errors.md: the log tells a lease's story on the
    ``asyncredlock`` logger (no child loggers to configure), with ``resource``,
    ``identity``, ``token``, ``masters`` and ``reason`` on each lease event, for a
    structured handler."""
    caplog.set_level(logging.DEBUG, logger="asyncredlock")
    async with (
        AsyncRedlock(servers.urls, identity="web-1") as web1,
        AsyncRedlock(servers.urls, identity="web-2") as web2,
    ):
        first = await web1.lock("story").acquire()
        got: list[Lease] = []
        with Waits(web2) as waits, anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:

                async def take() -> None:
                    got.append(await web2.lock("story", ttl=0.6).acquire())

                tg.start_soon(take)
                await waits.reach(1)
                await first.release()
        (second,) = got
        await masters.delete_held(web2, second)
        with anyio.fail_after(GUARD):
            await second.wait_lost()
    ours = [r for r in caplog.records if r.name.startswith("asyncredlock")]
    assert {r.name for r in ours} == {"asyncredlock"}
    story = [r for r in ours if getattr(r, "resource", None) == "story"]
    levels = [(r.levelname, r.getMessage().split(" (")[0].split(":")[0]) for r in story]
    assert ("INFO", "acquired 'story' after waiting") in levels, levels
    assert ("WARNING", "lease on 'story' lost") in levels, levels
    for record in story:
        facts = {name: record.__dict__.get(name) for name in ("identity", "token", "reason")}
        assert facts == {
            "identity": "web-2",
            "token": second.token,
            "reason": facts["reason"],
        }, record.getMessage()
        assert isinstance(record.__dict__["reason"], str)
        assert record.__dict__["reason"]
        assert isinstance(record.__dict__["masters"], dict), record.getMessage()


@pytest.mark.timeout(60)
async def test_a_silent_master_is_logged_by_its_display_name_with_masters_and_reason(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture
) -> None:
    """errors.md via observability.md: "the master events carry masters and reason";
    a master's URL with a password is shown without it.

    A master is judged silent only by a watchdog that fires less than half a node
    timeout late (a late loop says nothing about the master), and dropped unjudged
    after ``socket_timeout``: with a node timeout of 0.05 s, a loaded machine's loop
    was late by more than 25 ms at every look, and the line never came. A node
    timeout of 1 s allows half a second, and a socket timeout of a minute keeps
    the connection to judge until the hang guard."""
    caplog.set_level(logging.INFO, logger="asyncredlock")
    group = make_servers(2)
    with ServerProcess(password="s3cret-pw") as guarded:
        urls = [guarded.url, *group.urls]
        async with AsyncRedlock(urls, node_timeout=1.0, socket_timeout=60.0) as redlock:
            await (await redlock.lock("warm").acquire()).release()
            guarded.pause()
            try:
                lease = await redlock.lock("quiet").acquire()  # the two others: a quorum

                def silent() -> bool:
                    return any(" silent" in r.getMessage() for r in caplog.records)

                assert await polled(silent, polls=1200)  # 30 s: a hang guard
            finally:
                guarded.resume()
            await lease.release()
            with anyio.fail_after(GUARD):
                await redlock.settle()
    (record,) = [r for r in caplog.records if " silent" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "s3cret-pw" not in record.getMessage()
    assert record.getMessage().startswith("master redis://127.0.0.1:")
    assert "masters" in record.__dict__
    assert "s3cret-pw" not in json.dumps(record.__dict__["masters"])
    assert isinstance(record.__dict__.get("reason"), str), record.__dict__


# -- fastapi.md ----------------------------------------------------------------------


@asynccontextmanager
async def fastapi_serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """``app`` started (its lifespan entered) and a client of it over httpx's ASGI
    transport."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            yield client


def answer(status: int, headers: Any, body: Any) -> tuple[int, str | None, Any]:
    return status, headers.get("Retry-After"), body


@pytest.mark.timeout(60)
async def test_fastapi_first_example_as_written(servers: ServerGroup) -> None:
    """fastapi.md's first example, only ``save`` and the masters filled in: the
    handler runs holding ``orders:<order_id>`` with its token; a second request for
    the same order waits for it; ``/orders/007`` is another name than
    ``/orders/7`` ("Worth knowing")."""
    saved: list[tuple[int, int | None]] = []

    async def save(order_id: int, fence: int | None) -> None:
        saved.append((order_id, fence))

    app = FastAPI(lifespan=contrib_fastapi.lifespan(servers.urls[:3], ttl=10.0))
    contrib_fastapi.add_exception_handlers(app)

    @app.put("/orders/{order_id}")
    async def update(
        order_id: int,
        lease: Annotated[Lease, Depends(contrib_fastapi.locked("orders:{order_id}"))],
    ):  # as the page writes it (the Annotated form: ruff's B008 flags a default Depends())
        await save(order_id, fence=lease.token)

    async with AsyncRedlock(servers.urls[:3]) as other:
        with anyio.fail_after(GUARD):
            async with fastapi_serving(app) as client:
                first = await client.put("/orders/7")
                assert (first.status_code, first.json()) == (200, None)
                # held elsewhere: the request waits for it (default timeout, 10 s)
                held = await other.lock("orders:7").acquire()
                redlock = contrib_fastapi.redlock_of(app)
                responses: list[httpx.Response] = []
                with Waits(redlock) as waits:
                    async with anyio.create_task_group() as tg:

                        async def put() -> None:
                            responses.append(await client.put("/orders/7"))

                        tg.start_soon(put)
                        await waits.reach(1)
                        # meanwhile /orders/007 is a name of its own: not held
                        zeros = await client.put("/orders/007")
                        assert zeros.status_code == 200
                        await held.release()
    assert [r.status_code for r in responses] == [200]
    assert [order for order, _ in saved] == [7, 7, 7]
    tokens = [token for _, token in saved]
    assert all(isinstance(token, int) for token in tokens)
    assert tokens[2] > tokens[0]  # the waiter came after the holder it waited for


def test_fastapi_own_lifespan_example_serves_a_mounted_sub_application(
    servers: ServerGroup,
) -> None:
    """fastapi.md "The lifespan" + "Mounted sub-applications", under Starlette's
    TestClient (which supports lifespan state): the composed lifespan of the page,
    ``app_lifespan`` yielding ``state``; a mounted sub-app's ``locked()`` route and
    its own exception handlers (423 with Retry-After); the app's own shutdown runs
    before the ``AsyncRedlock`` closes. A bare ``yield`` leaves the sub-app's routes a
    500 that says so."""
    urls = servers.urls[:3]
    order: list[str] = []

    class DB:
        def __init__(self, app: FastAPI) -> None:
            self.app = app

        async def close(self) -> None:
            # "before the AsyncRedlock closes": it still takes a lock here
            lease = await contrib_fastapi.redlock_of(self.app).lock("db:close").acquire()
            await lease.release()
            order.append("db closed")

    def make_app(*, bare_yield: bool) -> FastAPI:
        redlock_lifespan = contrib_fastapi.lifespan(urls, identity="api-3")

        async def connect_db(app: FastAPI) -> DB:
            contrib_fastapi.redlock_of(app)  # "redlock_of(app) is ready here"
            return DB(app)

        @asynccontextmanager
        async def app_lifespan(app: FastAPI) -> AsyncIterator[Any]:
            async with redlock_lifespan(app) as state:
                app.state.db = await connect_db(app)
                if bare_yield:
                    yield
                else:
                    yield state
                await app.state.db.close()

        app = FastAPI(lifespan=app_lifespan)
        sub = FastAPI()
        contrib_fastapi.add_exception_handlers(sub)

        @sub.put("/orders/{order_id:int}")
        async def update(
            order_id: int,
            request: Request,
            lease: Annotated[
                Lease, Depends(contrib_fastapi.locked("orders:{order_id}", timeout=0))
            ],
        ) -> dict[str, Any]:
            return {"value": lease.value, "mine": contrib_fastapi.redlock_of(request).identity}

        app.mount("/v2", sub)
        return app

    direct = [SyncRedis.from_url(url) for url in urls]
    try:
        for client in direct:  # another holder of orders:8, as a plain SET would be
            client.set("orders:8", "other:0123", px=30_000)
        with StarletteTestClient(make_app(bare_yield=False)) as client:
            ok = client.put("/v2/orders/7")
            busy = client.put("/v2/orders/8")
        assert ok.status_code == 200, ok.text
        assert ok.json()["value"].startswith("api-3:")
        assert ok.json()["mine"] == "api-3"
        assert answer(busy.status_code, busy.headers, busy.json()) == (
            423,
            "1",
            {"detail": "locked: held by another holder past the timeout", "resource": "orders:8"},
        )
        assert order == ["db closed"]
        with StarletteTestClient(
            make_app(bare_yield=True), raise_server_exceptions=False
        ) as client:
            orphan = client.put("/v2/orders/7")
        assert orphan.status_code == 500
    finally:
        for client in direct:
            client.delete("orders:8")
            client.close()


async def _committed(request: Request) -> None:
    """A session's commit: notes whether its route's lock is held at that moment."""
    route = request.path_params["route"]
    state = await contrib_fastapi.redlock_of(request).inspect(f"orders:{route}")
    request.app.state.held_at_commit[route] = state.holder is not None


async def get_session(request: Request) -> AsyncIterator[str]:
    """fastapi.md's database session: it commits after its ``yield``."""
    yield "session"
    await _committed(request)


async def get_locked_session(
    request: Request,
    lease: Lease = Depends(contrib_fastapi.locked("orders:{route}")),  # noqa: B008
) -> AsyncIterator[str]:
    """The page's ``async def get_session(lease: Lease = Depends(locked(...)))``."""
    yield "session"
    await _committed(request)


#: (module level: FastAPI reads the routes' annotations as strings, in this module)
OrdersLease = Annotated[Lease, Depends(contrib_fastapi.locked("orders:{route}"))]
RequestSession = Annotated[str, Depends(get_session)]
FunctionSession = Annotated[str, Depends(get_session, scope="function")]
LockedSession = Annotated[str, Depends(get_locked_session, scope="function")]


@pytest.mark.timeout(60)
async def test_a_yield_dependency_commits_under_the_lock_only_as_the_page_says(
    servers: ServerGroup,
) -> None:
    """fastapi.md "Worth knowing": a request-scoped ``yield`` dependency runs its
    after-``yield`` part once the lock is released; one with ``scope="function"``
    listed after ``locked()``, or taking the lease as a parameter, runs it holding the
    lock; listed before ``locked()``, after the release."""
    app = FastAPI(lifespan=contrib_fastapi.lifespan(servers.urls[:3]))
    contrib_fastapi.add_exception_handlers(app)
    app.state.held_at_commit = {}

    @app.put("/request/{route}")
    async def request_scoped(route: str, lease: OrdersLease, session: RequestSession) -> None:
        pass

    @app.put("/after/{route}")
    async def function_after(route: str, lease: OrdersLease, session: FunctionSession) -> None:
        pass

    @app.put("/before/{route}")
    async def function_before(route: str, session: FunctionSession, lease: OrdersLease) -> None:
        pass

    @app.put("/param/{route}")
    async def lease_parameter(route: str, session: LockedSession) -> None:
        pass

    with anyio.fail_after(GUARD):
        async with fastapi_serving(app) as client:
            for route in ("request", "after", "before", "param"):
                response = await client.put(f"/{route}/{route}")
                assert response.status_code == 200, response.text
    assert app.state.held_at_commit == {
        "request": False,
        "after": True,
        "before": False,
        "param": True,
    }


@pytest.mark.timeout(60)
async def test_a_path_pattern_comes_after_the_lock_and_a_field_takes_colons(
    servers: ServerGroup,
) -> None:
    """fastapi.md "Worth knowing": a ``Path(pattern=...)`` is checked after the lock
    was taken (a refused path held elsewhere gets 423, not 422), and a field takes
    ``:`` from the path (``orders:{a}`` with ``a`` = ``7:items`` locks
    ``orders:7:items``)."""
    app = FastAPI(lifespan=contrib_fastapi.lifespan(servers.urls[:3]))
    contrib_fastapi.add_exception_handlers(app)

    @app.put(
        "/codes/{code}", dependencies=[Depends(contrib_fastapi.locked("codes:{code}", timeout=0))]
    )
    async def by_code(code: Annotated[str, PathParam(pattern="^[0-9]+$")]) -> None:
        pass

    @app.put("/o/{a}", dependencies=[Depends(contrib_fastapi.locked("orders:{a}", timeout=0))])
    async def by_a(a: str) -> None:
        pass

    async with AsyncRedlock(servers.urls[:3]) as other:
        with anyio.fail_after(GUARD):
            async with fastapi_serving(app) as client:
                free = await client.put("/codes/abc")
                taken = contrib_fastapi.redlock_of(app).statistics().acquisitions
                async with other.lock("codes:abc"), other.lock("orders:7:items"):
                    refused = await client.put("/codes/abc")
                    colon = await client.put("/o/7:items")
    assert free.status_code == 422
    assert taken == 1  # the lock was taken for a path the pattern then refused
    assert refused.status_code == 423
    assert (colon.status_code, colon.json()["resource"]) == (423, "orders:7:items")


#: (module level: FastAPI reads the route's annotations as strings, in this module)
RoomLease = Annotated[Lease, Depends(contrib_fastapi.locked("rooms:{room}", timeout=0))]


@pytest.mark.timeout(60)
async def test_a_websocket_refused_where_the_server_has_no_denial_response(
    servers: ServerGroup,
) -> None:
    """fastapi.md "WebSocket routes": a lock error before the handshake "refuses it
    (403) where" the server does not support the ASGI WebSocket denial response: the
    app must then send ``websocket.close`` (the server's 403), never
    ``websocket.http.response.start``, which ASGI allows only to a server that lists
    ``websocket.http.response`` in the scope's extensions."""
    app = FastAPI(lifespan=contrib_fastapi.lifespan(servers.urls[:3]))
    contrib_fastapi.add_exception_handlers(app)

    @app.websocket("/rooms/{room}")
    async def room(websocket: WebSocket, room: str, lease: RoomLease) -> None:
        await websocket.accept()
        await websocket.close()

    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "scheme": "ws",
        "path": "/rooms/1",
        "raw_path": b"/rooms/1",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"app")],
        "server": ("app", 80),
        "client": ("127.0.0.1", 1),
        "subprotocols": [],
        "extensions": {},  # a server without the denial response
    }
    sent: list[dict[str, Any]] = []
    connect = [{"type": "websocket.connect"}]

    async def receive() -> dict[str, Any]:
        if connect:
            return connect.pop()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with AsyncRedlock(servers.urls[:3]) as other, other.lock("rooms:1"):
        with anyio.fail_after(GUARD):
            async with app.router.lifespan_context(app):
                await app(scope, receive, send)
    assert [message["type"] for message in sent][:1] == ["websocket.close"], sent


# -- aiohttp.md ----------------------------------------------------------------------

AiohttpClient = TestClient[web.Request, web.Application]


@asynccontextmanager
async def aiohttp_serving(app: web.Application) -> AsyncIterator[AiohttpClient]:
    async with TestClient(TestServer(app)) as client:
        yield client


async def delete_everywhere(urls: list[str], redlock: AsyncRedlock, name: str) -> None:
    """Delete the lock key ``name`` on every master once every master holds it."""
    state = await redlock.inspect(name)
    assert state.holder is not None
    assert all(node.holder == state.holder for node in state.nodes), state
    for url in urls:
        client = Redis.from_url(url)
        await client.delete(state.key)
        await client.aclose()


@pytest.mark.timeout(60)
async def test_aiohttp_first_example_as_written(servers: ServerGroup) -> None:
    """aiohttp.md's first example, the masters filled in: 200 holding the lock,
    ``request.config_dict[REDLOCK]`` the app's ``AsyncRedlock``; contended past its
    ``timeout=2``, 423 with ``Retry-After`` and the documented body; a lease whose
    keys vanish while the handler runs cancels it, 503."""
    urls = servers.urls[:3]
    REDLOCK, locked, setup = contrib_aiohttp.REDLOCK, contrib_aiohttp.locked, contrib_aiohttp.setup
    seen: list[object] = []
    cancelled = anyio.Event()

    app = web.Application()
    setup(app, urls, ttl=10.0)

    @locked("orders:{order_id}", timeout=2)
    async def update(request: web.Request) -> web.Response:
        redlock = request.config_dict[REDLOCK]  # the app's AsyncRedlock, should it be needed
        seen.append(redlock)
        return web.json_response({"ok": True})

    app.router.add_put("/orders/{order_id}", update)

    @locked("jobs:{job}", ttl=0.6)
    async def work(request: web.Request) -> web.Response:
        await delete_everywhere(
            urls, request.config_dict[REDLOCK], f"jobs:{request.match_info['job']}"
        )
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    app.router.add_post("/jobs/{job}", work)

    async with AsyncRedlock(urls) as other:
        with anyio.fail_after(GUARD):
            async with aiohttp_serving(app) as client:
                async with client.put("/orders/7") as response:
                    ok = (response.status, await response.json())
                async with other.lock("orders:8"), client.put("/orders/8") as response:
                    busy = answer(response.status, response.headers, await response.json())
                async with client.post("/jobs/1") as response:
                    lost = answer(response.status, response.headers, await response.json())
                assert cancelled.is_set()
                assert seen == [app[REDLOCK]]
    assert ok == (200, {"ok": True})
    assert isinstance(seen[0], AsyncRedlock)
    assert busy == (
        423,
        "1",
        {"detail": "locked: held by another holder past the timeout", "resource": "orders:8"},
    )
    assert lost == (
        503,
        "1",
        {"detail": "lock lost while the handler ran: its work was cancelled", "resource": "jobs:1"},
    )


@pytest.mark.timeout(60)
async def test_an_aiohttp_handler_can_reach_its_leases_token(servers: ServerGroup) -> None:
    """fastapi.md's ``locked()`` yields the lease (``lease.token`` for the writes, as
    fencing.md asks); aiohttp.md's ``@locked`` neither passes it nor says where a
    handler finds it: a handler of a fenced lock has no token to send."""
    app = web.Application()
    contrib_aiohttp.setup(app, servers.urls[:3])
    found: list[object] = []

    @contrib_aiohttp.locked("orders:{order_id}")
    async def update(request: web.Request) -> web.Response:
        found.extend(value for value in request.values() if isinstance(value, Lease))
        found.extend(value for value in vars(request).values() if isinstance(value, Lease))
        return web.json_response({})

    app.router.add_put("/orders/{order_id}", update)
    with anyio.fail_after(GUARD):
        async with aiohttp_serving(app) as client, client.put("/orders/7") as response:
            assert response.status == 200
    assert len(found) == 1


@pytest.mark.timeout(60)
async def test_aiohttp_route_table_order_and_one_spelling_per_order(servers: ServerGroup) -> None:
    """aiohttp.md: ``@locked`` below ``@routes.put(...)`` holds the lock, above it the
    route runs without it; a route pattern ``{order_id:[1-9][0-9]*}`` refuses
    ``/orders/007`` (404), so one order has one lock name."""
    urls = servers.urls[:3]
    app = web.Application()
    contrib_aiohttp.setup(app, urls)
    routes = web.RouteTableDef()
    holders: dict[str, str | None] = {}

    async def note(request: web.Request, route: str) -> web.Response:
        state = await request.config_dict[contrib_aiohttp.REDLOCK].inspect(f"{route}:1")
        holders[route] = state.holder
        return web.json_response({})

    @routes.put("/below/{order_id:[1-9][0-9]*}")
    @contrib_aiohttp.locked("below:{order_id}")
    async def below(request: web.Request) -> web.Response:
        return await note(request, "below")

    @contrib_aiohttp.locked("above:{order_id}")
    @routes.put("/above/{order_id:[1-9][0-9]*}")
    async def above(request: web.Request) -> web.Response:
        return await note(request, "above")

    app.add_routes(routes)
    with anyio.fail_after(GUARD):
        async with aiohttp_serving(app) as client:
            for path in ("/below/1", "/above/1"):
                async with client.put(path) as response:
                    assert response.status == 200
            async with client.put("/below/007") as response:
                zeros = response.status
    assert holders["below"] is not None
    assert holders["above"] is None  # documented: the route runs without the lock
    assert zeros == 404


@pytest.mark.timeout(60)
async def test_aiohttp_shutdown_and_cleanup_see_the_redlock_as_documented(
    servers: ServerGroup,
) -> None:
    """aiohttp.md: a cleanup context added after ``setup()`` uses ``app[REDLOCK]``
    at both ends; ``on_shutdown`` handlers run while it is open; ``on_cleanup``
    handlers run after it closed."""
    urls = servers.urls[:3]
    app = web.Application()
    contrib_aiohttp.setup(app, urls)
    seen: dict[str, str] = {}

    async def try_lock(where: str, app: web.Application) -> None:
        try:
            lease = await app[contrib_aiohttp.REDLOCK].lock(f"at:{where}", timeout=0).acquire()
        except RuntimeError:
            seen[where] = "closed"
        else:
            await lease.release()
            seen[where] = "open"

    async def own_context(app: web.Application) -> AsyncIterator[None]:
        await try_lock("own startup", app)
        yield
        await try_lock("own cleanup", app)

    async def on_shutdown(app: web.Application) -> None:
        await try_lock("on_shutdown", app)

    async def on_cleanup(app: web.Application) -> None:
        await try_lock("on_cleanup", app)

    app.cleanup_ctx.append(own_context)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    with anyio.fail_after(GUARD):
        async with aiohttp_serving(app):
            pass
    assert seen == {
        "own startup": "open",
        "on_shutdown": "open",
        "own cleanup": "open",
        "on_cleanup": "closed",
    }


# -- singleton.md --------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_a_leader_whose_keys_vanish_is_cancelled_and_leads_again(
    servers: ServerGroup, caplog: pytest.LogCaptureFixture
) -> None:
    """singleton.md: a leader that loses the lock has its job cancelled at once, is
    logged, waits, and starts the job anew with a larger token; a job that returns
    gives its value once and leaves the lock free; ``inspect(name).identity`` shows
    the leader, by default ``"<hostname>:<pid>"``."""
    urls = servers.urls[:3]
    tokens: list[int | None] = []
    leaders: list[str | None] = []
    cancelled: list[int] = []
    async with AsyncRedlock(urls) as redlock:

        async def schedule(lease: Lease) -> str:
            tokens.append(lease.token)
            leaders.append((await redlock.inspect("scheduler")).identity)
            if len(tokens) == 1:
                await delete_everywhere(urls, redlock, "scheduler")
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    cancelled.append(len(tokens))
                    raise
            return "enqueued"

        with anyio.fail_after(GUARD):
            result = await redlock.run_singleton("scheduler", schedule, ttl=0.6)
        after = await redlock.inspect("scheduler")
    assert result == "enqueued"
    assert cancelled == [1]
    assert len(tokens) == 2
    assert tokens[1] > tokens[0]  # type: ignore[operator]
    assert leaders == [f"{socket.gethostname()}:{os.getpid()}"] * 2
    assert after.holder is None
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncredlock"]
    assert "singleton 'scheduler' lost its lock; waiting to lead again" in messages


@pytest.mark.timeout(60)
async def test_a_job_that_raises_is_not_restarted_and_frees_the_lock(servers: ServerGroup) -> None:
    """singleton.md: "The job raises: the lock is released and the exception
    propagates ... the job is not restarted"; called from inside its own job on the
    same name it raises RuntimeError (it would wait for itself)."""
    urls = servers.urls[:3]
    runs: list[str] = []
    async with AsyncRedlock(urls, identity="worker-1") as redlock:

        async def job(lease: Lease) -> None:
            runs.append((await redlock.inspect("nightly")).identity or "")
            with pytest.raises(RuntimeError):
                await redlock.run_singleton("nightly", job)
            raise KeyError("bad row")

        with anyio.fail_after(GUARD), pytest.raises(KeyError, match="bad row"):
            await redlock.run_singleton("nightly", job)
        assert (await redlock.inspect("nightly")).holder is None
    assert runs == ["worker-1"]


# -- scale.md ------------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_what_a_lock_leaves_on_a_master(servers: ServerGroup, masters: Masters) -> None:
    """scale.md "What a lock leaves on a master": while held, the lock key (with a
    TTL) and, fenced, ``{K}:fence``; after release or ``force_release()`` only the
    counter, with no expiry; ``fencing=False`` leaves nothing and has no token."""
    async with AsyncRedlock(servers.urls) as redlock:
        fenced = await redlock.lock("orders:1", ttl=30).acquire()
        plain = await redlock.lock("req:1", ttl=30, fencing=False).acquire()
        forced = await redlock.lock("orders:2", ttl=30).acquire()
        for lease in (fenced, plain, forced):
            await held_everywhere(redlock, lease)
        assert plain.token is None
        assert isinstance(fenced.token, int)
        held_keys = await masters.keys()  # every key but the fence counters
        assert held_keys == [[b"orders:1", b"orders:2", b"req:1"]] * len(servers)
        for client in masters.clients:
            assert 0 < await client.pttl("orders:1") <= 30_000
        await fenced.release()
        await plain.release()
        assert await redlock.force_release("orders:2") >= redlock.quorum
        with pytest.raises(LostLeaseError):
            await forced.release()
        with anyio.fail_after(GUARD):
            await redlock.settle()
    for client in masters.clients:
        assert sorted(await client.keys("*")) == [b"{orders:1}:fence", b"{orders:2}:fence"]
        assert await client.pttl("{orders:1}:fence") == -1  # never expires
        assert await client.pttl("{orders:2}:fence") == -1


@pytest.mark.timeout(60)
async def test_one_connection_per_master_then_one_more_for_waits(servers: ServerGroup) -> None:
    """scale.md "Connections per master": one connection for all the calls of an
    ``AsyncRedlock``, whatever the number of tasks; one more the first time one of
    its acquisitions waits; the waiter's inbox ``asyncredlock:inbox:<client>`` and a
    reader's ``{K}:released`` are channels, not keys."""
    probe = Redis.from_url(servers.urls[0])
    try:
        before = len(await probe.client_list())
        async with AsyncRedlock(servers.urls) as web1, AsyncRedlock(servers.urls) as web2:

            async def cycle(i: int) -> None:
                async with web1.lock(f"item:{i}"):
                    pass

            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    for i in range(200):
                        tg.start_soon(cycle, i)
            assert len(await probe.client_list()) == before + 1
            assert client_state(web1).connections == (1,) * len(servers)
            writer = await web1.rwlock("doc").write().acquire()
            with Waits(web2) as waits, anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(web2.rwlock("doc").read(timeout=GUARD).acquire)
                    await waits.reach(1)
                    channels = sorted(await probe.pubsub_channels())
                    connections = len(await probe.client_list())
                    keys = await probe.keys("*released*") + await probe.keys("*inbox*")
                    await writer.release()
    finally:
        await probe.aclose()
    assert connections == before + 3  # web1: 1; web2: its calls and its wake-ups
    assert channels[0] == b"asyncredlock:inbox:" + channels[0].split(b":")[-1]
    assert channels[1:] == [b"{doc}:released"]
    assert keys == []


@pytest.mark.timeout(60)
async def test_a_generations_prefix_puts_every_key_under_acl_rules_patterns(
    servers: ServerGroup, masters: Masters
) -> None:
    """scale.md "A prefix per deployment generation": with ``prefix="v7:"`` every key
    (lock, fence counter, queue, readers) matches a ``~`` pattern of
    ``acl_rules(prefix="v7:")``, so SCAN with them finds the generation's keys, and
    none of another generation's."""
    patterns = [rule[1:] for rule in asyncredlock.acl_rules(prefix="v7:") if rule[0] == "~"]
    async with (
        AsyncRedlock(servers.urls, prefix="v7:") as v7,
        AsyncRedlock(servers.urls, prefix="v7:") as waiter,
        AsyncRedlock(servers.urls, prefix="v8:") as v8,
    ):
        lock = await v7.lock("orders:1").acquire()
        read = await v7.rwlock("doc").read().acquire()
        other = await v8.lock("orders:1").acquire()
        with Waits(waiter) as waits, anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter.lock("orders:1", timeout=GUARD).acquire)
                await waits.reach(1)
                everything: set[bytes] = set()
                matched: set[bytes] = set()
                for client in masters.clients:
                    everything |= set(await client.keys("*"))
                    for pattern in patterns:
                        matched |= {key async for key in client.scan_iter(match=pattern)}
                await lock.release()
        for lease in (read, other):
            await lease.release()
    ours = {key for key in everything if b"v7:" in key}
    assert {b"v7:orders:1", b"{v7:orders:1}:fence", b"{v7:orders:1}:queue"} <= ours
    assert matched == ours, (sorted(matched), sorted(ours))


def test_the_rendezvous_sharding_example_runs() -> None:
    """scale.md "What to shard": the example, as written, in a fresh interpreter with
    warnings as errors: the deployments are made at import (no I/O, no loop), and
    ``redlock_for`` sends each name to one deployment, always the same."""
    text = (DOCS / "scale.md").read_text()
    snippet = text.split("```python\n  import hashlib")[1].split("```")[0]
    code = textwrap.dedent("  import hashlib" + snippet)
    code += textwrap.dedent("""
        names = [f"account:{i}:orders" for i in range(200)]
        first = [redlock_for(name) for name in names]
        assert first == [redlock_for(name) for name in names]
        assert set(map(id, first)) == {id(d) for d in DEPLOYMENTS.values()}
        """)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        env=env_with_src(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


# -- testing.md ----------------------------------------------------------------------

#: A downstream project's tests, as testing.md writes them (its imports added): the
#: two plugin examples, the client_state, Waits and FaultProxy examples, a test that
#: breaks the shared group against the rule and one after it that finds it restored,
#: and the plugin's docker marker under --strict-markers.
DOWNSTREAM_TESTS = """
import anyio
import pytest

from asyncredlock import AsyncRedlock, QuorumUnavailableError
from asyncredlock.testing import (
    FaultProxy,
    ServerGroup,
    Waits,
    client_state,
    whole_retry_delay,
)
from asyncredlock.testing.pytest_plugin import MakeServers


@pytest.mark.anyio
async def test_mutual_exclusion(servers: ServerGroup) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        async with redlock.lock("orders:42") as lease:
            assert lease.held


@pytest.mark.anyio
async def test_majority_down(make_servers: MakeServers) -> None:
    group = make_servers(3)
    group[0].kill()
    group[1].kill()
    async with AsyncRedlock(group.urls) as redlock:
        with pytest.raises(QuorumUnavailableError):
            await redlock.lock("orders:42", timeout=0).acquire()


@pytest.mark.anyio
async def test_a_cancelled_waiter_leaves_nothing(servers: ServerGroup) -> None:
    async with AsyncRedlock(servers.urls) as redlock:
        async with redlock.lock("orders:42"):
            pass
        state = client_state(redlock)
        assert (state.held, state.slots, state.listening, state.addressed) == (0, {}, {}, 0)
        assert state.connections == (1,) * len(servers)


@pytest.mark.anyio
async def test_the_waiter_goes_once_released(servers: ServerGroup) -> None:
    async with (
        AsyncRedlock(servers.urls) as holder,
        AsyncRedlock(servers.urls, retry_delay=30) as other,
    ):
        lease = await holder.lock("orders:42").acquire()
        # its retry would come after 30 s: only the release can wake it in time
        with Waits(other) as waits, whole_retry_delay(other), anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(other.lock("orders:42", timeout=10).acquire)
                await waits.reach(1)  # it is parked: now release
                await lease.release()
        assert waits.woken == 1


@pytest.mark.anyio
async def test_faults_on_demand(servers: ServerGroup) -> None:
    server, other_urls = servers[0], servers.urls[1:]
    async with FaultProxy("127.0.0.1", server.port) as proxy:
        async with AsyncRedlock([proxy.url, *other_urls]) as redlock:
            async with redlock.lock("warm"):
                pass
            proxy.delay = 0.005  # +5 ms each way: a 10 ms round trip
            proxy.blackhole = True  # a partition: nothing forwarded, nothing answered
            proxy.reset_connections()  # RST every open connection
            assert isinstance(proxy.forget_connections(), int)
            proxy.refuse = True  # reset new connections right after accept
            proxy.heal()  # no delay, no blackhole, no refusal
            assert (proxy.delay, proxy.blackhole, proxy.refuse) == (0, False, False)
            async with redlock.lock("after", timeout=5):
                pass


def test_a_faulty_test_breaks_the_shared_group(servers: ServerGroup) -> None:
    import redis

    redis.Redis.from_url(servers.urls[2]).set("left", "behind")
    servers[0].pause()
    servers[1].stop()


def test_the_next_test_finds_it_running_and_empty(servers: ServerGroup) -> None:
    import redis

    assert all(server.running and not server.paused for server in servers)
    assert all(server.ping() for server in servers)
    assert redis.Redis.from_url(servers.urls[2]).dbsize() == 0


@pytest.mark.docker
def test_docker_marker(docker_available: None) -> None:
    pass
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("opt_in", ["conftest", "pyproject"])
def test_a_downstream_project_uses_the_plugin_as_documented(tmp_path: Path, opt_in: str) -> None:
    """testing.md "The pytest plugin": opted in either documented way, from a project
    directory of its own, run with ``python -m pytest``, the documented fixtures and
    examples work (the docker test is skipped, or runs, saying why)."""
    (tmp_path / "test_locks.py").write_text(DOWNSTREAM_TESTS)
    if opt_in == "conftest":
        (tmp_path / "conftest.py").write_text(
            'pytest_plugins = ["asyncredlock.testing.pytest_plugin"]\n'
        )
    else:
        (tmp_path / "pyproject.toml").write_text(
            '[tool.pytest.ini_options]\naddopts = ["-p", "asyncredlock.testing.pytest_plugin"]\n'
        )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers", "-rs"],
        cwd=tmp_path,
        env=env_with_src(),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\b7 passed\b", done.stdout), done.stdout[-2000:]
    assert re.search(r"\b1 (passed|skipped)\b", done.stdout.replace("7 passed", "")), done.stdout


@pytest.mark.timeout(60)
def test_the_fake_clock_example_as_written(fake_clock_available: None) -> None:
    """testing.md "Clock faults": the example's lines, each checked on the servers'
    own ``TIME``: master 0 moves, the others keep the host's time."""
    import redis

    from asyncredlock.testing import ServerGroup as Group

    def apart(group: Group) -> float:
        """Master 0's clock less master 1's, in seconds."""
        seconds = []
        for server in (group[0], group[1]):
            client = redis.Redis.from_url(server.url)
            now, micros = client.time()
            client.close()
            seconds.append(now + micros / 1e6)
        return seconds[0] - seconds[1]

    with Group(5, fake_clock=True) as group:  # each server has its own clock, at +0
        assert abs(apart(group)) < 60
        group[0].clock.jump(120)  # master 0's wall clock is now 2 minutes ahead
        assert apart(group) > 60
        group[0].clock.jump(-150)  # and now 30 s behind (offsets add up)
        assert group[0].clock.offset == -30.0
        assert apart(group) < -15
        group[0].clock.set_offset(-20)  # 20 s behind the host, whatever it was
        assert group[0].clock.offset == -20.0  # as the page says
        group[0].clock.reset()  # the host's time again
        assert group[0].clock.offset == 0
        assert abs(apart(group)) < 15
        assert group[1].clock.offset == 0


def signature_as_written(name: str, function: Callable[..., Any]) -> str:
    """``name(...)`` as a page would write ``function``'s signature: defaults as
    reprs, ``*`` and ``/`` where the code has them, no ``self``."""
    shown: list[str] = []
    previous = None
    for param in inspect.signature(function).parameters.values():
        if param.name == "self":
            continue
        if previous is param.POSITIONAL_ONLY and param.kind is not param.POSITIONAL_ONLY:
            shown.append("/")
        if param.kind is param.KEYWORD_ONLY and "*" not in shown:
            shown.append("*")
        default = "" if param.default is param.empty else f"={param.default!r}"
        stars = {param.VAR_KEYWORD: "**", param.VAR_POSITIONAL: "*"}.get(param.kind, "")
        shown.append(stars + param.name + default)
        previous = param.kind
    return f"{name}({', '.join(shown)})"


T = asyncredlock.testing
WRITTEN_SIGNATURES = [
    ("testing.md", "ServerGroup", T.ServerGroup),
    ("testing.md", "SentinelProcess", T.SentinelProcess),
    ("testing.md", "ServerCluster", T.ServerCluster),
    ("testing.md", "start", T.ServerProcess.start),
    ("testing.md", "stop", T.ServerProcess.stop),
    ("testing.md", "restart", T.ServerProcess.restart),
    ("testing.md", "ping", T.ServerProcess.ping),
    ("testing.md", "flushall", T.ServerProcess.flushall),
    ("testing.md", "master_address", T.SentinelProcess.master_address),
    ("testing.md", "master_url", T.SentinelProcess.master_url),
    ("testing.md", "client", T.ServerCluster.client),
    ("testing.md", "keyslot", T.ServerCluster.keyslot),
    ("testing.md", "primary_for", T.ServerCluster.primary_for),
    ("testing.md", "replicas_of", T.ServerCluster.replicas_of),
    ("testing.md", "move_slot", T.ServerCluster.move_slot),
    ("testing.md", "begin_move", T.ServerCluster.begin_move),
    ("testing.md", "end_move", T.ServerCluster.end_move),
    ("testing.md", "failover", T.ServerCluster.failover),
    ("testing.md", "wait_ready", T.ServerCluster.wait_ready),
    ("testing.md", "make_servers", pytest_plugin.MakeServers.__call__),
    ("testing.md", "fake_clock_skip_reason", pytest_plugin.fake_clock_skip_reason),
    ("fastapi.md", "HTTPErrors", contrib_fastapi.HTTPErrors),
    ("fastapi.md", "add_exception_handlers", contrib_fastapi.add_exception_handlers),
]


@pytest.mark.parametrize(("name", "shown", "function"), WRITTEN_SIGNATURES)
def test_signatures_the_pages_write_out_are_the_codes(
    name: str, shown: str, function: Callable[..., Any]
) -> None:
    """Each signature testing.md (and fastapi.md's errors section) writes out, with
    its defaults, ``*`` and parameter names, is ``inspect.signature``'s."""
    text = page(name)
    written = signature_as_written(shown, function)
    assert written in text, (written, re.findall(rf"`{shown}\([^`]*`", text))


def test_testing_mds_public_names_are_the_packages() -> None:
    """testing.md opens with "Public names: ..." : the list a reader takes as the
    whole of ``asyncredlock.testing``."""
    text = page("testing.md")
    listed = text.split("Public names:")[1].split("; plus the pytest plugin")[0]
    assert sorted(re.findall(r"`(\w+)`", listed)) == sorted(asyncredlock.testing.__all__)


# -- api.md and architecture.md ------------------------------------------------------

PUBLIC_MODULES = [
    "asyncredlock",
    "asyncredlock.fencing",
    "asyncredlock.testing",
    "asyncredlock.contrib.fastapi",
    "asyncredlock.contrib.aiohttp",
]


def resolve(dotted: str) -> object:
    """The object a ``::: a.b.C`` line of api.md names, by its longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


def test_api_md_names_exactly_the_public_exports() -> None:
    """api.md: every ``:::`` entry exists and is exported (in ``__all__``) from the
    module its heading names; every name of each public module's ``__all__`` has an
    entry (aiohttp's ``HTTPErrors`` is said to be fastapi's, and is); the plugin's
    listed members exist."""
    text = (DOCS / "api.md").read_text()
    entries = re.findall(r"^::: ([\w.]+)$", text, flags=re.MULTILINE)
    for entry in entries:
        resolve(entry)
    entries = [entry for entry in entries if not inspect.ismodule(resolve(entry))]
    documented: dict[str, set[str]] = {}
    for entry in entries:
        module, _, name = entry.rpartition(".")
        if module in PUBLIC_MODULES:
            documented.setdefault(module, set()).add(name)
            assert name in importlib.import_module(module).__all__, entry
    documented["asyncredlock.fencing"] |= {"StaleTokenError", "MissingRecordError"}  # "as well"
    documented["asyncredlock.contrib.aiohttp"].add("HTTPErrors")  # "the same class as above"
    assert contrib_aiohttp.HTTPErrors is contrib_fastapi.HTTPErrors
    for module in PUBLIC_MODULES:
        assert documented[module] == set(importlib.import_module(module).__all__), module
    listed = text.split("members:\n")[-1].split()
    assert [name for name in listed if name != "-"] == [
        "MakeServers",
        "docker_skip_reason",
        "fake_clock_skip_reason",
    ]
    for name in ("MakeServers", "docker_skip_reason", "fake_clock_skip_reason"):
        assert name in pytest_plugin.__all__


#: architecture.md's table: each module and the names its row gives it (a name
#: ``A.b`` is an attribute of a class or function of that module).
ARCHITECTURE = {
    "contrib._http": ["HTTPErrors"],
    "_redlock": ["AsyncRedlock"],
    "_tools": ["OperatorTools"],
    "_singleton": [],
    "_operator": ["shut_down"],
    "_rwlock": ["RWLock"],
    "_semaphore": ["Semaphore"],
    "_turns": ["Turns"],
    "_lock": ["Lock", "Lock.make"],
    "_blocks": [],
    "_attempt": ["Acquisition", "Acquisition._attempt"],
    "_pauses": ["Pauses"],
    "_handed": ["HandOvers", "HandOvers.adopt"],
    "_lease": ["Lease", "make_lease", "Lease._exit_block"],
    "_keeping": ["Keeping"],
    "_ending": ["Ending"],
    "_core": [
        "Core",
        "Core.acquire_round",
        "Core.extend_round",
        "Core.release_round",
        "Core.undo_failed",
        "Core.undo",
        "Core.dequeue",
        "Core.clock",
    ],
    "_releasing": ["Releases", "LateUndo"],
    "_gate": ["Gates"],
    "_protocol": ["fence_tokens", "QueueEntry"],
    "_inspect": ["LockState", "NodeLockState"],
    "_quorum": ["Round", "Decision", "Decision.holds", "quorum_of"],
    "_deadline": ["Timing", "Waiting", "wait_until"],
    "_wakeup": ["Waker"],
    "_ticket": ["Ticket", "Needs", "wake_first"],
    "_listener": ["Listener"],
    "_acl": ["acl_rules"],
    "_refusal": ["refusal", "why_unavailable"],
    "_connect": ["RedisPyOpener", "ClusterOpener"],
    "_urls": ["checked", "options", "check_client_settings", "display", "redacted"],
    "_identity": [],
    "_node": ["Node"],
    "_closing": ["Closing"],
    "_transport": ["Link"],
    "_connection": ["Connection"],
    "_wire": ["Reply", "ClosedError", "Stream"],
    "_spin": ["Spin"],
    "_liveness": ["Heartbeat", "readable"],
    "_tls": ["CertificateError"],
    "_config": ["Settings", "LockSpec", "Role"],
    "_keys": ["holder_value"],
    "_scripts": [],
    "_template": ["NameTemplate", "serialize"],
    "_log": [],
    "_telemetry": [],
    "_version": ["__version__"],
    "_line": ["Line"],
    "_timings": ["Timings"],
    "_errors": [],
    "_stats": [
        "RedlockStatistics",
        "LockStatistics",
        "RWLockStatistics",
        "LeaseStatistics",
        "Taken",
    ],
    "fencing": [],
    "_fencing": ["FenceGuard", "FencedStore"],
    "_sqlfence": ["SQLFence"],
    "_sqlwords": [],
    "__main__": [],
    "_cli.common": [],
    "_cli.state": [],
    "_cli.listing": [],
    "_cli.watch": [],
}


def test_architecture_mds_modules_and_names_exist() -> None:
    """architecture.md: every module of its table, and each class, function or
    method it names there or in "One acquisition, followed through", exists; so do
    the Lua helpers and the unit test files it points to."""
    text = page("architecture.md")
    modules = set(re.findall(r"\| `(_[a-z]\w*)` \|", text))
    assert len(modules) > 40
    assert modules <= set(ARCHITECTURE), modules - set(ARCHITECTURE)
    for module, names in ARCHITECTURE.items():
        if module == "__main__":
            assert (SRC / "asyncredlock" / "__main__.py").is_file()
            continue
        loaded = importlib.import_module(f"asyncredlock.{module}")
        for name in names:
            found: object = loaded
            for part in name.split("."):
                assert hasattr(found, part), f"{module}.{name}"
                found = getattr(found, part)
    lua = {path.stem: path.read_text() for path in (SRC / "asyncredlock" / "lua").glob("*.lua")}
    for script, helpers in {
        "clock": ["now_ms"],
        "queue": ["purge", "inbox"],
        "fence": ["fence_count"],
    }.items():
        for helper in helpers:
            assert f"local function {helper}(" in lua[script]
    for unit in ("config", "keys", "scripts", "protocol", "quorum", "node", "gate", "stats"):
        assert (ROOT / "tests" / "unit" / f"test_{unit}.py").is_file(), unit
    assert (ROOT / "tests" / "unit" / "test_layout.py").is_file()
    assert (ROOT / "tests" / "integration" / "test_cancellation.py").is_file()
