"""A name's key depends on its characters alone, whatever ``str`` subclass holds them.

``Lock.make`` keeps lock specs by name; a ``str`` subclass kept as given, with an
equality or hash of its own, found the spec of another resource (its key), or
passed the check that a lock names each resource once.
"""

from __future__ import annotations

import anyio
import pytest

from asyncredlock import AsyncRedlock
from asyncredlock._template import NameTemplate

from .conftest import Masters

pytestmark = pytest.mark.anyio

HANG_GUARD = 10


class CaseInsensitive(str):
    """A str compared and hashed without regard to case."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and self.lower() == other.lower()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.lower())


class ByIdentity(str):
    """A str compared and hashed by identity (as an object would be)."""

    __slots__ = ()
    __eq__ = object.__eq__  # type: ignore[assignment]
    __ne__ = object.__ne__  # type: ignore[assignment]
    __hash__ = object.__hash__  # type: ignore[assignment]


class Shouting(str):
    """A str whose ``str()``, ``+``, length and formatting say something else."""

    __slots__ = ()

    def __str__(self) -> str:
        return "other"

    def __add__(self, other: object) -> str:
        return "other"

    def __len__(self) -> int:
        return 0

    def format_map(self, mapping: object) -> str:  # type: ignore[override]
        return "other"


async def test_a_str_subclass_name_locks_its_own_key(masters: Masters) -> None:
    async with AsyncRedlock(masters.urls, timeout=0) as redlock:
        redlock.lock("orders")  # an ordinary lock on another resource, made first
        lock = redlock.lock(CaseInsensitive("Orders"))
        assert type(lock.names[0]) is str
        with anyio.fail_after(HANG_GUARD):
            async with lock as lease:
                held = lease.key
                assert await masters.keys() == [[b"Orders"]] * len(masters)
        assert (lock.key, held) == ("Orders", "Orders")
        await redlock.settle()
    assert await masters.keys() == [[]] * len(masters)


async def test_one_resource_named_twice_is_refused_whatever_str_it_is(
    masters: Masters,
) -> None:
    async with AsyncRedlock(masters.urls, timeout=0) as redlock:
        with pytest.raises(ValueError, match="given twice: \\['dup'\\]"):
            redlock.lock([ByIdentity("dup"), ByIdentity("dup")])
        with pytest.raises(ValueError, match="given twice"):
            redlock.lock([CaseInsensitive("dup"), "dup"])
        assert redlock.lock([CaseInsensitive("a"), "A"]).keys == ("a", "A")


async def test_a_str_subclass_prefix_identity_or_template_is_taken_as_its_characters(
    masters: Masters,
) -> None:
    redlock = AsyncRedlock(masters.urls, timeout=0, prefix=Shouting("p:"), identity=Shouting("me"))
    async with redlock:
        assert (type(redlock.identity), redlock.identity) == (str, "me")
        lock = redlock.lock(Shouting("n"))
        assert (lock.name, lock.key) == ("n", "p:n")
        assert NameTemplate(Shouting("job:{id}")).fill({"id": 7}) == "job:7"

        @redlock.locked(Shouting("t:{id}"))
        async def job(id: int) -> list[list[bytes]]:
            return await masters.keys()

        with anyio.fail_after(HANG_GUARD):
            assert await job(1) == [[b"p:t:1"]] * len(masters)
