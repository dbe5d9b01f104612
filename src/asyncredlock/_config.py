"""Settings, their defaults with the reason for each value, and validation at the boundary."""

from __future__ import annotations

import enum
import math
import os
import socket
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from ._ending import is_async_callable
from ._keys import Resources

__all__ = [
    "DEFAULTS",
    "MAX_BUSY_POLL",
    "MAX_NAMES",
    "MAX_SECONDS",
    "MIN_TTL",
    "LockKwargs",
    "LockOptions",
    "LockSpec",
    "Role",
    "Settings",
    "check_busy_poll",
    "check_identity",
    "check_name",
    "check_names",
    "check_seconds",
    "check_text",
    "check_ttl",
    "default_identity",
    "plain_str",
    "warn_max_connections",
]


#: The longest duration any setting takes, in seconds (about 31.7 years): far below
#: what the servers accept for ``PX`` (a 64-bit count of milliseconds added to their
#: clock) and what their Lua numbers hold exactly (2**53), so no value that passes
#: here can fail there.
MAX_SECONDS = 1e9

#: The most resources one lock takes (as a semaphore's slots): each name is a key (and a
#: fence counter), sent to every master in each attempt.
MAX_NAMES = 1024

#: The longest ``busy_poll``, in seconds: the event loop runs nothing else meanwhile.
MAX_BUSY_POLL = 0.001

#: The shortest ``ttl`` (and ``max_hold``, which bounds it), in seconds: a lock's
#: validity is its TTL less the clock drift allowance (2 ms + ``drift_factor`` x TTL),
#: nothing for a TTL of about 2 ms: such a lock could never be taken, nor extended.
MIN_TTL = 0.01


