"""Review (shutdown2): cancelling a pending call, or closing its ``AsyncRedlock``
(``aclose()``) from another task, for the primitives other than a plain lock, on
both event loops (asyncio and uvloop, whatever ``ASYNCREDLOCK_TEST_LOOP`` says).

Each waiter goes through a `FaultProxy` per master (a delay keeps its rounds out)
and waits behind a holder of another client on the servers. It is interrupted at
a point: right after its task starts, while it waits between attempts, or while a
round of it is out. Then: the call ends within the guard, no key is left on any
master once the holder released, no task of the library runs, and no connection
of the closed client is open (the proxies, and the servers' CLIENT LIST).

The interruptions are crossed pairwise, not fully (`pairwise`): each primitive
meets each interruption point, and each of both with each way to interrupt and
each loop, at least once. The FastAPI case of the review (a request waiting at
shutdown) is ``TestShutdown`` of test_contrib_fastapi.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from asyncredlock import AsyncRedlock, Lease, LockNotOwnedError, LockState, QuorumUnavailableError
from asyncredlock.contrib import aiohttp as contrib_aiohttp
from asyncredlock.testing import FaultProxy, ServerGroup, Waits, client_state

from .. import loops
from .conftest import Masters, library_tasks, polled

pytestmark = pytest.mark.anyio

GUARD = 20.0  # seconds; only stops a hung test, never decides an outcome
THREE = 3
DELAY = 0.1  # each way through a proxy, while a round must stay out
NODE_TIMEOUT = 2.0  # far above a delayed round: aclose() waits for the rounds out


@pytest.fixture(params=sorted(loops.BACKENDS))
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Both loops here, whatever ``ASYNCREDLOCK_TEST_LOOP`` says (a test that names
    its loop per case, with `on`, overrides it)."""
    return loops.BACKENDS[request.param]


LOOPS = ("asyncio", "uvloop")
HOWS = ("cancel", "aclose")


def on(loop: str, *values: str) -> Any:
    """A case run on ``loop`` (its ``anyio_backend``), with ``values``."""
    return pytest.param(loops.BACKENDS[loop], *values, id="-".join([loop, *values]))


