"""Key layout: the lock key is the resource name; auxiliary keys share its cluster slot.
And what a lock key holds: a holder's identity and a random part."""

from __future__ import annotations

import functools
import secrets
import string
from dataclasses import dataclass

__all__ = [
    "AUX_WORDS",
    "Resources",
    "aux_key",
    "channel",
    "glob_escape",
    "has_hash_tag",
    "hash_tag",
    "holder_value",
    "identity_of",
    "key_slot",
    "lock_key",
    "queue_keys",
    "readers_key",
    "split_aux",
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
    return hash_tag(key) is not None


def lock_key(prefix: str, name: str) -> str:
    """The key that holds the lock value: the name, after an optional prefix.

    Raises:
        ValueError: The key is one of the library's auxiliary keys (`split_aux`):
            as a lock it would share that key with another lock's fence counter,
            queue, readers or semaphore slot.
    """
    key = prefix + name
    if key[:1] == "{" and (aux := split_aux(key)) is not None:
        raise ValueError(
            f"the key {key!r} is reserved: it is the {aux[1]!r} key that asyncredlock"
            f" keeps beside the lock key {aux[0]!r} (see the key layout in the docs)"
        )
    return key


#: The first word of the suffix of every auxiliary key (see `aux_key`); a lock key
#: shaped like such a key is refused (`lock_key`).
AUX_WORDS = frozenset({"fence", "readers", "released", "queue", "undo", "sem"})


def aux_key(key: str, suffix: str) -> str:
    """An auxiliary key of ``key``, in the same cluster slot, never another lock's key.

    ``{K}:suffix`` when ``K`` holds no ``}`` (so no hash tag: the slot of ``{K}`` is
    the slot of ``K``); else ``{T}:<n>:K:suffix``, with ``n`` the length of ``K``
    and ``T`` its hash tag, or, for a ``K`` with a ``}`` but no hash tag, a short tag
    chosen to hash to its slot. The two shapes differ in what follows the tag (a
    suffix's first letter, or a digit) and the length bounds ``K``, so no two keys
    share an auxiliary key. The auxiliary keys of an auxiliary key (a semaphore's
    slot ``{K}:sem:<i>``, which is locked as a key) are those of ``K``, their
    suffixes joined: ``{K}:sem:<i>:fence``.
    """
    return _aux_prefix(key) + suffix


@functools.lru_cache(maxsize=4096)
def _aux_prefix(key: str) -> str:
    """``aux_key(key, suffix)`` is this plus ``suffix`` (worked out once per key)."""
    if "}" not in key:
        return "{" + key + "}:"
    if (aux := split_aux(key)) is not None:
        return _aux_prefix(aux[0]) + aux[1] + ":"
    tag = hash_tag(key) or _tag_for_slot(key_slot(key))
    return f"{{{tag}}}:{len(key)}:{key}:"


def split_aux(key: str) -> tuple[str, str] | None:
    """``(K, suffix)`` when ``key`` is ``aux_key(K, suffix)`` for one of the
    library's suffixes (its first word in `AUX_WORDS`), else ``None``."""
    end = key.find("}")
    if key[:1] != "{" or end < 2 or key[end + 1 : end + 2] != ":":
        return None
    rest = key[end + 2 :]
    digits = len(rest) - len(rest.lstrip(_DIGITS))
    if not digits:  # ``{K}:suffix``
        base, suffix = key[1:end], rest
    elif digits > _MAX_DIGITS:  # longer than any key can be
        return None
    else:  # ``{T}:<n>:K:suffix``
        start = digits + 1
        stop = start + int(rest[:digits])
        base, suffix = rest[start:stop], rest[stop + 1 :]
        if rest[digits:start] != ":" or rest[stop : stop + 1] != ":" or "}" not in base:
            return None
        # (not _aux_prefix(base): a base shaped like an aux key would recurse)
        tag = hash_tag(base) or _tag_for_slot(key_slot(base))
        if key[: len(key) - len(suffix)] != f"{{{tag}}}:{len(base)}:{base}:":
            return None
    return (base, suffix) if suffix.split(":", 1)[0] in AUX_WORDS else None


_DIGITS = "0123456789"
_MAX_DIGITS = 10  # of a key's length: a Redis key is at most 512 MB


def hash_tag(key: str) -> str | None:
    """The ``{tag}`` by which Redis Cluster hashes ``key``, or ``None``."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    return key[start + 1 : end] if end > start + 1 else None


@functools.lru_cache(maxsize=4096)
def key_slot(key: str) -> int:
    """The Redis Cluster slot of ``key`` (CRC16-XMODEM of its hash tag or whole)."""
    tag = hash_tag(key)
    return _crc16((key if tag is None else tag).encode()) % _SLOTS


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC_TABLE = _crc_table()


def _crc16(data: bytes, crc: int = 0) -> int:
    """CRC16-XMODEM of ``data``, continuing from ``crc``."""
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC_TABLE[(crc >> 8) ^ byte]
    return crc


_TAG_CHARS = (string.ascii_letters + string.digits).encode()


@functools.lru_cache(maxsize=_SLOTS)
def _tag_for_slot(slot: int) -> str:
    """The first short alphanumeric string that hashes to ``slot``: shortest first,
    then in the order of `_TAG_CHARS` (as ``itertools.product`` would list them).

    Three characters are found without trying them in turn: the last step of the
    CRC is inverted (`_before_last`), so each slot costs a few hundred lookups.
    """
    tags = _short_tags()
    for tag, crc in tags.items():  # one and two characters, in order
        if crc % _SLOTS == slot:
            return tag
    by_crc = {crc: pair for pair, crc in tags.items() if len(pair) == 2}
    found = [
        (pair + chr(char), _TAG_CHARS.index(char))
        for crc in range(slot, 1 << 16, _SLOTS)
        for char in _TAG_CHARS
        for before in _before_last(crc, char)
        if (pair := by_crc.get(before)) is not None
    ]  # never empty: every slot has a tag of at most three characters (checked)
    return min(found, key=lambda each: (_order(each[0][:2]), each[1]))[0]


def _order(tag: str) -> tuple[int, ...]:
    return tuple(_TAG_CHARS.index(ord(char)) for char in tag)


@functools.cache
def _short_tags() -> dict[str, int]:
    """Every tag of one or two of `_TAG_CHARS`, in order, with its CRC."""
    tags = {chr(char): _crc16(bytes((char,))) for char in _TAG_CHARS}
    tags.update(
        {
            first + chr(char): _crc16(bytes((char,)), crc)
            for first, crc in list(tags.items())
            for char in _TAG_CHARS
        }
    )
    return tags


def _before_last(crc: int, char: int) -> list[int]:
    """The CRCs that one more byte ``char`` turns into ``crc``: the table entry used
    has ``crc``'s low byte, and it gives the earlier CRC's bytes."""
    return [
        ((index ^ char) << 8) | ((crc >> 8) ^ (_CRC_TABLE[index] >> 8))
        for index in _BY_LOW_BYTE[crc & 0xFF]
    ]


#: The indexes of the CRC table's entries, by the entry's low byte.
_BY_LOW_BYTE: tuple[tuple[int, ...], ...] = tuple(
    tuple(index for index, entry in enumerate(_CRC_TABLE) if entry & 0xFF == low)
    for low in range(256)
)


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
