"""Key layout: hash tags, and auxiliary keys in the lock key's Redis Cluster slot."""

from __future__ import annotations

import itertools
import string

import pytest
from redis.crc import key_slot as redis_py_key_slot

from asyncredlock._keys import (
    _tag_for_slot,
    aux_key,
    has_hash_tag,
    holder_value,
    identity_of,
    lock_key,
    split_aux,
)


def crc16_xmodem(data: bytes) -> int:
    """CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as Redis Cluster uses."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: str) -> int:
    """The Redis Cluster slot of ``key``, written from the cluster specification."""
    data = key.encode()
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return crc16_xmodem(data) % 16384


class TestKeySlot:
    """The reference the slot tests below rely on is itself checked."""

    def test_crc16_check_value(self) -> None:
        assert crc16_xmodem(b"123456789") == 0x31C3

    @pytest.mark.parametrize(
        "key", ["foo", "{user1000}.following", "a{}b", "{}", "a}b", "x{y}z{w}", "ключ"]
    )
    def test_agrees_with_redis_py(self, key: str) -> None:
        assert key_slot(key) == redis_py_key_slot(key.encode())

    def test_known_slots(self) -> None:
        # Values from the Redis Cluster specification and CLUSTER KEYSLOT.
        assert key_slot("foo") == 12182
        assert key_slot("{user1000}.following") == key_slot("user1000")


class TestHasHashTag:
    @pytest.mark.parametrize(
        ("key", "tagged"),
        [
            ("{a}b", True),
            ("a{b}", True),
            ("x{y}z{w}", True),  # the first tag decides
            ("}{a}", True),  # a '}' before the first '{' does not matter
            ("a{}b", False),  # an empty tag: the whole key is hashed
            ("{}", False),
            ("{}{a}", False),  # only the first '{' counts, and its tag is empty
            ("a{b", False),  # no closing brace
            ("a}b", False),
            ("plain", False),
            ("", False),
        ],
    )
    def test_cases(self, key: str, tagged: bool) -> None:
        assert has_hash_tag(key) is tagged

    @pytest.mark.parametrize("key", ["{a}b", "x{y}z{w}", "}{a}", "a{bc}d"])
    def test_a_tagged_key_hashes_by_its_tag_only(self, key: str) -> None:
        # consistency of the cases above with the cluster's rule
        tag = key[key.index("{") + 1 : key.index("}", key.index("{"))]
        assert key_slot(key) == key_slot(tag)


class TestLockKey:
    def test_the_key_is_the_name_after_the_prefix(self) -> None:
        assert lock_key("", "orders:42") == "orders:42"
        assert lock_key("app:", "orders:42") == "app:orders:42"


class TestAuxKey:
    @pytest.mark.parametrize(
        ("key", "expected"),
        [
            ("orders:42", "{orders:42}:fence"),
            ("a{b", "{a{b}:fence"),
            ("{a}b", "{a}:4:{a}b:fence"),
            ("x{y}z{w}", "{y}:8:x{y}z{w}:fence"),
            ("a}b", "{a9j}:3:a}b:fence"),
        ],
    )
    def test_wraps_keys_without_brace_and_tags_and_measures_others(
        self, key: str, expected: str
    ) -> None:
        assert aux_key(key, "fence") == expected

    @pytest.mark.parametrize("key", ["orders:42", "a{b", "{a}b", "x{y}z{w}", "}{a}", "ключ"])
    @pytest.mark.parametrize("suffix", ["fence", "readers", "undo:0123abcd"])
    def test_same_slot_as_the_lock_key(self, key: str, suffix: str) -> None:
        assert key_slot(aux_key(key, suffix)) == key_slot(key)

    @pytest.mark.parametrize("key", ["a{}b", "{}", "a}b", "}", "{}{a}"])
    def test_same_slot_when_the_key_holds_a_closing_brace(self, key: str) -> None:
        assert key_slot(aux_key(key, "fence")) == key_slot(key)

    def test_same_slot_for_every_short_key_without_closing_brace(self) -> None:
        keys = [
            "".join(chars)
            for length in range(1, 5)
            for chars in itertools.product("{a:é", repeat=length)
        ]
        assert len(keys) == 340
        mismatched = [k for k in keys if key_slot(aux_key(k, "fence")) != key_slot(k)]
        assert mismatched == []

    def test_distinct_suffixes_give_distinct_keys(self) -> None:
        keys = {aux_key("orders:42", s) for s in ("fence", "readers", "queue")}
        assert len(keys) == 3
        assert "orders:42" not in keys


class TestHolderValue:
    def test_identity_then_128_random_bits(self) -> None:
        first, second = holder_value("web-3"), holder_value("web-3")
        assert first != second
        identity, _, random = first.rpartition(":")
        assert (identity, len(random), int(random, 16) >= 0) == ("web-3", 32, True)

    @pytest.mark.parametrize("identity", ["web-3", "host:4242", "a:b:c", "ü"])
    def test_the_identity_reads_back(self, identity: str) -> None:
        assert identity_of(holder_value(identity)) == identity

    @pytest.mark.parametrize(
        "value",
        [
            "0123456789abcdef0123456789abcdef",  # an older version's: random only
            ":0123456789abcdef0123456789abcdef",  # no identity before the colon
            "web:0123456789ABCDEF0123456789ABCDEF",  # not our hex
            "web:0123456789abcdef",  # too short
            "web:0123456789abcdef0123456789abcdeg",  # not hex
            "a1b2-c3d4",  # another client's
        ],
    )
    def test_other_values_have_no_identity(self, value: str) -> None:
        assert identity_of(value) is None


#: Keys that shared auxiliary keys, or were another's, in the layout before
#: ``{T}:<n>:K:``: a name and itself as a tag, a ``}`` name and its tagged wrap, a
#: name and a semaphore's name ending in ``:sem``.
TRICKY = ["a", "{a}", "a}b", "{a9j}:a}b", "{a9j}:3:a}b", "{x}", "x", "{x}:sem", "{}:fence"]
SUFFIXES = [
    "fence",
    "readers",
    "queue",
    "queue:expiry",
    "queue:terms",
    "released",
    "undo:host:1:" + "0" * 32,
    "sem:0",
    "sem:queue",
    "sem:undo:host:1:" + "0" * 32,
]


class TestNoSharedKeys:
    def test_distinct_lock_keys_never_share_an_auxiliary_key(self) -> None:
        keys = [key for key in TRICKY if split_aux(key) is None]
        made = [aux_key(key, suffix) for key in keys for suffix in SUFFIXES]
        assert len(set(made)) == len(made)
        assert set(made).isdisjoint(keys)

    @pytest.mark.parametrize("key", TRICKY)
    @pytest.mark.parametrize("suffix", SUFFIXES)
    def test_an_auxiliary_key_splits_back(self, key: str, suffix: str) -> None:
        if split_aux(key) is None:
            assert split_aux(aux_key(key, suffix)) == (key, suffix)

    def test_a_slots_auxiliary_keys_are_its_semaphores(self) -> None:
        for key in ("s", "{s}:jobs", "a}b"):
            assert aux_key(aux_key(key, "sem:0"), "fence") == aux_key(key, "sem:0:fence")

    @pytest.mark.parametrize("name", ["{a}:fence", "{a}:sem:0", "{a}:4:{a}b:queue", "{a}:undo:v"])
    def test_a_name_that_is_an_auxiliary_key_is_refused(self, name: str) -> None:
        with pytest.raises(ValueError, match="is reserved"):
            lock_key("", name)
        with pytest.raises(ValueError, match="is reserved"):
            lock_key("{a}", name[3:])  # the prefix counts: it is part of the key

    @pytest.mark.parametrize("name", ["{a}:cart", "{a}:fences", "{a}:1:{a}:queue", "a:fence"])
    def test_names_that_only_look_alike_are_lock_keys(self, name: str) -> None:
        assert lock_key("", name) == name

    def test_a_length_longer_than_any_key_is_no_auxiliary_key(self) -> None:
        """More digits than int() converts by default (4300): before, ValueError
        from int(), in lock_key() and in the CLI's list of every key."""
        key = "{a}:" + "1" * 5000 + ":x"
        assert split_aux(key) is None
        assert lock_key("", key) == key

    def test_nested_lookalikes_are_checked_without_recursion(self) -> None:
        """A name that nests the second shape hundreds of times (4 KB): before,
        RecursionError from split_aux and _aux_prefix calling each other."""
        key = "k}"
        for _ in range(600):
            key = "{a}:" + str(len(key)) + ":" + key + ":y"
        assert split_aux(key) is None
        assert lock_key("", key) == key
        assert split_aux(aux_key(key, "fence")) == (key, "fence")


class TestTagForSlot:
    def test_the_first_short_tag_in_order(self) -> None:
        """Against every tag of up to three characters tried in order (the rule
        the docs state), for a sample of slots (all 16384 have one)."""
        alphabet = (string.ascii_letters + string.digits).encode()
        first: dict[int, str] = {}
        level = [(b"", 0)]
        for _ in range(3):
            level = [
                (tag + bytes((char,)), _crc_step(crc, char))
                for tag, crc in level
                for char in alphabet
            ]
            for tag, crc in level:
                first.setdefault(crc % 16384, tag.decode())
        assert len(first) == 16384
        for slot in [*range(0, 16384, 97), 15546, 16383]:
            assert _tag_for_slot(slot) == first[slot]


def _crc_step(crc: int, byte: int) -> int:
    """`crc16_xmodem` one byte further."""
    crc ^= byte << 8
    for _ in range(8):
        crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        crc &= 0xFFFF
    return crc