def pairwise(first: list[str], second: list[str]) -> list[tuple[str, str, str, str]]:
    """Each ``first`` with each ``second``, with a way to interrupt and a loop chosen
    so that every pair of the four values meets at least once (`test_pairwise`)."""
    return [
        (LOOPS[(i // 2 + j) % 2], a, b, HOWS[(i + j) % 2])
        for i, a in enumerate(first)
        for j, b in enumerate(second)
    ]


@dataclass
class Rig:
    """Three masters: direct clients to them, and a proxy in front of each."""

    masters: Masters
    proxies: list[FaultProxy]

    @property
    def proxied(self) -> list[str]:
        return [proxy.url for proxy in self.proxies]

    def delay(self, seconds: float) -> None:
        for proxy in self.proxies:
            proxy.delay = seconds

    async def connections(self) -> list[int]:
        """Connections open on each server (CLIENT LIST), the direct ones included."""
        return [len(await client.client_list()) for client in self.masters.clients]


@pytest.fixture
async def rig(servers: ServerGroup) -> AsyncIterator[Rig]:
    direct = Masters(servers.urls[:THREE])
    async with contextlib.AsyncExitStack() as stack:
        proxies = [
            await stack.enter_async_context(FaultProxy(server.host, server.port))
            for server in list(servers)[:THREE]
        ]
        try:
            yield Rig(direct, proxies)
        finally:
            await direct.aclose()


def _ours(task: asyncio.Task[object]) -> bool:
    """A task of the library proper (the fault proxies' tasks are the test's)."""
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "/asyncredlock/testing/" not in code.co_filename


#: What is held (by the other client, on the servers), and the call that waits for it.
Hold = Callable[[AsyncRedlock], Awaitable[Lease]]
Call = Callable[[AsyncRedlock], Awaitable[object]]


async def _forever(lease: Lease) -> None:
    await anyio.sleep_forever()


CASES: dict[str, tuple[Hold, Call]] = {
    "semaphore": (
        lambda r: r.semaphore("s", 1, ttl=30.0).acquire(),
        lambda r: r.semaphore("s", 1, timeout=GUARD).acquire(),
    ),
    "fair semaphore": (
        lambda r: r.semaphore("s", 1, ttl=30.0).acquire(),
        lambda r: r.semaphore("s", 1, timeout=GUARD, fair=True).acquire(),
    ),
    "reader behind a writer": (
        lambda r: r.rwlock("rw").write(ttl=30.0).acquire(),
        lambda r: r.rwlock("rw").read(timeout=GUARD).acquire(),
    ),
    "writer behind a reader": (
        lambda r: r.rwlock("rw").read(ttl=30.0).acquire(),
        lambda r: r.rwlock("rw", patience=0).write(timeout=GUARD).acquire(),
    ),
    "fair writer behind a reader": (
        lambda r: r.rwlock("rw").read(ttl=30.0).acquire(),
        lambda r: r.rwlock("rw", fair=True).write(timeout=GUARD).acquire(),
    ),
    "run_singleton": (
        lambda r: r.lock("one", ttl=30.0).acquire(),
        lambda r: r.run_singleton("one", _forever),
    ),
}

POINTS = ["started", "waiting", "round out"]


async def _record(
    ended: list[object], scope: anyio.CancelScope, call: Callable[[], Awaitable[object]]
) -> None:
    """Await ``call()`` inside ``scope``: append what it returned or raised, or
    ``"cancelled"`` when the scope was cancelled."""
    with scope:
        try:
            ended.append(await call())
        except Exception as exc:
            ended.append(exc)
    if scope.cancelled_caught:
        ended.append("cancelled")


async def _reach(point: str, rig: Rig, waiter: AsyncRedlock, waits: Waits) -> None:
    """Return once the call is at ``point``."""
    if point == "started":
        await anyio.lowlevel.checkpoint()  # its task ran to its first await
    elif point == "waiting":
        await waits.reach(1)
    else:  # the proxies' delay was set before it started: its first round is out
        assert await polled(lambda: any(client_state(waiter).in_flight))


async def _interrupt(how: str, point: str, rig: Rig, call: Call, waiter: AsyncRedlock) -> object:
    """Run ``call`` in a task, interrupt it at ``point`` (``how``), return how it ended."""
    ended: list[object] = []
    waits = Waits(waiter)

    scope = anyio.CancelScope()
    if point == "round out":
        rig.delay(DELAY)
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_record, ended, scope, lambda: call(waiter))
            await _reach(point, rig, waiter, waits)
            if how == "cancel":
                scope.cancel()
            else:
                await waiter.aclose()
    waits.close()
    assert len(ended) == 1, ended
    return ended[0]


async def _check_nothing_left(rig: Rig, before: list[int]) -> None:
    assert await polled(lambda: all(proxy.connections == 0 for proxy in rig.proxies))
    left: list[int] = []
    for _ in range(400):  # the servers see the proxies' upstream ends close
        left = await rig.connections()
        if left == before:
            break
        await anyio.sleep(0.025)
    assert left == before
    assert [task for task in library_tasks() if _ours(task)] == []
    assert await rig.masters.keys() == [[]] * THREE


def test_pairwise() -> None:
    """The crossing `pairwise` makes meets every pair of values of two of its columns."""
    rows = pairwise(list(CASES), POINTS)
    sizes = [len(LOOPS), len(CASES), len(POINTS), len(HOWS)]
    for x in range(4):
        for y in range(x + 1, 4):
            assert len({(row[x], row[y]) for row in rows}) == sizes[x] * sizes[y], (x, y)


@pytest.mark.parametrize(
    ("anyio_backend", "case", "point", "how"), [on(*row) for row in pairwise(list(CASES), POINTS)]
)
async def test_an_interrupted_waiter_leaves_nothing(
    rig: Rig, servers: ServerGroup, case: str, point: str, how: str
) -> None:
    hold, call = CASES[case]
    before = await rig.connections()
    async with AsyncRedlock(servers.urls[:THREE], auto_extend=False) as holder:
        held = await hold(holder)
        waiter = AsyncRedlock(rig.proxied, node_timeout=NODE_TIMEOUT, retry_delay=GUARD)
        try:
            outcome = await _interrupt(how, point, rig, call, waiter)
            if how == "cancel":
                rig.delay(0.0)
                with anyio.fail_after(GUARD):
                    await waiter.settle()
                state = client_state(waiter)
                assert (state.held, dict(state.slots), dict(state.listening)) == (0, {}, {})
        finally:
            rig.delay(0.0)
            with anyio.fail_after(GUARD):
                await waiter.aclose()
        await held.release()
        await holder.settle()
    if how == "cancel":
        assert outcome == "cancelled"
    else:
        assert isinstance(outcome, RuntimeError | QuorumUnavailableError), outcome
    await _check_nothing_left(rig, before)


#: Calls whose second task of one client queues behind the first, in the client.
LOCALLY_QUEUED = ["semaphore", "writer behind a reader", "run_singleton"]


@pytest.mark.parametrize("how", ["cancel", "aclose"])
@pytest.mark.parametrize("case", LOCALLY_QUEUED)
async def test_a_task_queued_behind_another_of_its_client_leaves_nothing(
    rig: Rig, servers: ServerGroup, case: str, how: str
) -> None:
    """The second of two waiters of one client, queued in the client behind the
    first, is cancelled (the first still waits, then the client closes) or the
    client is closed (both end)."""
    hold, call = CASES[case]
    before = await rig.connections()
    ended: list[object] = []
    async with AsyncRedlock(servers.urls[:THREE], auto_extend=False) as holder:
        held = await hold(holder)
        waiter = AsyncRedlock(rig.proxied, node_timeout=NODE_TIMEOUT, retry_delay=GUARD)
        waits = Waits(waiter)

        first, second = anyio.CancelScope(), anyio.CancelScope()
        try:
            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_record, ended, first, lambda: call(waiter))
                    await waits.reach(1)
                    tg.start_soon(_record, ended, second, lambda: call(waiter))
                    await waits.reach(queued=1)
                    if how == "cancel":
                        second.cancel()
                        assert await polled(lambda: len(ended) == 1)
                        assert ended == ["cancelled"]  # the first waits on
                    await waiter.aclose()
        finally:
            waits.close()
            with anyio.fail_after(GUARD):
                await waiter.aclose()
        await held.release()
        await holder.settle()
    assert len(ended) == 2, ended
    errors = ended[1:] if how == "cancel" else ended
    assert all(isinstance(e, RuntimeError) for e in errors), ended
    await _check_nothing_left(rig, before)


#: Leases of each kind, taken by the client under test.
LEASES: dict[str, Hold] = {
    "lock": lambda r: r.lock("l", ttl=30.0, auto_extend=False).acquire(),
    "semaphore": lambda r: r.semaphore("s", 2, ttl=30.0, auto_extend=False).acquire(),
    "reader": lambda r: r.rwlock("rw").read(ttl=30.0, auto_extend=False).acquire(),
    "writer": lambda r: r.rwlock("rw").write(ttl=30.0, auto_extend=False).acquire(),
}


async def _lease_call(rig: Rig, lease: Lease, what: str) -> Awaitable[object]:
    """Start ``what`` on ``lease`` (an extension with its round out, or waiting for
    the loss), and return once it is pending."""
    if what == "extend":
        rig.delay(DELAY)
        return lease.extend(ttl=40.0)
    return lease.wait_lost()


#: Each kind of lease twice, its two cases differing in every value; across the
#: kinds, every pair of a call, a way to interrupt and a loop.
LEASE_CASES = [
    on("asyncio", "lock", "extend", "cancel"),
    on("uvloop", "lock", "wait_lost", "aclose"),
    on("uvloop", "semaphore", "extend", "aclose"),
    on("asyncio", "semaphore", "wait_lost", "cancel"),
    on("uvloop", "reader", "extend", "cancel"),
    on("asyncio", "reader", "wait_lost", "aclose"),
    on("asyncio", "writer", "extend", "aclose"),
    on("uvloop", "writer", "wait_lost", "cancel"),
]


@pytest.mark.parametrize(("anyio_backend", "kind", "what", "how"), LEASE_CASES)
async def test_a_lease_call_interrupted_leaves_nothing(
    rig: Rig, kind: str, what: str, how: str
) -> None:
    before = await rig.connections()
    waiter = AsyncRedlock(rig.proxied, node_timeout=NODE_TIMEOUT)
    ended: list[object] = []
    try:
        lease = await LEASES[kind](waiter)
        await waiter.settle()
        pending = await _lease_call(rig, lease, what)
        scope = anyio.CancelScope()

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_record, ended, scope, lambda: pending)
                if what == "extend":
                    assert await polled(lambda: any(client_state(waiter).in_flight))
                else:
                    await anyio.wait_all_tasks_blocked()
                if how == "cancel":
                    scope.cancel()
                else:
                    await waiter.aclose()
            if how == "cancel":
                assert lease.held  # an interrupted call leaves it held: released here
                rig.delay(0.0)
                await lease.release()
    finally:
        rig.delay(0.0)
        with anyio.fail_after(GUARD):
            await waiter.aclose()
    if how == "cancel":
        assert ended == ["cancelled"]
    elif what == "extend":
        assert len(ended) == 1
        assert isinstance(ended[0], LockNotOwnedError), ended
    else:
        assert ended == [True]  # documented: aclose() ends a lease lost
    assert not lease.held
    await _check_nothing_left(rig, before)


