"""The server-side scripts, loaded once from ``lua/`` and run by SHA1 on each master."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib import resources

__all__ = ["ACQUIRE", "COMMIT", "DELETE", "EXTEND", "INSPECT", "RELEASE", "Script"]


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script and its SHA1, as ``EVALSHA`` names it."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", digest)


def _load(name: str) -> Script:
    text = resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")
    return Script(name, text)


ACQUIRE = _load("acquire")
COMMIT = _load("commit")
RELEASE = _load("release")
EXTEND = _load("extend")
INSPECT = _load("inspect")
DELETE = _load("delete")
