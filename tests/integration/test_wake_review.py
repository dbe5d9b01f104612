"""Review (rwake): wake-ups of plain locks, read-write locks and locks on several
resources after the semaphore's changes to the shared wake-up machinery (e1de930,
a06a455, bbbe16d: the undos of semaphore attempts announced, the quorum rule of
`Waker._freed`, a backoff after an undo's wake-up).

Counted, never timed: attempts (``Lock.statistics()``), wake-ups (``AsyncRedlock``'s
``statistics()``), waits ended by a wake-up or by their pause (`Waits`), and how each
lease was taken (``Lease.statistics().source``). Waiters of separate ``AsyncRedlock``
clients stand for separate processes. Their retry delay is an hour, drawn whole
(`whole_retry_delay`), and the keys live two minutes: within a test's bound, an
attempt after the first two follows a wake-up (or the deadline, or a holder's
expiry where a test makes that short).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease, Lock
from asyncredlock.testing import FaultProxy, ServerGroup, Waits, whole_retry_delay
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, clients

pytestmark = pytest.mark.anyio

HANG_GUARD = 15  # seconds; only stops a hung test, never decides an outcome
NEVER = 3600.0  # a retry delay no test waits out
HOLD = 120.0  # a key's TTL no test waits out either
WAIT = 1.5  # how long refused waiters are watched (not a threshold)
GUARD = 6.0  # seconds for each waiter to go after a release (far below NEVER, HOLD)
# seconds for each split waiter to go when random backoffs decide who goes: the
# backoff's window is the last failed round's duration doubled at each undo's
# wake-up, and a busy loop lengthens rounds (a hang guard, still far below HOLD)
SPLIT_GUARD = 30.0
CONFIRM = 5.0  # a node timeout: how long a subscription's confirmation may take


@dataclass(frozen=True)
class Kind:
    """A kind of lock: the holder's (given its TTL), a waiter's (given its timeout,
    and whether its lease extends itself: only then may the masters hand it the key),
    and the key that the holder's value is in."""

    name: str
    hold: Callable[[AsyncRedlock, float], Lock]
    wait: Callable[[AsyncRedlock, float, bool], Lock]
    key: str


KINDS = [
    Kind(
        "lock",
        lambda r, ttl: r.lock("k", ttl=ttl),
        lambda r, t, x: r.lock("k", ttl=HOLD, timeout=t, auto_extend=x),
        "k",
    ),
    Kind(
        "fair lock",
        lambda r, ttl: r.lock("k", ttl=ttl, fair=True),
        lambda r, t, x: r.lock("k", ttl=HOLD, timeout=t, auto_extend=x, fair=True),
        "k",
    ),
    Kind(
        "rw writer",
        lambda r, ttl: r.rwlock("k").write(ttl=ttl),
        lambda r, t, x: r.rwlock("k").write(ttl=HOLD, timeout=t, auto_extend=x),
        "k",
    ),
    Kind(
        "fair rw writer",
        lambda r, ttl: r.rwlock("k", fair=True).write(ttl=ttl),
        lambda r, t, x: r.rwlock("k", fair=True).write(ttl=HOLD, timeout=t, auto_extend=x),
        "k",
    ),
    Kind(
        "several resources",
        lambda r, ttl: r.lock("b", ttl=ttl),
        lambda r, t, x: r.lock(["a", "b"], ttl=HOLD, timeout=t, auto_extend=x),
        "b",
    ),
]
IDS = [kind.name for kind in KINDS]
# the kinds whose waiters queue on the masters, which hand the key to the first
# (the waiters' leases extend themselves): no attempt after the release
HANDED = {"lock", "fair lock", "fair rw writer"}


