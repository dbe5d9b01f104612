"""Load and shutdown against the I/O engine: counts, never timings.

- A cold burst of callers on fresh clients over healthy masters is never an outage.
- ``aclose()`` while calls wait on a hung majority ends every one of them with an
  error, long before the masters' ``socket_timeout`` would have.
- A key handed over to a waiter once ``aclose()`` began makes no lease: it is given
  back, and the waiter's ``acquire()`` ends with the closing error.
- ``aclose()`` takes the waiters still queued on the masters out of the queue (and
  gives back a key a release handed them) before it closes the connections.

The storm of cancelled acquisitions across clients is in ``test_cancellation.py``.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LockNotOwnedError,
    LockState,
    LockTimeoutError,
    QuorumUnavailableError,
)
from asyncredlock._keys import queue_keys, terms_key
from asyncredlock.testing import ServerGroup, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .. import loops
from .conftest import Masters, Waiting, library_tasks

pytestmark = pytest.mark.anyio

HANG_GUARD = 60  # seconds; only stops a hung test, never decides an outcome
#: node_timeout of a waiter that must be handed the key: it sends hand-over terms only
#: once its inbox subscription is confirmed, waited for up to node_timeout (only until
#: confirmed).
CONFIRM = 5.0


class TestColdBurst:
    async def test_a_burst_on_fresh_clients_is_never_an_outage(self, servers: ServerGroup) -> None:
        """The burst that once tipped a fresh client into a false outage of five
        healthy masters: 200 tasks, each looping acquire(timeout=0) + release on
        its own key, on a new AsyncRedlock, 20 times over."""
        workers, cycles, clients = 200, 5, 20
        unavailable = timeouts = done = 0
        opened: list[list[int]] = []

        async def worker(redlock: AsyncRedlock, i: int) -> None:
            nonlocal unavailable, timeouts, done
            lock = redlock.lock(f"burst:{i}", timeout=0)
            for _ in range(cycles):
                try:
                    lease = await lock.acquire()
                except QuorumUnavailableError:
                    unavailable += 1
                    continue
                except LockTimeoutError:
                    timeouts += 1
                    continue
                await lease.release()
                done += 1

        with anyio.fail_after(HANG_GUARD):
            for _ in range(clients):
                async with AsyncRedlock(servers.urls) as redlock:
                    async with anyio.create_task_group() as tg:
                        for i in range(workers):
                            tg.start_soon(worker, redlock, i)
                    opened.append(list(client_state(redlock).connections))
        assert (unavailable, timeouts) == (0, 0)
        assert done == workers * cycles * clients
        assert opened == [[1] * 5] * clients  # one connection per master, not per caller
        masters = Masters(servers.urls)
        try:
            assert await masters.keys() == [[]] * 5
        finally:
            await masters.aclose()

    async def test_max_connections_one_no_longer_bricks_the_instance(
        self, servers: ServerGroup
    ) -> None:
        """It used to let the wake-up subscription take the pool's only connection
        after the first contended wait; every later command then failed."""
        with pytest.warns(DeprecationWarning, match="max_connections"):
            waiter = AsyncRedlock(servers.urls, max_connections=1, retry_delay=0.05)
        async with AsyncRedlock(servers.urls) as holder, waiter:
            lease = await holder.lock("brick").acquire()
            with pytest.raises(LockTimeoutError):
                await waiter.lock("brick", timeout=0.3).acquire()  # waits, subscribed
            await lease.release()
            for i in range(5):  # later commands, on other locks
                other = await waiter.lock(f"brick:{i}", timeout=0).acquire()
                await other.release()
            assert waiter.statistics().acquisitions == 5


@pytest.fixture
def hung_majority(make_servers: MakeServers) -> ServerGroup:
    return make_servers(3)


class TestCloseWithCallsOnAHungMajority:
    """Two of three masters stop answering (SIGSTOP) while calls are out; aclose()
    must end them, though socket_timeout (30 s) would keep them waiting."""

    @staticmethod
    async def _close_while_pending(
        group: ServerGroup, start: Callable[[AsyncRedlock, Lease], Awaitable[Any]]
    ) -> tuple[BaseException | Any, AsyncRedlock]:
        """Take a lease on "hung" (no auto-extension) while every master answers,
        pause two masters, start the call, close while it waits; its outcome."""
        redlock = AsyncRedlock(group.urls, socket_timeout=30.0)
        outcome: list[BaseException | Any] = []
        try:
            lease = await redlock.lock("hung", auto_extend=False).acquire()
            group[1].pause()
            group[2].pause()

            async def call() -> None:
                try:
                    outcome.append(await start(redlock, lease))
                except Exception as exc:
                    outcome.append(exc)

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    await anyio.wait_all_tasks_blocked()  # the call waits on the masters
                    in_flight = client_state(redlock).in_flight
                    assert in_flight[1]
                    assert in_flight[2]
                    await redlock.aclose()
        finally:
            group[1].resume()
            group[2].resume()
            await redlock.aclose()
        (result,) = outcome
        return result, redlock

    async def test_a_pending_release_ends_with_an_error(self, hung_majority: ServerGroup) -> None:
        async def release(_: AsyncRedlock, lease: Lease) -> None:
            await lease.release()

        error, redlock = await self._close_while_pending(hung_majority, release)
        assert isinstance(error, QuorumUnavailableError)
        assert [o.detail.split(":")[0] for o in error.outcomes] == ["done"] + ["ClosedError"] * 2
        _nothing_left(redlock)

    async def test_a_pending_extend_ends_with_an_error(self, hung_majority: ServerGroup) -> None:
        async def extend(_: AsyncRedlock, lease: Lease) -> None:
            await lease.extend()

        error, redlock = await self._close_while_pending(hung_majority, extend)
        # the close ended the lease while its round ran: it is no longer held
        assert isinstance(error, LockNotOwnedError)
        assert "ClosedError" in error.outcomes[1].detail
        _nothing_left(redlock)

    async def test_a_pending_force_release_ends_with_an_error(
        self, hung_majority: ServerGroup
    ) -> None:
        async def force(redlock: AsyncRedlock, _: Lease) -> int:
            return await redlock.force_release("hung")

        error, redlock = await self._close_while_pending(hung_majority, force)
        assert isinstance(error, QuorumUnavailableError)
        _nothing_left(redlock)

    async def test_a_pending_inspect_reports_the_closed_masters(
        self, hung_majority: ServerGroup
    ) -> None:
        async def inspect(redlock: AsyncRedlock, _: Lease) -> LockState:
            return await redlock.inspect("hung")

        state, redlock = await self._close_while_pending(hung_majority, inspect)
        assert isinstance(state, LockState)
        assert state.nodes[0].holder is not None  # the master that answered
        assert [n.error is not None and "ClosedError" in n.error for n in state.nodes] == [
            False,
            True,
            True,
        ]
        _nothing_left(redlock)

    async def test_a_pending_acquire_ends_with_an_error(self, hung_majority: ServerGroup) -> None:
        async def acquire(redlock: AsyncRedlock, _: Lease) -> None:
            await redlock.lock("hung:other", timeout=30).acquire()

        error, redlock = await self._close_while_pending(hung_majority, acquire)
        assert isinstance(error, RuntimeError | QuorumUnavailableError), error
        _nothing_left(redlock)


class TestCloseWhileHandedOver:
    async def test_a_key_handed_over_once_aclose_began_makes_no_lease(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """A waiter is in line (its hand-over terms on every master) when its client's
        aclose() begins, held up there by calls still out on a paused master. The
        holder, another client, releases meanwhile: four masters hand the waiter the
        key, unless the waiter's leaving the queue (aclose() wakes it) reached them
        first. acquire() must end with the closing error, not return a lease nobody
        will release, and the handed keys must be given back."""
        outcome: list[Lease | BaseException] = []
        ended = anyio.Event()
        paused = servers[4]
        async with AsyncRedlock(servers.urls) as holder:
            waiter = AsyncRedlock(servers.urls, node_timeout=2.0)
            try:
                held = await holder.lock("line", ttl=60).acquire()
                waiting = Waiting([waiter])
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:

                        async def take() -> None:
                            try:
                                outcome.append(await waiter.lock("line", timeout=30).acquire())
                            except Exception as exc:
                                outcome.append(exc)
                            finally:
                                ended.set()

                        tg.start_soon(take)
                        await waiting.reach(1)  # in line, its terms left on every master
                        paused.pause()
                        try:
                            await waiter.lock("other", ttl=60).acquire()  # calls out on 4
                            tg.start_soon(waiter.aclose)
                            await anyio.wait_all_tasks_blocked()  # aclose() waits on 4
                            with pytest.raises(RuntimeError, match="closed"):
                                waiter.lock("probe")  # aclose() began
                            await held.release()  # handed to the waiter on masters 0-3
                            # aclose() cannot end before master 4 answers: it resumes
                            # only once acquire() has ended
                            await ended.wait()
                            assert client_state(waiter).in_flight[4] > 0
                            (result,) = outcome
                            assert isinstance(result, RuntimeError), result
                            assert "closed while acquire() waited" in str(result)
                        finally:
                            paused.resume()
                # (master 4 may yet hand the key to the waiter's entry when it resumes:
                # whether its give-back arrives first is open; that key expires with
                # the entry)
                assert [await client.exists("line") for client in masters.clients[:4]] == [0] * 4
                stats = waiter.statistics()
                assert (stats.in_flight, stats.background_tasks) == (0, 0)
            finally:
                await waiter.aclose()


def _hold_lock(redlock: AsyncRedlock) -> Awaitable[Lease]:
    return redlock.lock("job:9", ttl=60, timeout=0).acquire()


def _hold_semaphore(redlock: AsyncRedlock) -> Awaitable[Lease]:
    return redlock.semaphore("job:9", 1, ttl=60, timeout=0).acquire()


#: For each kind of waiter: how a holder takes "job:9" at once (timeout=0), and how
#: a waiter of that kind waits for it (each one queues on the masters).
KINDS: dict[str, tuple[Callable[[AsyncRedlock], Awaitable[Lease]], ...]] = {
    "lock": (_hold_lock, lambda redlock: redlock.lock("job:9", timeout=60).acquire()),
    "fair lock": (
        _hold_lock,
        lambda redlock: redlock.lock("job:9", timeout=60, fair=True).acquire(),
    ),
    "writer": (
        _hold_lock,
        lambda redlock: redlock.rwlock("job:9", patience=0).write(timeout=60).acquire(),
    ),
    "fair reader": (
        _hold_lock,
        lambda redlock: redlock.rwlock("job:9", fair=True).read(timeout=60).acquire(),
    ),
    "fair semaphore": (
        _hold_semaphore,
        lambda redlock: redlock.semaphore("job:9", 1, timeout=60, fair=True).acquire(),
    ),
}


class TestCloseWhileQueuedOnTheMasters:
    """aclose() while an acquire() of its client waits in the masters' queue behind a
    holder of another client: the waiter leaves the queue before the connections close,
    so the holder's release hands the key to nobody and a third client takes it at
    once; the acquire() ends with the closing error."""

    @staticmethod
    async def _close_while_queued(
        urls: list[str],
        masters: Masters,
        kind: str,
        between: Callable[[], Awaitable[None]] | None = None,
        **settings: float,
    ) -> BaseException | Lease:
        """Queue a waiter of ``kind`` for "job:9" (held by another client) on every
        master, run ``between``, close the waiter's client: the waiter's outcome."""
        outcome: list[BaseException | Lease] = []
        waiter = AsyncRedlock(urls, **settings)
        try:
            waiting = Waiting([waiter])
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        try:
                            outcome.append(await KINDS[kind][1](waiter))
                        except Exception as exc:
                            outcome.append(exc)

                    tg.start_soon(take)
                    await waiting.reach(1)
                    await waiter.settle()  # every master answered its attempts
                    queued = [
                        [key for key in keys if b"queue" in key] for keys in await masters.keys()
                    ]
                    assert all(queued), "queued on every master"
                    if between is not None:
                        await between()
                    await waiter.aclose()
                    assert outcome, "acquire() ended within aclose()"
        finally:
            await waiter.aclose()
        (result,) = outcome
        return result

    @pytest.mark.parametrize("kind", list(KINDS))
    async def test_the_waiter_leaves_the_queue(
        self, servers: ServerGroup, masters: Masters, kind: str
    ) -> None:
        """Fails on the code before: the entry stayed on every master, and acquire()
        raised "this AsyncRedlock is closed" from its next attempt; the release then
        handed the key to the entry (or named it first, to a closed inbox), and the
        third client was refused ("held by another holder") until the entry lapsed."""
        hold, _ = KINDS[kind]
        async with AsyncRedlock(servers.urls) as holder:
            held = await hold(holder)
            before = await masters.keys()  # the holder's key
            result = await self._close_while_queued(servers.urls, masters, kind)
            assert isinstance(result, RuntimeError), result
            assert "closed while acquire() waited" in str(result)
            assert await masters.keys() == before, "no entry left"
            await held.release()
            await holder.settle()
        assert await masters.keys() == [[]] * 5, "nothing left but the fence counter"
        async with AsyncRedlock(servers.urls) as third:
            await (await hold(third)).release()  # at once: LockTimeoutError if not

    async def test_a_key_handed_before_aclose_is_given_back(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Masters 2-4 lost the queue (as a master restarted empty does): the holder's
        release hands the key to the waiter on masters 0 and 1 only, short of a quorum,
        and the waiter has not acted on it yet (it would a quarter of node_timeout
        later, 1.25 s) when its client closes: the two keys are given back. Fails on
        the code before: they stayed, and the entry, until the entry lapsed."""
        handed: list[list[bytes | None]] = []
        async with AsyncRedlock(servers.urls) as holder:
            held = await holder.lock("job:9", ttl=60).acquire()

            async def release() -> None:
                for client in masters.clients[2:]:
                    await client.delete(*queue_keys("job:9"), terms_key("job:9"))
                await held.release()  # hands the key over where the waiter is queued
                await holder.settle()
                handed.append([await client.get("job:9") for client in masters.clients])

            result = await self._close_while_queued(
                servers.urls, masters, "lock", release, node_timeout=CONFIRM
            )
        ((first, second, *others),) = handed
        assert first is not None, handed
        assert (second, others) == (first, [None] * 3), handed
        assert isinstance(result, RuntimeError), result
        assert "closed while acquire() waited" in str(result)
        assert await masters.keys() == [[]] * 5, "nothing left but the fence counter"

    async def test_a_master_that_does_not_answer_holds_aclose_up_no_longer(
        self, servers: ServerGroup, masters: Masters
    ) -> None:
        """Master 4 stops answering while the waiter is queued: aclose() still ends
        (within node_timeout; the test's guard only stops a hang), the waiter leaves
        the queue on masters 0-3, and a third client takes the lock at once."""
        paused = servers[4]

        async def pause() -> None:
            paused.pause()

        async with AsyncRedlock(servers.urls) as holder:
            held = await holder.lock("job:9", ttl=60).acquire()
            try:
                result = await self._close_while_queued(servers.urls, masters, "lock", pause)
                assert isinstance(result, RuntimeError), result
                assert "closed while acquire() waited" in str(result)
                queue = queue_keys("job:9")[0]  # on the masters that answer: empty
                assert [await client.exists(queue) for client in masters.clients[:4]] == [0] * 4
            finally:
                paused.resume()
            await held.release()
            await holder.settle()
        assert await _taken_at_once(servers.urls)


