"""`Ending`: a lease's end told once, to waiters and (on a loss) to callbacks."""

from __future__ import annotations

import anyio
import pytest

from asyncredlock._ending import Ending

pytestmark = pytest.mark.anyio


class TestEnding:
    async def test_waiters_wake_with_how_it_ended(self) -> None:
        ending = Ending[str]()
        async with anyio.create_task_group() as tg:
            results: list[bool] = []

            async def wait() -> None:
                results.append(await ending.wait())

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert results == []
            ending.announce("lease", lost=True)
        assert results == [True]
        assert await ending.wait() is True  # told already: returns at once

    async def test_told_once(self) -> None:
        ending = Ending[str]()
        ending.announce("lease", lost=False)
        ending.announce("lease", lost=True)
        assert (ending.known, await ending.wait()) == (True, False)

    async def test_callbacks_get_the_owner_on_a_loss_only(self) -> None:
        heard: list[str] = []
        arrived = anyio.Event()

        def hear(owner: str) -> None:
            heard.append(owner)
            if len(heard) == 2:
                arrived.set()

        lost, released = Ending[str](), Ending[str]()
        lost.add(hear, "lost")
        released.add(hear, "released")
        released.announce("released", lost=False)
        lost.announce("lost", lost=True)
        assert heard == []  # scheduled, not called inside announce()
        lost.add(hear, "lost")  # lost already: scheduled at once
        released.add(hear, "released")  # released: never called
        with anyio.fail_after(5):
            await arrived.wait()
        await anyio.wait_all_tasks_blocked()  # anything else scheduled has run too
        assert heard == ["lost", "lost"]

    def test_remove_counts_every_registration(self) -> None:
        ending = Ending[str]()
        ending.add(print, "lease")
        ending.add(print, "lease")
        ending.add(repr, "lease")
        assert (ending.remove(print), ending.remove(print), ending.remove(repr)) == (2, 0, 1)
