"""The head of a lock's queue whose client closes, or whose process
is stopped, while it is in line or being handed the key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from asyncredlock import AsyncRedlock, Lease

from .conftest import Masters, Waiting, queues

pytestmark = pytest.mark.anyio

HANG_GUARD = 10
PATIENT = 60.0
#: entries and handed keys of such a waiter live 3 x (retry_delay + 20) s: past the guard
SLOW = 20.0


async def two_in_line(
    urls: list[str],
    name: str,
    b: AsyncRedlock,
    c: AsyncRedlock,
    tg: anyio.abc.TaskGroup,
    results: dict[str, object],
) -> None:
    """B, then C, queued behind a holder (each in its own client)."""
    for who, redlock in (("b", b), ("c", c)):
        waiting = Waiting([redlock])

        async def take(who: str = who, redlock: AsyncRedlock = redlock) -> None:
            try:
                results[who] = await redlock.lock(name, ttl=PATIENT, timeout=PATIENT).acquire()
            except Exception as exc:  # recorded for the test
                results[who] = exc

        tg.start_soon(take)
        await waiting.reach(1)  # refused, enrolled, refused again: queued and listening


@pytest.mark.parametrize("handed", [False, True])
async def test_the_head_whose_client_closes_leaves_the_queue_and_its_key(
    handed: bool, servers, masters: Masters
) -> None:
    """B is first in line, C second; B's client closes (before the release, or just
    after the release handed B the key). B's entry and any key handed to it go at
    once: C gets the lock although B's entry and handed key would live a minute."""
    name = f"rfair:close:{int(handed)}"
    results: dict[str, object] = {}
    async with (
        AsyncRedlock(servers.urls, ttl=PATIENT) as holder,
        AsyncRedlock(servers.urls, node_timeout=SLOW) as c,
    ):
        b = AsyncRedlock(servers.urls, node_timeout=SLOW)
        await b.__aenter__()
        held = await holder.lock(name).acquire()
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                await two_in_line(servers.urls, name, b, c, tg, results)
                (ids,) = {tuple(q) for q in await queues(masters, name)}
                assert len(ids) == 2
                if handed:
                    await held.release()
                    await b.aclose()
                else:
                    await b.aclose()
                    assert [list(q) for q in await queues(masters, name)] == [[ids[1]]] * 5
                    await held.release()
        assert isinstance(results["b"], RuntimeError | Lease)
        lease = results["c"]
        assert isinstance(lease, Lease), lease
        await lease.release()
        await c.settle()
    assert await masters.keys() == [[]] * 5


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from asyncredlock import AsyncRedlock
    from asyncredlock.testing import Waits

    async def main() -> None:
        async with AsyncRedlock(sys.argv[2:]) as redlock:
            waits = Waits(redlock)
            waiter = asyncio.create_task(redlock.lock(sys.argv[1], timeout=600).acquire())
            await waits.reach(1)
            print("queued", flush=True)
            lease = await waiter
            print("acquired", lease.validity > 0, flush=True)
            await lease.release()
            await redlock.settle()
            print("done", flush=True)

    asyncio.run(main())
    """
)


async def test_a_stopped_head_delays_the_waiter_in_line_by_its_entry_then_resumes(
    servers, masters: Masters
) -> None:
    """A waiter in another process, first in line, SIGSTOPped; a second waiter, in
    line behind it (default settings: its entry and refresh pause are short). The
    release hands the key to the stopped one, for its entry's time: the second gets
    the lock long before the holder's TTL (a minute). Resumed after that, the stopped
    one takes no lease from its stale hand-over while the second holds; it gets the
    lock after, and nothing is left."""
    name = "rfair:stopped"
    async with (
        AsyncRedlock(servers.urls, ttl=PATIENT) as holder,
        AsyncRedlock(servers.urls) as c,
    ):
        held = await holder.lock(name).acquire()
        async with await anyio.open_process(
            [sys.executable, "-c", CHILD, name, *servers.urls], stdout=subprocess.PIPE
        ) as child:
            assert child.stdout is not None
            # the child's lines, whole: a pipe may deliver one in two chunks
            said = BufferedByteReceiveStream(child.stdout)
            with anyio.fail_after(HANG_GUARD):
                assert await said.receive_until(b"\n", 100) == b"queued"
            os.kill(child.pid, signal.SIGSTOP)
            try:
                waiting = Waiting([c])
                results: list[Lease] = []
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:

                        async def take() -> None:
                            results.append(
                                await c.lock(name, ttl=PATIENT, timeout=PATIENT).acquire()
                            )

                        tg.start_soon(take)
                        await waiting.reach(1)
                        assert [len(q) for q in await queues(masters, name)] == [2] * 5
                        await held.release()
                (lease,) = results
                assert lease.validity > 0
                os.kill(child.pid, signal.SIGCONT)
                # the resumed child must not hold while c does: give it time to run
                with anyio.move_on_after(1.5):
                    line = await said.receive_until(b"\n", 100)
                    pytest.fail(f"the resumed waiter said {line!r} while another held")
                assert await masters.holding(name) == 5
                await lease.release()
                with anyio.fail_after(HANG_GUARD):
                    lines = [await said.receive_until(b"\n", 100) for _ in range(2)]
                assert lines == [b"acquired True", b"done"]
                assert await child.wait() == 0
            finally:
                if child.returncode is None:
                    os.kill(child.pid, signal.SIGKILL)
        await c.settle()
    assert await masters.keys() == [[]] * 5
