"""Key layout: the lock key is the resource name; auxiliary keys share its cluster slot."""

from __future__ import annotations

__all__ = ["aux_key", "has_hash_tag", "lock_key"]


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
    ``K``), else ``K:suffix`` (the tag already decides the slot).
    """
    if has_hash_tag(key):
        return f"{key}:{suffix}"
    return "{" + key + "}:" + suffix
