"""Argument checks of `asyncredlock.testing`: each refuses what a server, signal or
socket would misread (a truthy ``"no"``, ``True`` as 1 s, NaN), before anything is
made, started, stopped or sent."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .._config import check_seconds


def check_server_args(
    port: object = 0,
    appendonly: object = False,
    extra_args: object = (),
    *,
    password: object = None,
    fake_clock: object = False,
) -> None:
    """Refuse what a server would misread, before anything starts or is made.

    Raises:
        TypeError: ``port`` is not an int, ``appendonly`` or ``fake_clock`` not a
            bool, ``password`` neither None nor a str, or ``extra_args`` a str or
            bytes (not a sequence of str).
        ValueError: ``port`` is out of range, or ``password`` is empty.
    """
    check_port("port", port)
    check_switch("appendonly", appendonly)
    check_switch("fake_clock", fake_clock)  # a truthy "no" must not preload libfaketime
    if password is not None and not isinstance(password, str):
        raise TypeError(f"password must be a str or None, not {type(password).__name__}")
    if password == "":
        raise ValueError("password must not be empty (None: no password)")
    if isinstance(extra_args, str | bytes) or not isinstance(extra_args, Sequence):
        raise TypeError(
            f"extra_args must be a sequence of str (one per argument), got {extra_args!r}"
        )
    if not all(isinstance(each, str) for each in extra_args):
        raise TypeError(f"extra_args must hold str only, got {extra_args!r}")


def check_start_args(timeout: object, *, appendonly: object = False, kill: object = False) -> None:
    """Refuse a start's or restart's arguments, before any process is stopped or spawned.

    Raises:
        TypeError: ``timeout`` is not a number, or ``appendonly`` or ``kill`` not a
            bool (a truthy ``"no"`` must not crash a server).
        ValueError: ``timeout`` is NaN, not above 0, or infinite.
    """
    check_seconds("timeout", timeout)
    check_switch("appendonly", appendonly)
    check_switch("kill", kill)


def check_port(name: str, port: object) -> int:
    """``port`` if it is a TCP port number (0: pick a free one).

    Raises:
        TypeError: It is not an int (a bool, a float or a str is refused).
        ValueError: It is out of 0..65535.
    """
    number = check_count(name, port, minimum=None)
    if not 0 <= number <= 65535:
        raise ValueError(f"{name} must be in 0..65535, got {number}")
    return number


def check_switch(name: str, on: object) -> bool:
    """``on`` if it is a bool (a truthy str such as ``"no"`` must not switch it on).

    Raises:
        TypeError: It is not a bool.
    """
    if not isinstance(on, bool):
        raise TypeError(f"{name} must be a bool, not {type(on).__name__}")
    return on


def check_count(name: str, count: object, *, minimum: int | None = 0) -> int:
    """``count`` if it is an int of at least ``minimum`` (None: the caller checks).

    Raises:
        TypeError: It is not an int (a bool, a float, NaN included, is refused).
        ValueError: It is less than ``minimum``.
    """
    if not isinstance(count, int) or isinstance(count, bool):
        raise TypeError(f"{name} must be an int, not {type(count).__name__}")
    if minimum is not None and count < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {count}")
    return count


def check_str(name: str, value: object) -> str:
    """``value`` if it is a str (a host, a service name, a key).

    Raises:
        TypeError: It is not a str.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def check_period(name: str, seconds: object) -> float:
    """``seconds`` as a float if it is a number of seconds above 0 (`check_seconds`,
    keeping the message a period not above 0 always had): ``True`` is no 1 s.

    Raises:
        TypeError: It is not an int or a float (a bool is refused).
        ValueError: It is not above 0 (NaN included), infinite or too long.
    """
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and not seconds > 0:
        raise ValueError(f"{name} must be above 0 s, got {seconds}")  # NaN too
    return check_seconds(name, seconds)


def check_path(name: str, path: object) -> str | None:
    """``path`` as a str, if it is None, a str or an ``os.PathLike`` of a str (a
    server binary, a working directory); None stays None.

    Raises:
        TypeError: It is of another type (an int, bytes), naming it.
    """
    if path is None:
        return None
    if isinstance(path, str | os.PathLike):
        text = os.fspath(path)
        if isinstance(text, str):
            return text
    raise TypeError(f"{name} must be a str or os.PathLike (or None), not {type(path).__name__}")
