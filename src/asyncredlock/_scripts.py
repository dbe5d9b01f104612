"""The server-side scripts, loaded once from ``lua/`` and run by SHA1 on each master."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

__all__ = [
    "ACQUIRE",
    "ACQUIRE_RW",
    "ADOPT",
    "COMMIT",
    "DELETE",
    "DEQUEUE",
    "EXTEND",
    "EXTEND_READ",
    "FENCED_READ",
    "FENCED_WRITE",
    "INSPECT",
    "RELEASE",
    "RELEASE_READ",
    "SCRIPTS",
    "SEM_ACQUIRE",
    "SEM_DEQUEUE",
    "SEM_UNDO",
    "Script",
    "evalsha",
]


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script and its SHA1, as ``EVALSHA`` names it."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", digest)


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def _load(name: str, *, needs: tuple[str, ...] = ()) -> Script:
    """The script ``lua/NAME.lua``, with the helper files ``needs`` prepended."""
    return Script(name, "".join(_read(helper) for helper in needs) + _read(name))


ACQUIRE = _load("acquire", needs=("clock", "queue", "fence", "handed"))
ACQUIRE_RW = _load("acquire_rw", needs=("clock", "queue", "fence", "handed"))
DEQUEUE = _load("dequeue", needs=("clock", "queue"))
COMMIT = _load("commit", needs=("decimal",))
ADOPT = _load("adopt", needs=("decimal",))
RELEASE = _load("release", needs=("clock", "queue", "fence"))
RELEASE_READ = _load("release_read", needs=("clock", "queue"))
EXTEND = _load("extend")
EXTEND_READ = _load("extend_read", needs=("clock",))
INSPECT = _load("inspect", needs=("clock",))
DELETE = _load("delete", needs=("clock", "queue"))
FENCED_WRITE = _load("fenced_write", needs=("decimal",))
FENCED_READ = _load("fenced_read", needs=("decimal",))
SEM_ACQUIRE = _load("sem_acquire", needs=("clock", "queue"))
SEM_UNDO = _load("sem_undo")
SEM_DEQUEUE = _load("sem_dequeue", needs=("clock", "queue"))

#: The scripts run on the masters, loaded on every new connection before any call.
SCRIPTS: tuple[Script, ...] = (ACQUIRE, ACQUIRE_RW, DEQUEUE, COMMIT, RELEASE, RELEASE_READ)
SCRIPTS += (EXTEND, EXTEND_READ, INSPECT, DELETE, SEM_ACQUIRE, SEM_UNDO, SEM_DEQUEUE, ADOPT)


async def evalsha(client: Any, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run ``script`` on ``client`` by its SHA1, sending its source once if not cached."""
    try:
        return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    except Exception as exc:
        if not _no_script(exc):
            raise
        # EVAL also caches the script, so the next EVALSHA finds it.
        return await client.execute_command("EVAL", script.source, len(keys), *keys, *args)


def _no_script(exc: Exception) -> bool:
    """A NOSCRIPT reply: redis-py's `NoScriptError`, or valkey-py's, a class of its own
    (the fork's exceptions do not derive from redis-py's) of the same name."""
    return isinstance(exc, NoScriptError) or type(exc).__name__ == "NoScriptError"