async def bare_quorum(holder: AsyncRedlock, masters: Masters, kind: Kind, ttl: float) -> Lease:
    """The holder's lease, its key then deleted on 2 of the 5 masters (as after a
    minority restarted empty): it still holds on 3, and every waiter's attempt is
    granted on those 2, refused on the 3 others, and undone on the 2."""
    lease = await kind.hold(holder, ttl).acquire()
    await holder.settle()
    for client in masters.clients[:2]:
        assert await client.delete(kind.key) == 1
    return lease


@contextlib.asynccontextmanager
async def three_clients(urls: list[str], **settings: float) -> AsyncIterator[list[AsyncRedlock]]:
    """Three clients (as three processes), retrying only when woken."""
    async with clients(urls, 3, retry_delay=NEVER, **settings) as made:
        with whole_retry_delay(*made):
            yield made


class TestNoStorm:
    """Waiters of three clients (two tasks each) refused by a holder keeping a bare
    quorum: the masters that lost its key grant and undo every attempt, and announce
    the undos. Watched for `WAIT` seconds, then all cancelled at once, a waiter makes
    its first attempt, the one right after it listens, and at most one more per pause
    (docs/algorithm.md, "Undos": an undo wakes it once until its pause runs out or
    something else wakes it); the storms this guards against were thousands.

    The watch ends by one cancellation, not by the waiters' timeouts: six deadlines
    are as far apart as the six ``acquire()`` calls began (tens of milliseconds on a
    loaded machine), and a waiter leaving the masters' queue at its deadline announces
    the next one, which wakes a waiter of another client still before its own (an
    attempt more than counted), or finds its attempt out (a wake-up counted that no
    wait used, as does one that comes as a pause runs out at the deadline).

    ``still``: the holder's key lives two minutes, so no pause runs out while
    watched. ``extending``: a TTL of 1 s, extended every third: each pause ends at
    the expiry the masters report, at the latest, and a waiter may heed one more undo
    after each."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("ttl", [HOLD, 1.0], ids=["still", "extending"])
    @pytest.mark.parametrize("kind", KINDS, ids=IDS)
    async def test_waiters_of_three_clients_make_a_few_attempts_per_pause(
        self, servers: ServerGroup, masters: Masters, kind: Kind, ttl: float
    ) -> None:
        async with AsyncRedlock(servers.urls) as holder, three_clients(servers.urls) as waiters:
            held = await bare_quorum(holder, masters, kind, ttl)
            locks = [kind.wait(client, NEVER, True) for client in waiters for _ in range(2)]
            waits = [Waits(client) for client in waiters]
            acquired: list[Lease] = []

            async def take(lock: Lock) -> None:
                acquired.append(await lock.acquire())

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for lock in locks:
                        tg.start_soon(take, lock)
                    await anyio.sleep(WAIT)  # the watch (an upper bound's span, no outcome)
                    tg.cancel_scope.cancel()
            attempts = [lock.statistics().attempts for lock in locks]
            woken = [each.woken for each in waits]
            # pauses that ran out, or that the cancellation ended
            timed = [each.waiting - each.woken for each in waits]
            wakeups = [client.statistics().wakeups for client in waiters]
            assert not held.lost
            await held.release()
        assert acquired == []  # the holder kept its quorum all along
        # every wake-up counted, once: each ended a wait (extending: but one per waiter
        # given while its attempt was out, as the watch ended, and not used yet)
        unused = 0 if ttl == HOLD else 2
        for counted, used in zip(wakeups, woken, strict=True):
            assert used <= counted <= used + unused, (wakeups, woken)
        # per client: one undo's wake-up per waiter, and one more per pause run out
        for client_woken, client_timed in zip(woken, timed, strict=True):
            assert client_woken <= client_timed + 2, (woken, timed, attempts)
        # per waiter: 1 + 1 + 1 (still); up to 2 more per pause that the holder's
        # expiry ended, 2 or 3 in the watched 1.5 s (extending)
        assert max(attempts) <= (3 if ttl == HOLD else 9), (attempts, woken, timed)


class TestEveryWaiterGoes:
    """The same waiters, the holder then releasing (on the 3 masters that still have
    its key): each gets the lock in turn, and releases it at once. Only wake-ups (or
    the masters handing the key over) can move them: nobody waits past the bound.

    The waiters' clients have a node timeout of `CONFIRM` seconds: ``enroll()`` waits
    that long (at most) for a quorum of masters to confirm the inbox's subscription,
    and a waiter leaves hand-over terms only with its inbox confirmed. With the
    default 0.1 s, a loaded machine's late confirmations sent every waiter's
    attempts without terms: each release then announced the next waiter, which went
    by an attempt, not by hand-over. Each waiter's entry lives three retry delays
    and node timeouts, hours either way."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("extend", [True, False], ids=["handed", "announced"])
    @pytest.mark.parametrize("kind", KINDS, ids=IDS)
    async def test_after_a_bare_quorum_holder_releases_every_waiter_is_woken_in_turn(
        self, servers: ServerGroup, masters: Masters, kind: Kind, extend: bool
    ) -> None:
        async with (
            AsyncRedlock(servers.urls) as holder,
            three_clients(servers.urls, node_timeout=CONFIRM) as waiters,
        ):
            held = await bare_quorum(holder, masters, kind, HOLD)
            locks = [kind.wait(client, NEVER, extend) for client in waiters for _ in range(2)]
            waits = Waits(*waiters)
            sources: list[str] = []

            async def take(lock: Lock) -> None:
                lease = await lock.acquire()
                sources.append(lease.statistics().source)
                await lease.release()

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for lock in locks:
                        tg.start_soon(take, lock)
                    # the first waiter of each client waits on the masters, its
                    # second behind it in the client (a fair lock's on the masters too)
                    await waits.reach(len(waiters))
                    before = sum(lock.statistics().attempts for lock in locks)
                    await held.release()
            after = sum(lock.statistics().attempts for lock in locks) - before
        assert len(sources) == len(locks)
        if extend and kind.name in HANDED:  # the masters hand the key on at each release
            assert set(sources) <= {"hand-over", "hand-off"}, sources
        # 7 releases (the holder's, then each waiter's), each waking a waiter per
        # client, and an undo's wake-up at most per pause: no storm
        assert after <= 6 * len(locks), (after, sources)


