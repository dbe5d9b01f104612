"""Key layout: the lock key is the resource name; auxiliary keys share its cluster slot.
And what a lock key holds: a holder's identity and a random part."""

from __future__ import annotations

import functools
import itertools
import secrets
import string
from dataclasses import dataclass

__all__ = [
    "Resources",
    "aux_key",
    "channel",
    "glob_escape",
    "has_hash_tag",
    "holder_value",
    "identity_of",
    "key_slot",
    "lock_key",
    "queue_keys",
    "readers_key",
    "terms_key",
    "undo_key",
]


@dataclass(frozen=True, slots=True)
class Resources:
    """What one lock takes: resource names and their lock keys, in order."""

    names: tuple[str, ...]
    keys: tuple[str, ...]

    @property
    def label(self) -> str:
        """The names for messages: ``'a'``, or ``'a, b, c'``."""
        return ", ".join(self.names)

    @property
    def slot(self) -> str:
        """One string per set of keys: how tasks of one process queue for it."""
        return "\0".join(self.keys)


_SLOTS = 16384


def has_hash_tag(key: str) -> bool:
    """Whether Redis Cluster would hash ``key`` by a ``{tag}`` inside it."""
    start = key.find("{")
    if start < 0:
        return False
    end = key.find("}", start + 1)
    return end > start + 1


def lock_key(prefix: str, name: str) -> str:
    """The key that holds the lock value: the name, after an optional prefix."""
    return prefix + name


def aux_key(key: str, suffix: str) -> str:
    """An auxiliary key in the same cluster slot as ``key``.

    ``{K}:suffix`` when ``K`` has no hash tag (the slot of ``{K}`` is the slot of
    ``K``), else ``K:suffix`` (the tag already decides the slot). A key without a
    tag that holds a ``}`` cannot be wrapped (its own ``}`` would end the tag
    early); it gets a short tag chosen to hash to its slot.
    """
    return _aux_prefix(key) + suffix


@functools.lru_cache(maxsize=4096)
def _aux_prefix(key: str) -> str:
    """``aux_key(key, suffix)`` is this plus ``suffix`` (worked out once per key)."""
    if has_hash_tag(key):
        return f"{key}:"
    if "}" in key:
        return "{" + _tag_for_slot(key_slot(key)) + "}:" + key + ":"
    return "{" + key + "}:"


@functools.lru_cache(maxsize=4096)
def key_slot(key: str) -> int:
    """The Redis Cluster slot of ``key`` (CRC16-XMODEM of its hash tag or whole)."""
    data = key.encode()
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return _crc16(data) % _SLOTS


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


@functools.lru_cache(maxsize=256)
def _tag_for_slot(slot: int) -> str:
    """The first short alphanumeric string that hashes to ``slot``."""
    alphabet = string.ascii_letters + string.digits
    for length in itertools.count(1):
        for chars in itertools.product(alphabet, repeat=length):
            tag = "".join(chars)
            if _crc16(tag.encode()) % _SLOTS == slot:
                return tag
    raise AssertionError("unreachable")  # pragma: no cover


def channel(key: str) -> str:
    """The pub/sub channel on which a release of ``key`` is announced."""
    return aux_key(key, "released")


def readers_key(key: str) -> str:
    """The sorted set of a read-write lock's readers (value -> when it lapses)."""
    return aux_key(key, "readers")


def queue_keys(key: str) -> tuple[str, str]:
    """The queue of a fair or read-write lock, and its entries' expiries."""
    return aux_key(key, "queue"), aux_key(key, "queue:expiry")


def terms_key(key: str) -> str:
    """The hand-over terms of a lock's queued waiters (see ``release.lua``)."""
    return aux_key(key, "queue:terms")


def undo_key(key: str, value: str) -> str:
    """The marker that refuses a late ``SET`` of the attempt holding ``value``."""
    return aux_key(key, f"undo:{value}")


_RANDOM_HEX = 32  # a lock value's random part: 128 bits, as lowercase hex


def holder_value(identity: str) -> str:
    """A new lock value: ``"<identity>:<128 random bits in hex>"``.

    Unique by its random part; the identity before it is for people reading the
    masters. Other Redlock clients see an opaque string, as they should.
    """
    return f"{identity}:{secrets.token_hex(_RANDOM_HEX // 2)}"


def identity_of(value: str) -> str | None:
    """The identity in a lock value written by `holder_value`; ``None`` for any
    other value (an older version's, or another client's)."""
    identity, colon, random = value.rpartition(":")
    if not (identity and colon and len(random) == _RANDOM_HEX):
        return None
    if not set(random) <= _LOWER_HEX:
        return None
    return identity


_LOWER_HEX = frozenset(string.hexdigits.lower())


def glob_escape(text: str) -> str:
    """``text`` as a Redis glob pattern (``KEYS``, ``SCAN MATCH``, ACL ``~``/``&``)
    that matches only itself."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)