@pytest.mark.parametrize("how", ["cancel", "aclose"])
async def test_inspect_with_its_round_out_is_interrupted_promptly(rig: Rig, how: str) -> None:
    before = await rig.connections()
    waiter = AsyncRedlock(rig.proxied, node_timeout=NODE_TIMEOUT)
    try:
        lease = await waiter.lock("i", ttl=30.0).acquire()
        await lease.release()
        ended = await _interrupt(how, "round out", rig, lambda r: r.inspect("i"), waiter)
    finally:
        rig.delay(0.0)
        with anyio.fail_after(GUARD):
            await waiter.aclose()
    assert ended == "cancelled" if how == "cancel" else isinstance(ended, LockState)
    await _check_nothing_left(rig, before)


def _holding_aiohttp_app(urls: list[str], entered: anyio.Event) -> web.Application:
    app = web.Application()
    contrib_aiohttp.setup(app, urls)

    @contrib_aiohttp.locked("r:{name}", timeout=GUARD)
    async def hold(request: web.Request) -> web.Response:
        entered.set()
        await anyio.sleep_forever()
        return web.Response()  # pragma: no cover

    app.router.add_get("/hold/{name}", hold)
    return app


async def test_aiohttp_shutdown_with_a_request_holding_and_one_waiting(
    servers: ServerGroup,
) -> None:
    """aiohttp's runner shuts down (it cancels the handlers still running, then its
    cleanup closes the ``AsyncRedlock``) while one request holds the route's lock
    and another waits for it: both requests end promptly, and nothing is left."""
    urls = servers.urls[:THREE]
    direct = Masters(urls)
    before = [len(await client.client_list()) for client in direct.clients]
    entered = anyio.Event()
    app = _holding_aiohttp_app(urls, entered)
    runner = web.AppRunner(app, shutdown_timeout=0.5)  # then it cancels them (0: never)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/hold/a"
    ended: list[object] = []
    try:
        async with aiohttp.ClientSession() as session:

            async def get() -> None:
                try:
                    async with session.get(url) as response:
                        ended.append(response.status)
                except aiohttp.ClientError as exc:
                    ended.append(type(exc).__name__)

            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(get)
                    await entered.wait()
                    waits = Waits(app[contrib_aiohttp.REDLOCK])
                    tg.start_soon(get)
                    await waits.reach(queued=1)
                    await runner.cleanup()
    finally:
        await runner.cleanup()
    try:
        assert len(ended) == 2, ended
        assert [task for task in library_tasks() if _ours(task)] == []
        assert await direct.keys() == [[]] * THREE
        after = [len(await client.client_list()) for client in direct.clients]
        assert after == before
    finally:
        await direct.aclose()