class TestReadersTogether:
    """Readers of three clients (two each) queued behind a writer: one release lets
    them all in. None of them releases until the test ends, so no reader's release
    can have woken another."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
    @pytest.mark.parametrize("bare", [False, True], ids=["writer on all", "writer on 3 of 5"])
    async def test_one_writers_release_lets_every_reader_of_every_client_in(
        self, servers: ServerGroup, masters: Masters, fair: bool, bare: bool
    ) -> None:
        async with AsyncRedlock(servers.urls) as holder, three_clients(servers.urls) as readers:
            writer = await holder.rwlock("k", fair=fair).write(ttl=HOLD).acquire()
            await holder.settle()
            if bare:
                for client in masters.clients[:2]:
                    assert await client.delete("k") == 1
            locks = [
                client.rwlock("k", fair=fair).read(ttl=HOLD, timeout=NEVER)
                for client in readers
                for _ in range(2)
            ]
            waits = Waits(*readers)
            got: list[Lease] = []

            async def read(lock: Lock) -> None:
                got.append(await lock.acquire())

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for lock in locks:
                        tg.start_soon(read, lock)
                    await waits.reach(len(locks))
                    before = [lock.statistics().attempts for lock in locks]
                    await writer.release()
            after = [lock.statistics().attempts for lock in locks]
            for lease in got:
                await lease.release()
        assert len(got) == len(locks)
        assert waits.woken >= len(locks)  # each went on a wake-up
        # each: the release's wake-up, and at most one undo's before it
        assert max(a - b for a, b in zip(after, before, strict=True)) <= 2, (before, after)


class TestFairOrder:
    """Fair waiters of three clients, arriving one after the other (each waiting on
    the masters before the next comes), get the lock in arrival order, each handed
    the key by the masters at the previous holder's release."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("kind", ["fair lock", "fair rw writer"])
    async def test_fair_writers_of_three_clients_go_in_arrival_order_handed_over(
        self, servers: ServerGroup, kind: str
    ) -> None:
        def make(client: AsyncRedlock) -> Lock:
            if kind == "fair lock":
                return client.lock("k", ttl=HOLD, timeout=NEVER, fair=True)
            return client.rwlock("k", fair=True).write(ttl=HOLD, timeout=NEVER)

        async with AsyncRedlock(servers.urls) as holder, three_clients(servers.urls) as waiters:
            held = await make(holder).acquire()
            waits = Waits(*waiters)
            locks = [make(waiters[i % 3]) for i in range(6)]
            order: list[int] = []
            sources: list[str] = []

            async def take(i: int, lock: Lock) -> None:
                lease = await lock.acquire()
                order.append(i)
                sources.append(lease.statistics().source)
                await lease.release()

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for i, lock in enumerate(locks):
                        tg.start_soon(take, i, lock)
                        await waits.reach(i + 1)
                    await held.release()
            attempts = [lock.statistics().attempts for lock in locks]
        assert order == list(range(6))
        assert sources == ["hand-over"] * 6
        # none attempted after it waited in line: the first attempt, and the one
        # right after the client first listened
        assert max(attempts) <= 2, attempts

    @pytest.mark.timeout(60)
    async def test_a_fair_rwlocks_readers_and_writers_of_three_clients_in_arrival_order(
        self, servers: ServerGroup
    ) -> None:
        """Writer, reader, reader, writer, reader, writer, of clients 1, 2, 3, 1, 2, 3:
        the two readers hold together (each waits for the other before it releases:
        a hang if they did not), between the first two writers."""
        plan = ["w", "r", "r", "w", "r", "w"]
        async with AsyncRedlock(servers.urls) as holder, three_clients(servers.urls) as waiters:
            held = await holder.rwlock("k", fair=True).write(ttl=HOLD).acquire()
            waits = Waits(*waiters)
            locks = []
            for i, side in enumerate(plan):
                rw = waiters[i % 3].rwlock("k", fair=True)
                if side == "w":
                    locks.append(rw.write(ttl=HOLD, timeout=NEVER))
                else:
                    locks.append(rw.read(ttl=HOLD, timeout=NEVER))
            order: list[int] = []
            sources: list[str] = []
            both_read = anyio.Event()

            async def take(i: int, lock: Lock) -> None:
                lease = await lock.acquire()
                order.append(i)
                sources.append(lease.statistics().source)
                if i in (1, 2):
                    if {1, 2} <= set(order):
                        both_read.set()
                    await both_read.wait()
                await lease.release()

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    for i, lock in enumerate(locks):
                        tg.start_soon(take, i, lock)
                        await waits.reach(i + 1)
                    await held.release()
        assert order[0] == 0, order
        assert set(order[1:3]) == {1, 2}, order
        assert order[3:] == [3, 4, 5], order
        # the first writer is handed the key by the holder's release; the others come
        # after readers, whose last release announces them (no hand-over): each of
        # the rest went by an attempt after a wake-up
        assert sources[0] == "hand-over", sources
        assert waits.woken >= sources.count("attempt"), (sources, waits.woken)


