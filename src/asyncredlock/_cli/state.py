"""``inspect`` and ``force-release``: one lock's state on every master, and
forcing the lock free."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys

from .._errors import QuorumUnavailableError
from .._inspect import LockState, NodeLockState
from .._operator import Freed
from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    PROG,
    Parser,
    Status,
    Subcommands,
    answered,
    connected,
    fail,
    lock_name,
    masters,
    quorum_readers,
    shown,
    status_of,
)

__all__ = ["add_force_release", "add_inspect", "state_text"]


def add_inspect(commands: Subcommands, options: Parser) -> None:
    """The ``inspect`` subcommand."""
    inspect = commands.add_parser(
        "inspect",
        parents=[options],
        help="show who holds a lock on each master",
        description="Show, per master, the holder value, seconds left and fence "
        "counter of a lock, and how many readers (read-write locks) and queued "
        "waiters it has (or why the master could not be read), and the holder "
        "found on a majority, with its identity. Exit 0 when the lock is held (a "
        "value, or a reader, on a quorum of masters), 1 when it is free, 3 when "
        "too few masters answered to tell.",
    )
    inspect.add_argument("name", type=lock_name, metavar="NAME", help="the lock's resource name")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(command=_inspect)


def add_force_release(commands: Subcommands, options: Parser) -> None:
    """The ``force-release`` subcommand."""
    release = commands.add_parser(
        "force-release",
        parents=[options],
        help="delete a lock's key on every master, whoever holds it",
        description="Delete a lock's key (and a read-write lock's reader entries) on "
        "every master, whoever holds it, and say which was deleted. Only for "
        "a lock whose holder is known to be dead: a live holder learns of it at its "
        "next extension. A master that failed or did not answer is named in a "
        "warning. Exit 0 when a key was deleted, 1 when there was none (or the "
        "confirmation was declined), 3 when too many masters failed.",
    )
    release.add_argument("name", type=lock_name, metavar="NAME", help="the lock's resource name")
    release.add_argument("-y", "--yes", action="store_true", help="do not ask to confirm")
    release.set_defaults(command=_force_release)


# -- inspect ---------------------------------------------------------------------------


def _inspect(args: argparse.Namespace) -> int:
    state, quorum = asyncio.run(_read_state(args))
    print(_state_json(state, quorum) if args.json else state_text(state, quorum))
    return status_of(state, quorum).exit_code


async def _read_state(args: argparse.Namespace) -> tuple[LockState, int]:
    async with connected(args) as redlock:
        return await redlock.inspect(args.name), redlock.quorum


def _state_json(state: LockState, quorum: int) -> str:
    document = {
        "resource": state.resource,
        "key": state.key,
        "quorum": quorum,
        "status": status_of(state, quorum).name.lower(),
        "holder": state.holder,
        "identity": state.identity,
        "answered": answered(state),
        "masters": [dataclasses.asdict(node) | {"identity": node.identity} for node in state.nodes],
    }
    return json.dumps(document, indent=2)


def state_text(state: LockState, quorum: int) -> str:
    """The table of a lock's state on each master, and the majority line."""
    count = masters(len(state.nodes))
    header = f"lock {state.resource!r} (key {state.key!r}) on {count}, quorum {quorum}"
    rows = [("MASTER", "HOLDER", "TTL", "FENCE", "READERS", "QUEUED"), *map(_node_row, state.nodes)]
    readable = [row for row in rows if len(row) == 6]  # error rows do not size columns
    widths = [max(len(row[0]) for row in rows)]
    widths += [max(len(row[i]) for row in readable) for i in range(1, 6)]
    table = ["  ".join(map(str.ljust, row, widths)).rstrip() for row in rows]
    return "\n".join([header, *table, _majority_line(state, quorum)])


def _node_row(node: NodeLockState) -> tuple[str, ...]:
    """The cells of one master's row; a master that could not be read has two."""
    if node.error is not None:
        return (node.node, f"error: {shown(node.error)}")
    holder = shown(node.holder) if node.holder is not None else "(free)"
    ttl = "-" if node.ttl is None else f"{node.ttl:.3f} s"
    fence = "-" if node.fence is None else str(node.fence)
    return (node.node, holder, ttl, fence, str(len(node.readers)), str(len(node.queue)))


def _majority_line(state: LockState, quorum: int) -> str:
    total, got = masters(len(state.nodes)), answered(state)
    status = status_of(state, quorum)
    if got < quorum:
        return f"majority holder: unknown (only {got} of {total} answered)"
    holder = state.holder
    if holder is not None:
        count = sum(1 for node in state.nodes if node.holder == holder)
        identity = "" if state.identity is None else f"; identity {shown(state.identity)}"
        return f"majority holder: {shown(holder)} (on {count} of {total}{identity})"
    if status is Status.HELD:
        readers = len(quorum_readers(state, quorum))
        return f"majority holder: none (read-locked: {readers} on a quorum)"
    if status is Status.UNKNOWN:
        silent = len(state.nodes) - got
        return (
            f"majority holder: unknown ({silent} of {total} did not answer: with them, "
            "a value seen here could be on a quorum)"
        )
    return "majority holder: none (no value is held on a quorum)"


# -- force-release ---------------------------------------------------------------------


def _force_release(args: argparse.Namespace) -> int:
    if not args.yes:
        state, quorum = asyncio.run(_read_state(args))
        print(state_text(state, quorum))
        if not _confirm(f"Delete {state.key!r} on every master, whoever holds it? [y/N] "):
            return fail("aborted: nothing was deleted", EXIT_FAILURE)
    try:
        freed, total = asyncio.run(_delete(args))
    except QuorumUnavailableError as exc:
        return fail(str(exc), EXIT_UNAVAILABLE)
    if freed.deleted:
        print(_deleted(freed, args.name, total))
    else:
        print(f"nothing to release: no key of {args.name!r} was deleted on any of {masters(total)}")
    for node, why in freed.missed:  # free on a quorum, but maybe not there
        stays = "the lock's keys there, if any, may stay until they expire"
        # a reason may end with a full stop (an OSError's message): no '.:' then
        print(f"{PROG}: warning: {node}: {why.rstrip('.')}: {stays}", file=sys.stderr)
    return EXIT_OK if freed.deleted else EXIT_FAILURE


def _deleted(freed: Freed, name: str, total: int) -> str:
    """What was deleted, on how many masters: the lock key, the readers' entries, both."""
    if not freed.readers:
        return f"deleted the lock key of {name!r} on {freed.key} of {masters(total)}"
    if not freed.key:
        return f"deleted the reader entries of {name!r} on {freed.readers} of {masters(total)}"
    return (
        f"deleted the lock key of {name!r} on {freed.key} and its reader entries on "
        f"{freed.readers} of {masters(total)}"
    )


async def _delete(args: argparse.Namespace) -> tuple[Freed, int]:
    async with connected(args) as redlock:
        return await redlock._force_free(args.name), len(redlock.masters)


def _confirm(prompt: str) -> bool:
    try:
        answer = input(prompt)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")
