"""FencedStore on a real server: exact token comparison in Lua, tombstones, bad input."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock
from asyncredlock._scripts import FENCED_WRITE
from asyncredlock.fencing import FencedStore, FencedValue, StaleTokenError
from asyncredlock.testing import ServerGroup

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(servers: ServerGroup) -> AsyncIterator[Redis]:
    """A direct client to the first (flushed) server of the session group."""
    direct = Redis.from_url(servers.urls[0])
    yield direct
    await direct.aclose()


@pytest.fixture
def store(client: Redis) -> FencedStore:
    return FencedStore(client)


class TestFencedReads:
    """``read(key, token)``: refused when a newer token has touched the record; else
    the token becomes the fence, so that an older holder can no longer write."""

    async def test_the_lost_update_it_prevents(self, store: FencedStore) -> None:
        """A (token 1) and B (token 2) both read, then A writes: without fenced reads
        A's write would be taken and B's would overwrite the same count."""
        await store.write("counter", 5, 1)
        a = await store.read("counter", 1)
        b = await store.read("counter", 2)
        assert a == b == FencedValue(b"5", 1)  # the writer's token, not the reader's
        with pytest.raises(StaleTokenError) as caught:
            await store.write("counter", 6, 1)
        assert (caught.value.token, caught.value.newest) == (1, 2)
        await store.write("counter", 6, 2)
        assert await store.read("counter") == FencedValue(b"6", 2)

    async def test_an_older_reader_is_refused_and_changes_nothing(
        self, store: FencedStore, client: Redis
    ) -> None:
        await store.write("k", "v", 9)
        before = await client.hgetall("k")
        with pytest.raises(StaleTokenError) as caught:
            await store.read("k", 8)
        assert (caught.value.token, caught.value.newest) == (8, 9)
        assert await client.hgetall("k") == before

    async def test_the_same_token_reads_and_writes_again(self, store: FencedStore) -> None:
        await store.write("k", "a", 4)
        assert await store.read("k", 4) == FencedValue(b"a", 4)
        await store.write("k", "b", 4)
        assert await store.read("k", 4) == FencedValue(b"b", 4)

    async def test_a_fenced_read_of_a_missing_record_fences_it(
        self, store: FencedStore, client: Redis
    ) -> None:
        assert await store.read("new", 3) is None
        assert await client.hgetall("new") == {b"fence": b"3"}
        with pytest.raises(StaleTokenError):
            await store.write("new", "late", 2)
        assert await store.read("new") is None

    async def test_records_written_before_the_writer_field_read_as_before(
        self, store: FencedStore, client: Redis
    ) -> None:
        await client.hset("old", mapping={"value": "v", "fence": "12"})
        assert await store.read("old") == FencedValue(b"v", 12)
        assert await store.read("old", 13) == FencedValue(b"v", 12)
        assert await client.hget("old", "fence") == b"13"

    @pytest.mark.parametrize(
        ("token", "error"), [(-1, ValueError), (2**63, ValueError), ("7", TypeError)]
    )
    async def test_a_bad_token_is_refused_before_any_io(
        self, store: FencedStore, client: Redis, token: object, error: type[Exception]
    ) -> None:
        with pytest.raises(error):
            await store.read("k", token)  # type: ignore[arg-type]
        assert await client.exists("k") == 0


class TestWrites:
    """Fenced writes: values stored with their token, newer or equal tokens accepted,
    older ones refused."""

    async def test_round_trip(self, store: FencedStore, client: Redis) -> None:
        await store.write("orders:42", b"\x00paid\xff", 7)
        assert await store.read("orders:42") == FencedValue(b"\x00paid\xff", 7)
        assert await client.hgetall("orders:42") == {
            b"value": b"\x00paid\xff",
            b"fence": b"7",
            b"writer": b"7",
        }

    @pytest.mark.parametrize(
        ("value", "stored"),
        [("päid", "päid".encode()), (12, b"12"), (1.5, b"1.5"), (b"", b"")],
    )
    async def test_value_types(self, store: FencedStore, value: object, stored: bytes) -> None:
        await store.write("k", value, 1)  # type: ignore[arg-type]
        assert await store.read("k") == FencedValue(stored, 1)

    async def test_read_of_a_missing_key(self, store: FencedStore) -> None:
        assert await store.read("nothing") is None

    async def test_newer_and_equal_tokens_are_accepted(self, store: FencedStore) -> None:
        await store.write("k", "a", 5)
        await store.write("k", "b", 5)
        assert await store.read("k") == FencedValue(b"b", 5)
        await store.write("k", "c", 6)
        assert await store.read("k") == FencedValue(b"c", 6)

    async def test_older_token_is_refused(self, store: FencedStore) -> None:
        await store.write("orders:42", "paid", 23)
        with pytest.raises(StaleTokenError) as caught:
            await store.write("orders:42", "late", 17)
        assert (caught.value.token, caught.value.newest, caught.value.resource) == (
            17,
            23,
            "orders:42",
        )
        assert str(caught.value) == "stale fencing token 17 for 'orders:42': the guard has seen 23"
        assert await store.read("orders:42") == FencedValue(b"paid", 23)

    @pytest.mark.parametrize(
        ("older", "newer"),
        [
            (9, 10),  # "9" > "10" as strings: the length decides
            (99, 100),
            (2**53, 2**53 + 1),  # equal as doubles
            (2**60 + 1, 2**60 + 2),
            (2**63 - 2, 2**63 - 1),
        ],
    )
    async def test_tokens_compare_exactly(self, store: FencedStore, older: int, newer: int) -> None:
        await store.write("k", "old", older)
        await store.write("k", "new", newer)
        with pytest.raises(StaleTokenError) as caught:
            await store.write("k", "stale", older)
        assert (caught.value.token, caught.value.newest) == (older, newer)
        assert await store.read("k") == FencedValue(b"new", newer)


class TestDeletes:
    """Fenced deletes leave a tombstone that keeps refusing older tokens."""

    async def test_delete_keeps_a_tombstone(self, store: FencedStore, client: Redis) -> None:
        await store.write("k", "v", 3)
        await store.delete("k", 4)
        assert await store.read("k") is None
        assert await client.hgetall("k") == {b"fence": b"4"}
        with pytest.raises(StaleTokenError) as caught:
            await store.write("k", "stale", 3)
        assert (caught.value.token, caught.value.newest) == (3, 4)
        assert await store.read("k") is None
        await store.write("k", "again", 5)
        assert await store.read("k") == FencedValue(b"again", 5)

    async def test_stale_delete_is_refused(self, store: FencedStore) -> None:
        await store.write("k", "v", 8)
        with pytest.raises(StaleTokenError) as caught:
            await store.delete("k", 7)
        assert (caught.value.token, caught.value.newest) == (7, 8)
        assert await store.read("k") == FencedValue(b"v", 8)

    async def test_delete_of_a_missing_key_fences_it(self, store: FencedStore) -> None:
        await store.delete("k", 10)
        with pytest.raises(StaleTokenError):
            await store.write("k", "stale", 9)
        assert await store.read("k") is None


class TestClients:
    """The store with a prefix, an uncached script, a client decoding its replies."""

    async def test_prefix(self, client: Redis) -> None:
        store = FencedStore(client, prefix="app:")
        await store.write("k", "v", 1)
        assert await client.keys("*") == [b"app:k"]
        assert await store.read("k") == FencedValue(b"v", 1)
        assert await FencedStore(client).read("k") is None
        with pytest.raises(StaleTokenError) as caught:  # named by its full key
            await store.write("k", "late", 0)
        assert caught.value.resource == "app:k"
        assert str(caught.value) == "stale fencing token 0 for 'app:k': the guard has seen 1"

    async def test_script_not_cached(self, store: FencedStore, client: Redis) -> None:
        """After SCRIPT FLUSH the script is sent again (EVAL), and cached for EVALSHA."""
        await store.write("k", "a", 1)
        await client.script_flush()
        await store.write("k", "b", 2)
        assert await store.read("k") == FencedValue(b"b", 2)
        assert await client.script_exists(FENCED_WRITE.sha) == [True]

    async def test_client_decoding_responses(self, servers: ServerGroup) -> None:
        client = Redis.from_url(servers.urls[0], decode_responses=True)
        try:
            store = FencedStore(client)
            await store.write("k", "päid", 2**60)
            assert await store.read("k") == FencedValue("päid".encode(), 2**60)
            with pytest.raises(StaleTokenError) as caught:
                await store.write("k", "late", 1)
            assert caught.value.newest == 2**60
        finally:
            await client.aclose()

    async def test_a_record_at_a_lock_key_says_so(
        self, servers: ServerGroup, client: Redis
    ) -> None:
        """A store on a lock master whose prefix makes record "42" the key of the held
        lock "orders:42": each call is a ``ValueError`` naming the key and why (the
        server's bare ``WRONGTYPE`` before), and the lock's key is left as it was."""
        store = FencedStore(client, prefix="orders:")
        async with AsyncRedlock(servers.urls) as redlock, redlock.lock("orders:42") as lease:
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: store.write("42", "paid", 1),
                lambda: store.read("42"),
                lambda: store.read("42", 1),
                lambda: store.delete("42", 1),
            ]
            for call in calls:
                with pytest.raises(ValueError, match=r"'orders:42' holds another type") as said:
                    await call()
                assert "a lock's key?" in str(said.value)
            assert await client.get("orders:42") == lease.value.encode()


BAD_TOKENS = [
    pytest.param(None, TypeError, "fencing=False", id="None"),
    pytest.param(True, TypeError, "not bool", id="bool"),
    pytest.param(1.0, TypeError, "not float", id="float"),
    pytest.param("1", TypeError, "not str", id="str"),
    pytest.param(-1, ValueError, ">= 0", id="negative"),
    pytest.param(2**63, ValueError, r"at most 2\*\*63 - 1", id="over-int64"),
]


class TestBadInput:
    """Each refused call raises a typed error before any I/O: nothing is written."""

    @pytest.fixture(autouse=True)
    async def nothing_written(self, client: Redis) -> AsyncIterator[None]:
        yield
        assert await client.keys("*") == []

    @pytest.mark.parametrize(("token", "error", "match"), BAD_TOKENS)
    async def test_write_token(
        self, store: FencedStore, token: object, error: type[Exception], match: str
    ) -> None:
        with pytest.raises(error, match=match):
            await store.write("k", "v", token)  # type: ignore[arg-type]

    @pytest.mark.parametrize(("token", "error", "match"), BAD_TOKENS)
    async def test_delete_token(
        self, store: FencedStore, token: object, error: type[Exception], match: str
    ) -> None:
        with pytest.raises(error, match=match):
            await store.delete("k", token)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("key", "error", "match"),
        [
            pytest.param(b"k", TypeError, "key must be a str", id="bytes"),
            pytest.param(42, TypeError, "key must be a str", id="int"),
            pytest.param(None, TypeError, "key must be a str", id="None"),
            pytest.param("", ValueError, "key must not be empty", id="empty"),
            pytest.param("k\ud800", ValueError, "key cannot be encoded as UTF-8", id="surrogate"),
        ],
    )
    @pytest.mark.parametrize("operation", ["write", "read", "delete"])
    async def test_key(
        self,
        store: FencedStore,
        operation: str,
        key: object,
        error: type[Exception],
        match: str,
    ) -> None:
        with pytest.raises(error, match=match):
            if operation == "write":
                await store.write(key, "v", 1)  # type: ignore[arg-type]
            elif operation == "read":
                await store.read(key)  # type: ignore[arg-type]
            else:
                await store.delete(key, 1)  # type: ignore[arg-type]

    @pytest.mark.parametrize("value", [None, True, ["v"], bytearray(b"v"), {"v": 1}])
    async def test_value_type(self, store: FencedStore, value: object) -> None:
        with pytest.raises(TypeError, match="value must be bytes, str, int or float"):
            await store.write("k", value, 1)  # type: ignore[arg-type]

    async def test_value_not_utf8(self, store: FencedStore) -> None:
        with pytest.raises(ValueError, match="value cannot be encoded as UTF-8"):
            await store.write("k", "v\udc80", 1)

    async def test_refused_write_of_existing_record_changes_nothing(
        self, store: FencedStore, client: Redis
    ) -> None:
        await store.write("k", "v", 5)
        with pytest.raises(TypeError):
            await store.write("k", None, 6)  # type: ignore[arg-type]
        assert await store.read("k") == FencedValue(b"v", 5)
        await client.delete("k")  # the autouse check wants no key left

    async def test_client(self) -> None:
        with pytest.raises(TypeError, match=r"redis\.asyncio Redis or RedisCluster"):
            FencedStore("redis://localhost")  # type: ignore[arg-type]

    async def test_prefix(self, client: Redis) -> None:
        with pytest.raises(TypeError, match="prefix must be a str"):
            FencedStore(client, prefix=b"app:")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="prefix cannot be encoded as UTF-8"):
            FencedStore(client, prefix="app\ud800:")