class TestPassedOn:
    """Sets of two clients: each has ["a", "b"] waiting first ("b" held elsewhere),
    then ["a", "c"] ("c" free). The release of "a" wakes each client's first set on
    "a"; it cannot use it and passes it on (docs/algorithm.md, "Wake-up on release"),
    so that both ["a", "c"] sets get the lock, one after the other. With "b" held on
    3 masters of 5 only, the ["a", "b"] sets' attempts are also granted and undone on
    the other 2."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("bare", [False, True], ids=["b on all", "b on 3 of 5"])
    async def test_a_set_woken_by_one_resource_while_another_is_held_passes_it_on(
        self, servers: ServerGroup, masters: Masters, bare: bool
    ) -> None:
        async with AsyncRedlock(servers.urls) as holder, three_clients(servers.urls) as made:
            waiters = made[:2]
            held_a = await holder.lock("a", ttl=HOLD).acquire()
            held_b = await holder.lock("b", ttl=HOLD).acquire()
            await holder.settle()
            if bare:
                for client in masters.clients[:2]:
                    assert await client.delete("b") == 1
            waits = Waits(*waiters)
            blocked = [client.lock(["a", "b"], ttl=HOLD, timeout=NEVER) for client in waiters]
            free = [client.lock(["a", "c"], ttl=HOLD, timeout=NEVER) for client in waiters]
            got: list[tuple[str, ...]] = []
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take(lock: Lock) -> None:
                        lease = await lock.acquire()
                        got.append(lease.resources)
                        await lease.release()
                        if len(got) == len(free):
                            tg.cancel_scope.cancel()  # the ["a", "b"] sets stay blocked

                    for lock in (*blocked, *free):
                        tg.start_soon(take, lock)
                        await waits.reach(waits.waiting + 1)
                    before = [lock.statistics().attempts for lock in blocked]
                    await held_a.release()
            after = [lock.statistics().attempts for lock in blocked]
            await held_b.release()
        assert got == [("a", "c")] * 2
        # three releases of "a" heard (the holder's, then each ["a", "c"] set's): a
        # few attempts each for the blocked sets, never a storm
        assert max(a - b for a, b in zip(after, before, strict=True)) <= 12, (before, after)


@contextlib.asynccontextmanager
async def split_clients(group: ServerGroup) -> AsyncIterator[list[AsyncRedlock]]:
    """Three clients of three masters, each reaching one of them at once and the two
    others through a proxy adding 0.2 s each way: woken by one release, each is
    granted the lock by its own master first, and refused by the two others (the
    other clients' attempts got there first), so all three attempts fail."""
    async with contextlib.AsyncExitStack() as stack:
        made = []
        for direct in range(3):
            urls = []
            for i, server in enumerate(group):
                if i == direct:
                    urls.append(server.url)
                    continue
                proxy = await stack.enter_async_context(FaultProxy("127.0.0.1", server.port))
                proxy.delay = 0.2
                urls.append(proxy.url)
            # (node_timeout: a master 0.2 s away is slow, not silent)
            made.append(
                await stack.enter_async_context(
                    AsyncRedlock(urls, retry_delay=NEVER, node_timeout=1.0)
                )
            )
        with whole_retry_delay(*made):
            yield made


async def held_on(group: ServerGroup, keys: tuple[str, ...]) -> list[int]:
    """How many of ``keys`` exist on each server."""
    found = []
    for server in group:
        client = Redis.from_url(server.url)
        try:
            found.append(await client.exists(*keys))
        finally:
            await client.aclose()
    return found


async def waiters_go_one_by_one(
    group: ServerGroup, kind: Kind, extend: bool = True, guard: float = GUARD
) -> tuple[int, list[int], list[int], list[int]]:
    """Split waiters (`split_clients`) of ``kind`` behind a holder of every master,
    which releases: how many of them got the lock in turn, each within ``guard``
    seconds of the previous release (releasing it at once); then their attempts,
    their clients' wake-ups, and how many of the keys each master had when one did
    not go."""
    async with (
        AsyncRedlock(group.urls) as holder,
        split_clients(group) as waiters,
        anyio.create_task_group() as tg,
    ):
        held = await kind.hold(holder, HOLD).acquire()
        locks = [kind.wait(client, NEVER, extend) for client in waiters]
        send, receive = anyio.create_memory_object_stream[Lease](len(locks))

        async def take(lock: Lock) -> None:
            await send.send(await lock.acquire())

        with Waits(*waiters) as waits:
            for lock in locks:
                tg.start_soon(take, lock)
            await waits.reach(len(locks))
        await held.release()
        went, left = 0, list[int]()
        for _ in locks:
            with anyio.move_on_after(guard):
                lease = await receive.receive()
                went += 1
                await lease.release()
                continue
            left = await held_on(group, ("a", "b", "k"))
            break
        tg.cancel_scope.cancel()
        attempts = [lock.statistics().attempts for lock in locks]
        wakeups = [client.statistics().wakeups for client in waiters]
    send.close()  # (its takers ended with the task group) unclosed, they warn when collected
    receive.close()
    return went, attempts, wakeups, left


# Split waiters: those that queue on the masters (an unfair read-write lock's writer
# once out of patience: at once with patience=0), whose undos the masters answer by
# handing the key back to (or announcing) the same first waiter; and those that do
# not (a set of several resources; an unfair writer within its patience, for ever with
# patience=inf), which only the undos' announcements on the lock's channel can wake.
QUEUED = [
    *KINDS[:2],
    KINDS[3],
    Kind(
        "impatient rw writer",
        lambda r, ttl: r.rwlock("k", patience=0).write(ttl=ttl),
        lambda r, t, x: r.rwlock("k", patience=0).write(ttl=HOLD, timeout=t, auto_extend=x),
        "k",
    ),
]
UNQUEUED = [
    KINDS[4],
    Kind(
        "patient rw writer",
        lambda r, ttl: r.rwlock("k", patience=math.inf).write(ttl=ttl),
        lambda r, t, x: r.rwlock("k", patience=math.inf).write(ttl=HOLD, timeout=t, auto_extend=x),
        "k",
    ),
]


class TestSplitGrants:
    """Waiters of three clients woken by one release, whose attempts split the
    masters' grants (each granted by one of three masters only): all fail, nobody
    holds the lock. One of them must still go, and the next at each release."""

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("extend", [True, False], ids=["handed", "announced"])
    @pytest.mark.parametrize("kind", QUEUED, ids=[kind.name for kind in QUEUED])
    async def test_queued_waiters_whose_attempts_split_the_grants_still_go(
        self, make_servers: MakeServers, kind: Kind, extend: bool
    ) -> None:
        """The undos hand the key back to the first waiter in the masters' queue
        (``handed``), or announce it on its inbox (``announced``), the same on every
        master: it goes."""
        group = make_servers(3)
        went, attempts, wakeups, left = await waiters_go_one_by_one(group, kind, extend)
        assert went == 3, (attempts, wakeups, left)

    @pytest.mark.timeout(150)
    @pytest.mark.parametrize("kind", UNQUEUED, ids=[kind.name for kind in UNQUEUED])
    async def test_unqueued_waiters_whose_attempts_split_the_grants_still_go(
        self, make_servers: MakeServers, kind: Kind
    ) -> None:
        """A release wakes one waiter per client; the three split the grants and
        fail. Their undos, announced on the lock's channel, tell each that a quorum
        of masters has every key free for it (`Waker._freed`): each tries again
        after a random backoff, so that they stop splitting the grants. Before
        that rule covered them, the undos woke each once (`Ticket.heeds`), the
        three split again, the next undos woke nobody, and no waiter tried before
        its hour-long retry delay (or the two-minute TTL of the other waiters'
        grants, which the refusing masters reported) with every key free on every
        master: ``went`` was 0, ``left`` [0, 0, 0].

        Who goes is then up to random backoffs, each in a window of the waiter's
        last failed round doubled per such wake-up: `SPLIT_GUARD` per waiter, not
        `GUARD` (a loaded machine's slow rounds and repeated splits drew backoffs
        past 6 s), and still far below the grants' TTL (`HOLD`) after which the
        waiters would try without the rule."""
        group = make_servers(3)
        went, attempts, wakeups, left = await waiters_go_one_by_one(group, kind, guard=SPLIT_GUARD)
        assert went == 3, (attempts, wakeups, left)