@pytest.mark.parametrize(
    ("anyio_backend", "case"), [on(LOOPS[i % 2], case) for i, case in enumerate(CASES)]
)
async def test_aclose_past_node_timeout_leaves_only_keys_that_expire(
    rig: Rig, servers: ServerGroup, case: str
) -> None:
    """The documented limit: ``aclose()`` waits ``node_timeout`` (default) for the
    rounds out, here slower than that; it still ends the call, and leaves no task
    or connection; a key whose undo it cut short expires with its TTL."""
    hold, call = CASES[case]
    before = await rig.connections()
    async with AsyncRedlock(servers.urls[:THREE], auto_extend=False) as holder:
        held = await hold(holder)
        waiter = AsyncRedlock(rig.proxied, retry_delay=GUARD)
        try:
            outcome = await _interrupt("aclose", "round out", rig, call, waiter)
        finally:
            with anyio.fail_after(GUARD):
                await waiter.aclose()
        assert isinstance(outcome, RuntimeError | QuorumUnavailableError), outcome
        # the proxies pass on what they held back, then the close
        assert await polled(lambda: all(proxy.connections == 0 for proxy in rig.proxies))
        rig.delay(0.0)
        await held.release()
        await holder.settle()
    for client in rig.masters.clients:
        for key in await client.keys("*"):
            if not (isinstance(key, bytes) and key.endswith(b":fence")):
                assert await client.pttl(key) > 0, key
        await client.flushall()
    await _check_nothing_left(rig, before)