async def _taken_at_once(urls: list[str]) -> bool:
    """Whether a new client takes "job:9" with ``timeout=0`` (else LockTimeoutError)."""
    async with AsyncRedlock(urls) as third, third.lock("job:9", timeout=0) as lease:
        return lease.held


def _nothing_left(redlock: AsyncRedlock) -> None:
    stats = redlock.statistics()
    assert (stats.in_flight, stats.background_tasks) == (0, 0)
    assert library_tasks() == []


class TestDemotedMaster:
    async def test_a_master_turned_replica_is_reconnected(self, make_servers: MakeServers) -> None:
        """After a failover the old master answers writes with READONLY; the link
        drops that connection, so the next call goes through the opener again
        (which, for a Sentinel client, asks for the new master's address)."""
        group = make_servers(2)
        primary, demoted = group[0], group[1]
        direct = Masters([demoted.url])
        async with AsyncRedlock([demoted.url]) as redlock:
            lease = await redlock.lock("demoted", timeout=0).acquire()
            await lease.release()
            assert client_state(redlock).connections == (1,)
            await direct.clients[0].execute_command("REPLICAOF", primary.host, primary.port)
            try:
                with pytest.raises(QuorumUnavailableError) as caught:
                    await redlock.lock("demoted", timeout=0).acquire()
                assert "READONLY" in caught.value.outcomes[0].detail
            finally:
                await direct.clients[0].execute_command("REPLICAOF", "NO", "ONE")
            lease = await redlock.lock("demoted", timeout=0).acquire()
            await lease.release()
            assert client_state(redlock).connections == (2,)
        await direct.aclose()


