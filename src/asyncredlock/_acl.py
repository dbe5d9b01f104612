"""The ACL rules a Redis/Valkey user needs to run asyncredlock's locks, and no more."""

from __future__ import annotations

from collections.abc import Iterable

from ._config import check_no_nul, check_text, plain_str
from ._keys import aux_key, glob_escape
from ._wakeup import INBOX_PREFIX

__all__ = ["acl_rules"]

#: Commands sent on asyncredlock's own connections (the scripts, preloaded and run by
#: SHA1, or sent whole when a master lost its script cache; the wake-up
#: subscriptions, and their PING when quiet). AUTH (and HELLO) need no permission.
_DIRECT = ("evalsha", "eval", "script|load", "subscribe", "unsubscribe", "ping")

#: Commands the Lua scripts in ``lua/`` call (ACLs check these too).
_IN_SCRIPTS = (
    "del",
    "exists",
    "get",
    "hdel",
    "hget",
    "hset",
    "incrby",
    "pexpire",
    "pexpireat",
    "pttl",
    "publish",
    "set",
    "time",
    "zadd",
    "zrange",
    "zrangebyscore",
    "zrank",
    "zrem",
    "zremrangebyscore",
    "zscore",
)

#: The channel on which a lock's release is announced (see `asyncredlock._keys.channel`).
_RELEASED = "released"

_GLOB = frozenset("*?[]\\")


def acl_rules(keys: str = "*", *, prefix: str = "") -> list[str]:
    """The ACL rules a user needs for asyncredlock's locks on the names ``keys``.

    Give them to ``ACL SETUSER`` after the user's name, ``on`` and its password::

        ACL SETUSER locker on >s3cret <rules...>

    They are: the commands asyncredlock sends and those its server-side scripts
    call (``+evalsha``, ``+set``, ``+publish``...); the key patterns of the lock
    keys and of every auxiliary key kept beside them (fence counter, readers,
    queue, undo markers: ``{K}:...``, or ``{T}:<n>:K:...`` for a key with a ``}``);
    and the pub/sub channels (each lock's ``{K}:released``, each semaphore slot's
    ``{K}:sem:<i>:released``, and the clients' inboxes ``asyncredlock:inbox:*``).
    The rules only add permissions: give them to a new user (or start with
    ``reset``). SELECT is not included: add
    ``+select`` when a master URL names a database other than 0.

    Args:
        keys: A glob-style pattern (as ``ACL SETUSER`` takes them) that every
            lock name used matches: ``"orders:*"``, or ``"*"`` for any name.
        prefix: The ``AsyncRedlock(prefix=...)`` in use, taken literally (its
            glob characters are escaped).

    Returns:
        The rule tokens, commands first, then key patterns (``~``), then
        channel patterns (``&``).

    Raises:
        TypeError: ``keys`` or ``prefix`` is not a ``str``.
        ValueError: ``keys`` is empty or holds whitespace (a rule is one token), or
            either does not encode as UTF-8, or ``prefix`` holds a NUL.
    """
    for what, text in (("keys", keys), ("prefix", prefix)):
        if not isinstance(text, str):
            raise TypeError(f"{what} must be a str, not {type(text).__name__}")
        check_text(what, text)
    keys, prefix = plain_str(keys), check_no_nul("prefix", plain_str(prefix))
    if not keys:
        raise ValueError("keys must be a non-empty glob pattern")
    if any(char.isspace() for char in prefix + keys):
        raise ValueError(f"keys and prefix must hold no whitespace: {prefix + keys!r}")
    pattern = glob_escape(prefix) + keys
    rules = [f"+{command}" for command in (*_DIRECT, *_IN_SCRIPTS)]
    if pattern == "*":  # any name: one pattern covers every key and channel shape
        rules += ["~*", f"&*:{_RELEASED}"]
    else:
        bases = _aux_bases(prefix, keys)
        shapes = [pattern, *(base + "*" for base in bases)]
        if pattern.endswith("*"):  # `~P` covers `~P:*`
            shapes = [shape for shape in shapes if shape != pattern + ":*"]
        rules += _unique(f"~{shape}" for shape in shapes)
        rules += _unique(f"&{base}{_RELEASED}" for base in bases)
        # a semaphore's slots announce their release each on its own channel
        rules += _unique(f"&{base}sem:*:{_RELEASED}" for base in bases)
    rules.append(f"&{glob_escape(INBOX_PREFIX)}*")
    return rules


def _aux_bases(prefix: str, keys: str) -> list[str]:
    """Patterns for ``aux_key(K, "")`` of every lock key ``K`` that ``prefix + keys``
    matches (see `asyncredlock._keys.aux_key`): exactly that for one name; for a glob
    ``P``, ``{P}:`` (a name without ``}``) and, when a name could hold a brace,
    ``{*}:*:P:`` (``{T}:<n>:K:``, a name with one)."""
    if not any(char in _GLOB for char in keys):
        return [glob_escape(aux_key(prefix + keys, ""))]
    pattern = glob_escape(prefix) + keys
    bases = ["{" + pattern + "}:"]
    if any(char in pattern for char in "*?[{}"):
        bases.append("{*}:*:" + pattern + ":")
    return bases


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
