"""``watch``: a lock's holder, printed each time it changes."""

from __future__ import annotations

import argparse
import asyncio
from datetime import datetime

from .._inspect import LockState
from .._keys import identity_of
from .common import (
    EXIT_OK,
    Parser,
    Status,
    Subcommands,
    answered,
    connected,
    count,
    lock_name,
    masters,
    quorum_readers,
    seconds,
    shown,
    status_of,
)

__all__ = ["add_watch", "describe"]

DEFAULT_INTERVAL = 0.5


def add_watch(commands: Subcommands, options: Parser) -> None:
    """The ``watch`` subcommand."""
    watch = commands.add_parser(
        "watch",
        parents=[options],
        help="print a lock's holder each time it changes",
        description="Read a lock's state on every master each --interval seconds and "
        "print a line, the current one first, each time its majority holder (identity "
        "and value) changes, until interrupted (exit 130) or --count lines have been "
        "printed (exit 0).",
    )
    watch.add_argument("name", type=lock_name, metavar="NAME", help="the lock's resource name")
    watch.add_argument(
        "--interval",
        type=seconds,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"the pause between two reads ({DEFAULT_INTERVAL:g} s)",
    )
    watch.add_argument(
        "--count", type=count(minimum=1), metavar="N", help="stop after N lines (never)"
    )
    watch.set_defaults(command=_watch)


def _watch(args: argparse.Namespace) -> int:
    return asyncio.run(_watch_lock(args))


async def _watch_lock(args: argparse.Namespace) -> int:
    async with connected(args) as redlock:
        last, printed = None, 0
        while True:
            seen = describe(await redlock.inspect(args.name), redlock.quorum)
            if seen != last:
                now = datetime.now().astimezone().isoformat(timespec="milliseconds")
                print(f"{now}  {seen}", flush=True)
                last, printed = seen, printed + 1
                if printed == args.count:
                    return EXIT_OK
            await asyncio.sleep(args.interval)  # inspect() is the public view of a lock: poll it


def describe(state: LockState, quorum: int) -> str:
    """One line on who holds the lock: its majority holder, its readers on a
    quorum, ``free``, or ``unknown`` (too few masters answered); the values in it
    `shown` escaped."""
    status = status_of(state, quorum)
    if status is Status.FREE:
        return "free"
    if status is Status.UNKNOWN:
        total, silent = len(state.nodes), len(state.nodes) - answered(state)
        return f"unknown ({silent} of {masters(total)} did not answer)"
    if state.holder is not None:
        identity = shown(state.identity or "(not asyncredlock's)")
        return f"held by {identity} (value {shown(state.holder)})"
    readers = quorum_readers(state, quorum)
    who = ", ".join(dict.fromkeys(shown(identity_of(value) or value) for value in readers))
    return f"read by {len(readers)} reader{'' if len(readers) == 1 else 's'} ({who})"