def run_elsewhere(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` on a new loop of the suite's kind (as `asyncio.run` would)."""
    with loops.runner() as runner:
        return runner.run(coroutine)


class TestEventLoops:
    def test_a_second_event_loop_is_refused_with_the_cause(self, servers: ServerGroup) -> None:
        """One AsyncRedlock per event loop: a second asyncio.run() gets a clear error,
        before anything is sent, not 'Event loop is closed' from a dead transport."""
        redlock = AsyncRedlock(servers.urls)

        async def cycle() -> None:
            lease = await redlock.lock("loops").acquire()
            await lease.release()

        async def close() -> None:
            await redlock.aclose()

        first = loops.loop_factory()()  # the suite's loop, like the other
        try:
            first.run_until_complete(cycle())
            for action in (cycle, close):
                with pytest.raises(RuntimeError, match="first used on another event loop"):
                    run_elsewhere(action())
            lease = first.run_until_complete(redlock.lock("held").acquire())
            with pytest.raises(RuntimeError, match="first used on another event loop"):
                run_elsewhere(lease.release())
            assert lease.held  # refused before anything changed
            for other in (redlock.settle, lease.extend):
                with pytest.raises(RuntimeError, match="first used on another event loop"):
                    run_elsewhere(other())
            first.run_until_complete(lease.release())
            first.run_until_complete(close())  # on its own loop it closes as usual
        finally:
            first.close()


class TestALeaseOutlivingItsLoop:
    """A lease held when its event loop closes (``asyncio.run()`` ended without
    ``aclose()``): nothing can extend, release or mark it any more."""

    @pytest.mark.parametrize("auto_extend", [True, False])
    def test_one_that_extends_itself_is_lost_once_its_validity_ran_out(
        self, servers: ServerGroup, auto_extend: bool
    ) -> None:
        """Held while its validity lasts (the key is still on the masters); then an
        extending lease is lost (it said held, not lost, validity 0.0), and one with
        ``auto_extend=False`` stays held, as it does on a running loop (its docs: its
        validity may run out)."""
        now = [time.monotonic()]  # its clock: moved on by hand, not waited for
        redlock = AsyncRedlock(servers.urls, ttl=30.0, clock=lambda: now[0])
        lease = run_elsewhere(redlock.lock("outlived", auto_extend=auto_extend).acquire())
        before = (lease.held, lease.lost, lease.validity > 0)
        now[0] += 30.0  # its validity runs out
        after = (lease.held, lease.lost, lease.validity, repr(lease).split()[-2])
        with warnings.catch_warnings():  # its sockets', and its own: never closed (it
            warnings.simplefilter("ignore", ResourceWarning)  # cannot be, from another loop)
            del redlock, lease
            gc.collect()
        assert before == (True, False, True)
        if auto_extend:
            assert after == (False, True, 0.0, "lost")
        else:
            assert after == (True, False, 0.0, "held")


async def _cycle(redlock: AsyncRedlock, *, close: bool = False) -> None:
    lease = await redlock.lock("cycle", timeout=0).acquire()
    await lease.release()
    if close:
        await redlock.aclose()


def _ours(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [each for each in caught if str(each.message).startswith("unclosed <AsyncRedlock")]


class TestDroppedUnclosed:
    """An ``AsyncRedlock`` used and dropped without ``aclose()`` warns of it, as
    aiohttp's ``ClientSession`` and redis-py's clients do (``ResourceWarning``); one
    never used, or closed, does not; and its ``__del__`` never raises."""

    def test_a_used_client_dropped_unclosed_warns(self, servers: ServerGroup) -> None:
        redlock = AsyncRedlock(servers.urls)
        run_elsewhere(_cycle(redlock))
        described = repr(redlock)
        gc.collect()  # (earlier garbage: only this client's warning is recorded below)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del redlock
            gc.collect()
        (warned,) = _ours(caught)
        assert warned.category is ResourceWarning
        assert str(warned.message).startswith(f"unclosed {described}: ")
        assert "aclose()" in str(warned.message)
        assert type(warned.source) is AsyncRedlock

    def test_one_never_used_or_closed_does_not_warn(self, servers: ServerGroup) -> None:
        unused = AsyncRedlock(servers.urls)
        unused.lock("cycle"), unused.rwlock("cycle")  # nothing sent: not bound to a loop
        closed = AsyncRedlock(servers.urls)
        run_elsewhere(_cycle(closed, close=True))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del unused, closed
            gc.collect()
        assert _ours(caught) == []

    def test_one_whose_constructor_raised_is_dropped_quietly(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Its ``__del__`` finds no engine (``_core``): nothing raised, nothing warned."""
        unraisable: list[object] = []
        monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for bad in ({"ttl": -1.0}, {"masters": ["nowhere://x"]}):
                kwargs: dict[str, Any] = {"masters": ["redis://127.0.0.1:1"], **bad}
                with pytest.raises(ValueError, match=r"ttl|master URL"):
                    AsyncRedlock(**kwargs)
            gc.collect()
        assert (unraisable, _ours(caught)) == ([], [])

    def test_at_interpreter_exit_it_warns_and_nothing_raises(self, servers: ServerGroup) -> None:
        """A module-level client used by ``asyncio.run()`` and never closed, dropped as
        the interpreter exits."""
        script = (
            "import asyncio, sys\n"
            "from asyncredlock import AsyncRedlock\n"
            "redlock = AsyncRedlock(sys.argv[1:])\n"
            "async def main():\n"
            "    await redlock.lock('at-exit', ttl=1.0).acquire()\n"
            "asyncio.run(main())\n"
        )
        done = subprocess.run(
            [sys.executable, "-W", "always::ResourceWarning", "-c", script, *servers.urls],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "ResourceWarning: unclosed <AsyncRedlock [" in done.stderr
        assert "Exception ignored" not in done.stderr, done.stderr


class TestClosingAfterItsLoop:
    """A client whose event loop closed before it was closed: only that loop could
    close its connections."""

    def test_its_client_can_no_longer_be_closed_and_says_why(self, servers: ServerGroup) -> None:
        """aclose() from another loop, once the client's own loop is closed, raises the
        other-loop error saying that loop is closed (its connections could be closed by
        that loop only); while that loop is open, the error says nothing of it."""
        redlock = AsyncRedlock(servers.urls)
        with loops.runner() as own:  # (closed as asyncio.run() closes its loop)
            own.run(_cycle(redlock))
            with pytest.raises(RuntimeError, match="another event loop") as open_:
                run_elsewhere(redlock.aclose())
            own.run(_cycle(redlock))
        with pytest.raises(RuntimeError, match="another event loop") as closed:
            run_elsewhere(redlock.aclose())
        said = (str(open_.value), str(closed.value))
        with warnings.catch_warnings():  # never closed: it cannot be (see the error)
            warnings.simplefilter("ignore", ResourceWarning)
            del redlock, open_, closed  # (their tracebacks hold it too)
            gc.collect()
        assert "closed" not in said[0]
        assert "that loop is closed, so this one can no longer be closed" in said[1]


class TestConcurrentClose:
    async def test_a_second_aclose_returns_once_the_first_closed(
        self, servers: ServerGroup
    ) -> None:
        """Two aclose() calls at once (a lifespan's end and a signal handler): the
        second returned at once, while the first still waited for an acquire() to
        leave the masters' queue and had closed nothing; code after it then ran with
        calls, tasks and connections still open."""
        outcome: list[BaseException] = []
        async with AsyncRedlock(servers.urls) as holder:
            held = await holder.lock("twice", ttl=30).acquire()
            waiter = AsyncRedlock(servers.urls)
            try:
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:

                        async def take() -> None:
                            try:
                                await waiter.lock("twice", timeout=HANG_GUARD).acquire()
                            except RuntimeError as exc:
                                outcome.append(exc)

                        tg.start_soon(take)
                        await Waiting([waiter]).reach(1)
                        first = asyncio.get_running_loop().create_task(waiter.aclose())
                        await asyncio.sleep(0)  # the first aclose() began
                        assert waiter._core.closing
                        assert not first.done()
                        await waiter.aclose()  # the second
                        state = (len(outcome), waiter._core.closed)
                        await first
            finally:
                await waiter.aclose()
            await held.release()
        assert state == (1, True)

    async def test_an_aclose_cancelled_while_it_waits_still_closes_the_client(
        self, make_servers: MakeServers
    ) -> None:
        """aclose() waits (up to node_timeout) for a release still out on a frozen
        master; its task is cancelled meanwhile (a lifespan's shutdown timeout). The
        cancellation ends it only once the client is closed: no connection or task
        of the library is left, and the next aclose() returns. (A plain task.cancel()
        went through the shield: nothing was closed, and the next aclose() returned
        at once, leaving it so.)"""
        group = make_servers(3)
        before = await _connections(group.urls)
        redlock = AsyncRedlock(group.urls, node_timeout=1.0, socket_timeout=30.0)
        try:
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("closing", auto_extend=False).acquire()
                group[2].pause()
                await lease.release()  # a quorum answered; master 2's call is out
                closing = asyncio.get_running_loop().create_task(redlock.aclose())
                await anyio.wait_all_tasks_blocked()
                assert not closing.done()
                closing.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await closing
                left = (library_tasks(), redlock._core.closed)
                group[2].resume()
                await redlock.aclose()  # returns: closed already
                assert await _connections(group.urls) == before
        finally:
            group[2].resume()
        assert left == ([], True)


async def _connections(urls: list[str]) -> int:
    """Client connections on the masters, but the one asking on each."""
    total = 0
    for url in urls:
        async with Redis.from_url(url) as direct:
            total += len(await direct.client_list()) - 1
    return total


class TestCloseInACancelledScope:
    async def test_aclose_in_a_cancelled_anyio_scope_waits_without_spinning(
        self, make_servers: MakeServers, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An anyio scope cancelled around aclose() (``move_on_after``) delivers its
        cancellation again at every turn of the loop: aclose() waits for the close
        once, in a shielded scope, rather than catching and waiting again at every
        turn (about a million turns in a second of close, the CPU busy)."""
        waits = 0
        shield = asyncio.shield

        def counted(awaitable: Any) -> Any:  # aclose()'s own waits for the close
            nonlocal waits
            waits += sys._getframe(1).f_globals["__name__"] == "asyncredlock._operator"
            return shield(awaitable)

        group = make_servers(3)
        redlock = AsyncRedlock(group.urls, node_timeout=1.0)
        try:
            with anyio.fail_after(HANG_GUARD):
                lease = await redlock.lock("spin", auto_extend=False).acquire()
                group[2].pause()
                await lease.release()  # master 2's call is out: the close waits for it
                monkeypatch.setattr(asyncio, "shield", counted)
                with anyio.move_on_after(0.01):
                    await redlock.aclose()
                monkeypatch.undo()
        finally:
            group[2].resume()
        assert redlock._core.closed
        assert waits == 1