def check_seconds(
    name: str, value: object, *, allow_zero: bool = False, allow_inf: bool = False
) -> float:
    """Validate a duration in seconds and return it as a float.

    Raises:
        TypeError: ``value`` is not an int or float (``bool`` is refused too).
        ValueError: ``value`` is NaN, negative, zero where that is refused,
            infinite where that is refused, or finite and over `MAX_SECONDS`.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        raise ValueError(_too_long(name, value)) from None
    if math.isnan(seconds) or (math.isinf(seconds) and not (allow_inf and seconds > 0)):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value!r}")
    if MAX_SECONDS < seconds < math.inf:
        raise ValueError(_too_long(name, value))
    return seconds + 0.0  # -0.0 becomes 0.0


def check_ttl(name: str, value: object, *, allow_inf: bool = False) -> float:
    """Validate a ``ttl`` (or ``max_hold``): seconds, at least `MIN_TTL`.

    Raises:
        TypeError, ValueError: as `check_seconds`; ValueError also under `MIN_TTL`.
    """
    seconds = check_seconds(name, value, allow_inf=allow_inf)
    if seconds < MIN_TTL:
        raise ValueError(
            f"{name} must be at least {MIN_TTL:g} s (the clock drift allowance would leave"
            f" a lock no validity), got {value!r}"
        )
    return seconds


def check_busy_poll(value: object) -> float:
    """Validate ``busy_poll``: seconds, from 0 (never) to `MAX_BUSY_POLL`."""
    seconds = check_seconds("busy_poll", value, allow_zero=True)
    if seconds > MAX_BUSY_POLL:
        raise ValueError(
            f"busy_poll must be at most {MAX_BUSY_POLL:g} seconds (the event loop runs"
            f" nothing else while it polls), got {value!r}"
        )
    return seconds


def _too_long(name: str, value: object) -> str:
    return f"{name} must be at most {MAX_SECONDS:g} seconds (about 31 years), got {value!r}"


def check_text(what: str, text: str) -> str:
    """Refuse text that cannot be sent to the servers (a lone surrogate, as in
    ``"k\\ud800"``, has no UTF-8 encoding).

    Raises:
        ValueError: ``text`` cannot be encoded as UTF-8.
    """
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} cannot be encoded as UTF-8 ({exc.reason} at {exc.start}): {text!r}"
        ) from None
    return text


def plain_str(text: str) -> str:
    """``text`` as a plain ``str``: a subclass's own equality, hash, ``__str__`` or
    ``+`` would make a name stand for another resource's key (or two names for one)
    where specs are kept by name. ``str.__str__`` copies the characters whatever the
    subclass overrides."""
    return str.__str__(text)


def check_name(name: object) -> str:
    """Validate a resource name, and return it as a plain ``str`` (`plain_str`).

    Raises:
        TypeError: ``name`` is not a ``str``.
        ValueError: ``name`` is empty, holds a NUL, or cannot be encoded as UTF-8.
    """
    if not isinstance(name, str):
        raise TypeError(f"a lock name must be a str, not {type(name).__name__}")
    text = plain_str(name)
    if not text:
        raise ValueError("a lock name must not be empty")
    return check_text("a lock name", check_no_nul("a lock name", text))


def check_no_nul(what: str, text: str) -> str:
    """Refuse a NUL in a name or the prefix: the keys of a lock on several resources
    are joined by one (its slot in the process, see ``Resources.slot``), so
    ``"a\\0b"`` would share that slot with the lock on ``["a", "b"]``.

    Raises:
        ValueError: ``text`` holds a NUL character.
    """
    if "\0" in text:
        raise ValueError(f"{what} must not contain a NUL character ('\\0'): {text!r}")
    return text


IDENTITY_MAX = 128  # characters: it is written into every lock key's value


def default_identity() -> str:
    """``"<hostname>:<pid>"``: who holds a lock, for an operator reading the masters
    (the host name cut to fit `IDENTITY_MAX` characters in all)."""
    pid = f":{os.getpid()}"
    host = "".join(c for c in socket.gethostname() if c.isprintable() and not c.isspace())
    return (host or "host")[: IDENTITY_MAX - len(pid)] + pid


def check_identity(identity: object) -> str:
    """Validate a holder identity (written before the random part of each lock value),
    and return it as a plain ``str``.

    Raises:
        TypeError: ``identity`` is not a ``str``.
        ValueError: It is empty, longer than 128 characters, has whitespace or
            control characters, or cannot be encoded as UTF-8.
    """
    if not isinstance(identity, str):
        raise TypeError(f"identity must be a str, not {type(identity).__name__}")
    identity = plain_str(identity)
    if not 0 < len(identity) <= IDENTITY_MAX:
        raise ValueError(f"identity must have 1 to {IDENTITY_MAX} characters, got {len(identity)}")
    check_text("identity", identity)
    if not identity.isprintable() or any(c.isspace() for c in identity):
        raise ValueError(f"identity must have no whitespace or control characters: {identity!r}")
    return identity


def check_names(name: object) -> tuple[str, ...]:
    """One resource name, or a non-empty list or tuple of distinct ones (each a
    plain ``str``, compared as such: the same name gives the same key), at most
    `MAX_NAMES`."""
    if isinstance(name, list | tuple):
        if not name:
            raise ValueError("a lock on several resources needs at least one name")
        if len(name) > MAX_NAMES:
            raise ValueError(
                f"a lock takes at most {MAX_NAMES} resources, not {len(name)} names"
                " (each is a key sent to every master in each attempt)"
            )
        names = tuple(check_name(each) for each in name)
        if len(set(names)) != len(names):
            twice = sorted(each for each, count in Counter(names).items() if count > 1)
            raise ValueError(f"a lock names each resource once; given twice: {twice}")
        return names
    return (check_name(name),)


def warn_max_connections() -> None:
    """``AsyncRedlock(max_connections=...)``: deprecated, and ignored (warns its caller)."""
    warnings.warn(
        "max_connections is deprecated and ignored: asyncredlock sends every call to"
        " a master on one pipelined connection",
        DeprecationWarning,
        stacklevel=3,
    )


def _check_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Settings:
    """Validated settings of one ``AsyncRedlock`` (see ``AsyncRedlock`` for each)."""

    ttl: float = 10.0
    timeout: float = 10.0
    node_timeout: float = 0.1
    retry_delay: float = 0.2
    drift_factor: float = 0.01
    socket_timeout: float = 5.0
    busy_poll: float = 0.0001
    max_connections: int | None = None  # deprecated, ignored
    max_hold: float = math.inf
    prefix: str = ""
    auto_extend: bool = True
    fencing: bool = True
    clock: Callable[[], float] = time.monotonic
    identity: str = field(default_factory=default_identity)

    def __post_init__(self) -> None:
        seconds = {
            "ttl": check_ttl("ttl", self.ttl),
            "timeout": check_seconds("timeout", self.timeout, allow_zero=True, allow_inf=True),
            "node_timeout": check_seconds("node_timeout", self.node_timeout),
            "retry_delay": check_seconds("retry_delay", self.retry_delay, allow_zero=True),
            "socket_timeout": check_seconds("socket_timeout", self.socket_timeout),
            "max_hold": check_ttl("max_hold", self.max_hold, allow_inf=True),
            "busy_poll": check_busy_poll(self.busy_poll),
        }
        for name, value in seconds.items():  # store floats, whatever number was given
            object.__setattr__(self, name, value)
        if self.max_connections is not None:
            _check_int("max_connections", self.max_connections, minimum=1)
        if isinstance(self.drift_factor, bool) or not isinstance(self.drift_factor, int | float):
            raise TypeError("drift_factor must be a number")
        if not 0 <= self.drift_factor < 0.5:
            raise ValueError(f"drift_factor must be in [0, 0.5), got {self.drift_factor!r}")
        if not isinstance(self.prefix, str):
            raise TypeError(f"prefix must be a str, not {type(self.prefix).__name__}")
        prefix = check_text("prefix", check_no_nul("prefix", plain_str(self.prefix)))
        object.__setattr__(self, "prefix", prefix)
        if not isinstance(self.auto_extend, bool):
            raise TypeError("auto_extend must be a bool")
        if not isinstance(self.fencing, bool):
            raise TypeError("fencing must be a bool")
        if not callable(self.clock):
            raise TypeError("clock must be a callable returning seconds")
        if is_async_callable(self.clock):  # never called here: a fake clock counts reads
            raise TypeError(
                "clock must be a plain function returning seconds (time.monotonic), not"
                f" an async function: its coroutine would never be awaited ({self.clock!r})"
            )
        object.__setattr__(self, "identity", check_identity(self.identity))

    def drift(self, ttl: float) -> float:
        """Clock drift allowance for a lock of ``ttl`` seconds (Redlock's rule)."""
        return ttl * self.drift_factor + 0.002


DEFAULTS = Settings()


class LockKwargs(TypedDict):
    """``lock()``'s keyword arguments (see `LockOptions.kwargs`)."""

    ttl: float | None
    timeout: float | None
    auto_extend: bool | None
    fencing: bool | None
    fair: bool
    max_hold: float | None


@dataclass(frozen=True, slots=True)
class LockOptions:
    """One lock's overrides of its ``AsyncRedlock``'s settings (``None``: the
    setting), checked when made: what ``lock()`` takes besides the name."""

    ttl: float | None = None
    timeout: float | None = None
    auto_extend: bool | None = None
    fencing: bool | None = None
    fair: bool = False
    max_hold: float | None = None

    def __post_init__(self) -> None:
        if self.ttl is not None:
            object.__setattr__(self, "ttl", check_ttl("ttl", self.ttl))
        if self.timeout is not None:
            timeout = check_seconds("timeout", self.timeout, allow_zero=True, allow_inf=True)
            object.__setattr__(self, "timeout", timeout)
        for name in ("auto_extend", "fencing"):
            if not isinstance(getattr(self, name), bool | None):
                raise TypeError(f"{name} must be a bool")
        if not isinstance(self.fair, bool):
            raise TypeError("fair must be a bool")
        if self.max_hold is not None:
            max_hold = check_ttl("max_hold", self.max_hold, allow_inf=True)
            object.__setattr__(self, "max_hold", max_hold)

    def kwargs(self) -> LockKwargs:
        """The options as ``lock()``'s keyword arguments."""
        return LockKwargs(
            ttl=self.ttl,
            timeout=self.timeout,
            auto_extend=self.auto_extend,
            fencing=self.fencing,
            fair=self.fair,
            max_hold=self.max_hold,
        )

    def spec_values(self, settings: Settings) -> tuple[float, float, bool, bool, float]:
        """``ttl``, ``timeout``, ``auto_extend``, ``fencing`` and ``max_hold``, each
        the override or else the setting."""
        return (
            settings.ttl if self.ttl is None else self.ttl,
            settings.timeout if self.timeout is None else self.timeout,
            settings.auto_extend if self.auto_extend is None else self.auto_extend,
            settings.fencing if self.fencing is None else self.fencing,
            settings.max_hold if self.max_hold is None else self.max_hold,
        )


class Role(enum.Enum):
    """What a lock's holder is: alone (``lock()``), or one side of a read-write lock."""

    EXCLUSIVE = "exclusive"
    READER = "reader"
    WRITER = "writer"


@dataclass(frozen=True, slots=True)
class LockSpec:
    """What one ``Lock`` takes and how, its settings checked and filled in: the
    resources, the settings, its role, whether waiters are served in arrival
    order, and (a writer of an unfair read-write lock) after how many seconds of
    waiting it queues ahead of later readers."""

    target: Resources
    ttl: float
    timeout: float
    auto_extend: bool
    fencing: bool
    role: Role = Role.EXCLUSIVE
    fair: bool = False
    patience: float = math.inf
    max_hold: float = math.inf  # the longest a lease is held (its keys extended)

    @property
    def shared(self) -> bool:
        """Held together with other holders of the role (a reader)."""
        return self.role is Role.READER

    @property
    def queued(self) -> bool:
        """Attempts go through ``acquire_rw.lua`` with a queue entry from the
        start: a fair lock, or either side of a read-write lock."""
        return self.fair or self.role is not Role.EXCLUSIVE
