"""The command line: ``python -m asyncredlock`` or ``asyncredlock``.

```
asyncredlock demo [--masters N] [--requests N] [--limit N]
asyncredlock inspect NAME --master URL [--master URL ...] [--json]
asyncredlock force-release NAME --masters URL,URL,... [--yes]
```

Masters come from ``--master`` (repeatable) and ``--masters`` (comma-separated), or
else from the ``REDLOCK_MASTERS`` environment variable (comma- or space-separated).

Exit codes: 0 success; 1 failure (the demo's locked round was wrong, a majority of
masters did not answer, the confirmation was declined, a dependency is missing);
2 bad usage (no masters, a malformed URL, a bad option); 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ._errors import RedlockError
from ._inspect import LockState, NodeLockState
from ._redlock import AsyncRedlock

__all__ = ["main"]

PROG = "asyncredlock"
MASTERS_ENV = "REDLOCK_MASTERS"
# Longer than the library's 0.1 s default: a CLI opens every connection cold,
# possibly over TLS to a distant master.
CLI_NODE_TIMEOUT = 1.0

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad command-line input: reported on one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status (see the module docstring).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``asyncredlock`` command."""
    parser = _Parser(
        prog=PROG,
        description="Distributed locks over N Redis/Valkey masters (Redlock).",
        epilog=f"Masters may also be given in ${MASTERS_ENV} (comma-separated URLs).",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    _add_demo(commands)
    masters = _master_options()
    _add_inspect(commands, masters)
    _add_force_release(commands, masters)
    return parser


def _add_demo(commands: argparse._SubParsersAction[_Parser]) -> None:
    demo = commands.add_parser(
        "demo",
        help="replay the /items race without and with a lock, on local servers",
        description="Start local servers, run a FastAPI app's check-then-append under "
        "concurrent requests without and with a lock, and compare. Exit 0 when the "
        "locked run gave exactly the expected statuses.",
    )
    positive, natural = _count(minimum=1), _count(minimum=0)
    demo.add_argument("--masters", type=positive, default=5, metavar="N", help="masters (5)")
    demo.add_argument("--requests", type=positive, default=5, metavar="N", help="requests (5)")
    demo.add_argument("--limit", type=natural, default=3, metavar="N", help="items allowed (3)")
    demo.set_defaults(command=_demo)


def _add_inspect(commands: argparse._SubParsersAction[_Parser], masters: _Parser) -> None:
    inspect = commands.add_parser(
        "inspect",
        parents=[masters],
        help="show who holds a lock on each master",
        description="Show, per master, the holder value, seconds left and fence "
        "counter of a lock, and how many readers (read-write locks) and queued "
        "waiters it has (or why the master could not be read), and the holder "
        "found on a majority, with its identity. Exit 1 when a majority of masters did not answer.",
    )
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(command=_inspect)


def _add_force_release(commands: argparse._SubParsersAction[_Parser], masters: _Parser) -> None:
    release = commands.add_parser(
        "force-release",
        parents=[masters],
        help="delete a lock's key on every master, whoever holds it",
        description="Delete a lock's key on every master, whoever holds it. Only for "
        "a lock whose holder is known to be dead: a live holder learns of it at its "
        "next extension.",
    )
    release.add_argument("-y", "--yes", action="store_true", help="do not ask to confirm")
    release.set_defaults(command=_force_release)


def _master_options() -> _Parser:
    """Options shared by the commands that talk to existing masters."""
    options = _Parser(add_help=False)
    options.add_argument("name", metavar="NAME", help="the lock's resource name")
    group = options.add_argument_group("masters")
    group.add_argument(
        "--master", dest="masters", action="append", metavar="URL", help="a master (repeat)"
    )
    group.add_argument(
        "--masters",
        dest="masters",
        action="extend",
        type=_split_urls,
        metavar="URL,URL,...",
        help="masters, comma-separated",
    )
    group.add_argument("--prefix", default="", help="the key prefix the application uses")
    group.add_argument(
        "--node-timeout",
        type=float,
        default=CLI_NODE_TIMEOUT,
        metavar="SECONDS",
        help=f"the longest wait for any master's reply ({CLI_NODE_TIMEOUT:g} s)",
    )
    return options


def _count(*, minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting whole numbers from ``minimum`` up."""

    def parse(text: str) -> int:
        value = int(text)  # argparse reports a ValueError as "invalid value"
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _split_urls(text: str) -> list[str]:
    return [url for url in re.split(r"[,\s]+", text) if url]


# -- demo ------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from .testing import ServerBinaryNotFoundError, ServerStartError
    from .testing._demo import DemoDependencyError, run_demo

    demo = run_demo(masters=args.masters, requests=args.requests, limit=args.limit)
    try:
        result = asyncio.run(demo)
    except (DemoDependencyError, ServerBinaryNotFoundError, ServerStartError) as exc:
        return _fail(str(exc), EXIT_FAILURE)
    return EXIT_OK if result.lock_held_limit else EXIT_FAILURE


# -- inspect ---------------------------------------------------------------------------


def _inspect(args: argparse.Namespace) -> int:
    state, quorum = asyncio.run(_read_state(args))
    print(_state_json(state, quorum) if args.json else _state_text(state, quorum))
    return EXIT_OK if _answered(state) >= quorum else EXIT_FAILURE


async def _read_state(args: argparse.Namespace) -> tuple[LockState, int]:
    async with _connect(args) as redlock:
        return await redlock.inspect(args.name), redlock.quorum


def _answered(state: LockState) -> int:
    return sum(1 for node in state.nodes if node.error is None)


def _state_json(state: LockState, quorum: int) -> str:
    document = {
        "resource": state.resource,
        "key": state.key,
        "quorum": quorum,
        "holder": state.holder,
        "identity": state.identity,
        "answered": _answered(state),
        "masters": [dataclasses.asdict(node) | {"identity": node.identity} for node in state.nodes],
    }
    return json.dumps(document, indent=2)


def _state_text(state: LockState, quorum: int) -> str:
    count = _masters(len(state.nodes))
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
        return (node.node, f"error: {node.error}")
    holder = node.holder if node.holder is not None else "(free)"
    ttl = "-" if node.ttl is None else f"{node.ttl:.3f} s"
    fence = "-" if node.fence is None else str(node.fence)
    return (node.node, holder, ttl, fence, str(len(node.readers)), str(len(node.queue)))


def _masters(count: int) -> str:
    return f"{count} master" if count == 1 else f"{count} masters"


def _majority_line(state: LockState, quorum: int) -> str:
    answered = _answered(state)
    if answered < quorum:
        return (
            f"majority holder: unknown (only {answered} of {_masters(len(state.nodes))} answered)"
        )
    holder = state.holder
    if holder is None:
        return "majority holder: none (no value is held on a quorum)"
    count = sum(1 for node in state.nodes if node.holder == holder)
    identity = "" if state.identity is None else f"; identity {state.identity}"
    return f"majority holder: {holder} (on {count} of {_masters(len(state.nodes))}{identity})"


# -- force-release ---------------------------------------------------------------------


def _force_release(args: argparse.Namespace) -> int:
    if not args.yes:
        state, quorum = asyncio.run(_read_state(args))
        print(_state_text(state, quorum))
        if not _confirm(f"Delete {state.key!r} on every master, whoever holds it? [y/N] "):
            return _fail("aborted: nothing was deleted", EXIT_FAILURE)
    try:
        deleted, total = asyncio.run(_delete(args))
    except RedlockError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    print(f"deleted the lock key of {args.name!r} on {deleted} of {_masters(total)}")
    return EXIT_OK


async def _delete(args: argparse.Namespace) -> tuple[int, int]:
    async with _connect(args) as redlock:
        return await redlock.force_release(args.name), len(redlock.masters)


def _confirm(prompt: str) -> bool:
    try:
        answer = input(prompt)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


# -- shared ----------------------------------------------------------------------------


def _connect(args: argparse.Namespace) -> AsyncRedlock:
    """An ``AsyncRedlock`` over the masters the user named.

    Raises:
        UsageError: No masters, a malformed URL, an empty name or a bad timeout.
    """
    if not args.name:
        raise UsageError("the lock name must not be empty")
    masters = args.masters or _split_urls(os.environ.get(MASTERS_ENV, ""))
    if not masters:
        raise UsageError(f"no masters: give --master URL, --masters URL,URL,... or ${MASTERS_ENV}")
    try:
        # The option bounds the whole wait: silence and a slow reply alike.
        wait = args.node_timeout
        return AsyncRedlock(masters, prefix=args.prefix, node_timeout=wait, socket_timeout=wait)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