@pytest.mark.parametrize(
    ("anyio_backend", "how"), [on("asyncio", "cancel"), on("uvloop", "aclose")]
)
async def test_a_leader_interrupted_while_its_extension_is_out_leaves_nothing(
    rig: Rig, how: str
) -> None:
    """``run_singleton``'s job runs; its lease's extension is out (delayed) when the
    call is cancelled or its client closed: the call ends (cancelled, or the
    documented RuntimeError), the job is cancelled, nothing is left."""
    before = await rig.connections()
    waiter = AsyncRedlock(rig.proxied, node_timeout=NODE_TIMEOUT)
    running = anyio.Event()
    job_ended: list[str] = []

    async def job(lease: Lease) -> None:
        running.set()
        try:
            await anyio.sleep_forever()
        finally:
            job_ended.append("cancelled")

    ended: list[object] = []
    scope = anyio.CancelScope()

    try:
        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    _record, ended, scope, lambda: waiter.run_singleton("leader", job, ttl=0.6)
                )
                await running.wait()
                await waiter.settle()
                rig.delay(DELAY)
                assert await polled(lambda: any(client_state(waiter).in_flight))
                if how == "cancel":
                    scope.cancel()
                else:
                    await waiter.aclose()
    finally:
        rig.delay(0.0)
        with anyio.fail_after(GUARD):
            await waiter.aclose()
    assert job_ended == ["cancelled"]
    assert len(ended) == 1, ended
    if how == "cancel":
        assert ended == ["cancelled"]
    else:
        assert isinstance(ended[0], RuntimeError), ended
    await _check_nothing_left(rig, before)


STEPS = range(0, 40, 3)


async def _sweep_once(rig: Rig, servers: ServerGroup, case: str, how: str, steps: int) -> object:
    """One interruption after ``steps`` loop steps of the call (no delay): its outcome."""
    hold, call = CASES[case]
    ended: list[object] = []
    async with AsyncRedlock(servers.urls[:THREE], auto_extend=False) as holder:
        held = await hold(holder)
        waiter = AsyncRedlock(rig.proxied, node_timeout=NODE_TIMEOUT, retry_delay=GUARD)
        scope = anyio.CancelScope()

        try:
            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_record, ended, scope, lambda: call(waiter))
                    for _ in range(steps):
                        await anyio.lowlevel.checkpoint()
                    if how == "cancel":
                        scope.cancel()
                        await waiter.settle()
                    else:
                        await waiter.aclose()
        finally:
            with anyio.fail_after(GUARD):
                await waiter.aclose()
        await held.release()
        await holder.settle()
    assert len(ended) == 1, (steps, ended)
    return ended[0]


@pytest.mark.parametrize(
    ("anyio_backend", "case", "how"),
    [
        on(LOOPS[(i + j) % 2], case, how)
        for i, case in enumerate(CASES)
        for j, how in enumerate(HOWS)
    ],
)
async def test_interrupted_at_every_step_leaves_nothing(
    rig: Rig, servers: ServerGroup, case: str, how: str
) -> None:
    before = await rig.connections()
    for steps in STEPS:
        outcome = await _sweep_once(rig, servers, case, how, steps)
        if how == "cancel":
            assert outcome == "cancelled", (steps, outcome)
        else:
            assert isinstance(outcome, RuntimeError | QuorumUnavailableError), (steps, outcome)
        assert await rig.masters.keys() == [[]] * THREE, steps
    await _check_nothing_left(rig, before)


@pytest.mark.parametrize(
    ("anyio_backend", "case"),
    [on("asyncio", "fair semaphore"), on("uvloop", "fair writer behind a reader")],
)
async def test_a_cancelled_aclose_still_closes_and_ends_the_call(
    rig: Rig, servers: ServerGroup, case: str
) -> None:
    """``aclose()`` is itself cancelled while a call's round is out: documented, it
    closes first, then raises the cancellation; the call ends, nothing is left."""
    hold, call = CASES[case]
    before = await rig.connections()
    ended: list[object] = []
    closed: list[str] = []
    async with AsyncRedlock(servers.urls[:THREE], auto_extend=False) as holder:
        held = await hold(holder)
        waiter = AsyncRedlock(rig.proxied, node_timeout=NODE_TIMEOUT, retry_delay=GUARD)

        rig.delay(DELAY)
        try:
            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_record, ended, anyio.CancelScope(), lambda: call(waiter))
                    assert await polled(lambda: any(client_state(waiter).in_flight))
                    closing = asyncio.get_running_loop().create_task(waiter.aclose())
                    await anyio.wait_all_tasks_blocked()
                    closing.cancel()  # an asyncio cancellation, as the loop's end sends
                    await asyncio.wait([closing])
                    closed.append("cancelled" if closing.cancelled() else "returned")
                    closed.append("closed" if waiter._core.closed else "open")
        finally:
            rig.delay(0.0)
            with anyio.fail_after(GUARD):
                await waiter.aclose()
        await held.release()
        await holder.settle()
    assert closed == ["cancelled", "closed"]  # it closed first, then raised
    assert len(ended) == 1, ended
    assert isinstance(ended[0], RuntimeError | QuorumUnavailableError), ended
    await _check_nothing_left(rig, before)
