"""`Ending`: a lease's end told once, to waiters and (on a loss) to callbacks."""

from __future__ import annotations

import asyncio

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
        lost, released = Ending[str](), Ending[str]()
        lost.add(heard.append, "lost")
        released.add(heard.append, "released")
        released.announce("released", lost=False)
        lost.announce("lost", lost=True)
        assert heard == []  # scheduled, not called inside announce()
        await asyncio.sleep(0)
        assert heard == ["lost"]
        lost.add(heard.append, "lost")
        released.add(heard.append, "released")
        await asyncio.sleep(0)
        assert heard == ["lost", "lost"]

    def test_remove_counts_every_registration(self) -> None:
        ending = Ending[str]()
        ending.add(print, "lease")
        ending.add(print, "lease")
        ending.add(repr, "lease")
        assert (ending.remove(print), ending.remove(print), ending.remove(repr)) == (2, 0, 1)
