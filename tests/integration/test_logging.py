"""The ``asyncredlock`` log tells a lease's story: who, which masters, and why, at each
step, as text and as ``extra`` fields for structured handlers."""

from __future__ import annotations

import asyncio
import logging

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, LockLostError, LockNotOwnedError
from asyncredlock.testing import ServerGroup, Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Heard, Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


class Clock:
    """An injected clock: frozen, then ``step`` later at every read."""

    def __init__(self) -> None:
        self.now, self.step = 1000.0, 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def records(caplog: pytest.LogCaptureFixture, resource: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "resource", None) == resource]


class TestLeaseStory:
    async def test_acquired_after_waiting_names_the_lease(
        self, servers: ServerGroup, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asyncredlock")
        async with (
            AsyncRedlock(servers.urls, identity="holder") as holder,
            AsyncRedlock(servers.urls, identity="waiter") as waiter,
        ):
            held = await holder.lock("story").acquire()
            got: list[Lease] = []
            with anyio.fail_after(HANG_GUARD), Waits(waiter) as waits:
                async with anyio.create_task_group() as tg:

                    async def take() -> None:
                        got.append(await waiter.lock("story").acquire())

                    tg.start_soon(take)
                    await waits.reach(1)  # refused once: it waits for the release
                    await held.release()
            await got[0].release()
        (record,) = [r for r in records(caplog, "story") if r.levelno == logging.INFO]
        assert record.getMessage().startswith("acquired 'story' after waiting")
        assert (record.__dict__["identity"], record.__dict__["token"]) == (
            "waiter",
            got[0].token,
        )

    async def test_a_loss_by_deletion_says_which_masters_and_why(
        self,
        servers: ServerGroup,
        masters: Masters,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        async with AsyncRedlock(servers.urls, identity="web-1") as redlock:
            lease = await redlock.lock("gone", ttl=30, auto_extend=False).acquire()
            # acquire() returns at a quorum: a SET still out could land after the DELETE
            # below. inspect() reads every master after it, in order on each connection.
            state = await redlock.inspect("gone")
            assert [node.holder for node in state.nodes] == [lease.value] * 5
            for client in masters.clients[:3]:
                await client.delete("gone")
            with pytest.raises(Exception, match="no longer held"):
                await lease.extend()
        failed, lost = records(caplog, "gone")
        assert failed.levelno == lost.levelno == logging.WARNING
        assert failed.getMessage().startswith("extending 'gone' failed (not held)")
        assert lost.getMessage().startswith(
            "lease on 'gone' lost: a majority of masters no longer hold it"
        )
        for record in (failed, lost):
            assert record.__dict__["identity"] == "web-1"
            assert record.__dict__["token"] == lease.token
            assert set(record.__dict__["masters"]) == set(servers.urls)
        assert servers.urls[0] in lost.getMessage()  # a master that said why, named

    async def test_an_extension_confirmed_too_late_says_so_not_gone(
        self, servers: ServerGroup, masters: Masters, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Every master extends the lease, but the client's clock says the quorum
        answered after the new expiry the round set: the lease is lost as extended too
        late, not as gone from the masters (which still hold it, until it is released)."""
        clock = Clock()
        async with AsyncRedlock(servers.urls, clock=clock, identity="web-1") as redlock:
            lease = await redlock.lock("late", ttl=30, auto_extend=False).acquire()
            clock.step = 60.0  # each read from now on: two TTLs later
            with pytest.raises(LockNotOwnedError, match="confirmed only after the expiry it set"):
                await lease.extend()
            assert lease.lost
            await redlock.settle()
        failed, lost = records(caplog, "late")
        assert failed.getMessage().startswith(
            "extending 'late' failed (too late: confirmed only after the expiry it set)"
        )
        assert lost.getMessage().startswith(
            "lease on 'late' lost: extended too late: a quorum confirmed it only after the"
            " expiry it set"
        )
        assert await masters.keys() == [[]] * 5  # what remained is removed

    async def test_an_extension_whose_lease_was_released_meanwhile_is_not_too_late(
        self, servers: ServerGroup, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Released while its extension round runs: the masters extend it (the
        release goes behind), but the lease has ended. extend() says it is no longer
        held, not that it came too late, and no loss is logged."""
        async with AsyncRedlock(servers.urls) as redlock:
            lease = await redlock.lock("ended", ttl=30, auto_extend=False).acquire()
            extending = asyncio.create_task(lease.extend())
            await asyncio.sleep(0)  # its round goes out
            await lease.release()
            with pytest.raises(LockNotOwnedError, match="no longer held"):
                await extending
            assert not lease.lost
        assert [r for r in records(caplog, "ended") if "lost" in r.getMessage()] == []

    async def test_an_outage_logs_each_failed_extension_then_the_loss(
        self, make_servers: MakeServers, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="asyncredlock")
        group = make_servers(3)
        async with AsyncRedlock(group.urls, node_timeout=0.05) as redlock:
            with anyio.fail_after(HANG_GUARD), pytest.raises(LockLostError):
                async with redlock.lock("outage", ttl=0.6):
                    group[0].stop()
                    group[1].stop()
                    await anyio.sleep_forever()  # until the lease is lost
        story = records(caplog, "outage")
        *failed, lost = story
        assert failed
        # the first failure of the run is a warning, the retries after it debug lines
        assert [r.levelno for r in failed] == [logging.WARNING] + [logging.DEBUG] * (
            len(failed) - 1
        )
        for record in failed:
            message = record.getMessage()
            assert message.startswith("extending 'outage' failed (too many masters")
            assert group.urls[0] in message
        assert lost.getMessage().startswith(
            "lease on 'outage' lost: not extended before its validity ran out"
        )

    async def test_closing_with_a_lease_held_logs_why(
        self, servers: ServerGroup, caplog: pytest.LogCaptureFixture
    ) -> None:
        redlock = AsyncRedlock(servers.urls)
        await redlock.lock("closed").acquire()
        await redlock.aclose()
        (record,) = records(caplog, "closed")
        assert record.__dict__["reason"] == "its AsyncRedlock was closed"


class TestMasters:
    async def test_a_silent_master_and_its_return_are_logged(
        self, make_servers: MakeServers, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asyncredlock")
        group = make_servers(3)
        quiet = group.urls[2]
        heard = anyio.Event()
        handler = Heard(f"master {quiet} silent", heard)
        logging.getLogger("asyncredlock").addHandler(handler)
        try:
            async with AsyncRedlock(group.urls, node_timeout=0.05) as redlock:
                await (await redlock.lock("warm").acquire()).release()
                group[2].pause()
                leases = []
                try:
                    with anyio.fail_after(HANG_GUARD):
                        leases.append(await redlock.lock("quiet").acquire())  # at quorum
                        await heard.wait()  # its call there is out, unanswered
                finally:
                    group[2].resume()
                await leases[0].release()
                with anyio.fail_after(HANG_GUARD):
                    await redlock.settle()
        finally:
            logging.getLogger("asyncredlock").removeHandler(handler)
        about = [r for r in caplog.records if r.getMessage().startswith(f"master {quiet}")]
        assert about[0].getMessage().startswith(f"master {quiet} silent: no reply for")
        assert about[0].levelno == logging.WARNING
        assert about[0].__dict__["masters"] == {quiet: "silent"}
        assert about[-1].getMessage() == f"master {quiet} answers again"
        assert about[-1].levelno == logging.INFO
