"""What the subcommands share: exit codes, errors, the master options, the verdict
on a lock's state."""

from __future__ import annotations

import argparse
import asyncio
import enum
import os
import re
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import NoReturn, TypeAlias

from .._config import check_name
from .._inspect import LockState
from .._keys import lock_key
from .._redlock import AsyncRedlock
from .._urls import SCHEMES, SENTINEL

__all__ = [
    "CLI_NODE_TIMEOUT",
    "EXIT_CLOSED_PIPE",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "MASTERS_ENV",
    "PROG",
    "Parser",
    "Status",
    "Subcommands",
    "UsageError",
    "answered",
    "connect",
    "connected",
    "count",
    "fail",
    "lock_name",
    "master_options",
    "master_urls",
    "masters",
    "quorum_readers",
    "seconds",
    "shown",
    "status_of",
]

PROG = "asyncredlock"
MASTERS_ENV = "REDLOCK_MASTERS"
# Longer than the library's 0.1 s default: a CLI opens every connection cold,
# possibly over TLS to a distant master.
CLI_NODE_TIMEOUT = 1.0

EXIT_OK = 0
EXIT_FAILURE = 1  # also: the lock is free, or there was nothing to release
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3  # fewer than a quorum of masters answered
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: standard output's reader went away


class UsageError(Exception):
    """Bad command-line input: reported on one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


#: What ``add_subparsers()`` returns (a string: the class is not generic at run time).
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


class Status(enum.Enum):
    """What the masters that answered say about a lock, and its exit status."""

    HELD = EXIT_OK  # a writer's value, or a reader, on a quorum
    FREE = EXIT_FAILURE  # nothing on a quorum, and the silent masters cannot make one
    UNKNOWN = EXIT_UNAVAILABLE  # too few answered to tell

    @property
    def exit_code(self) -> int:
        """The exit status ``inspect`` gives for it."""
        code: int = self.value
        return code


def answered(state: LockState) -> int:
    """On how many masters the state could be read."""
    return sum(1 for node in state.nodes if node.error is None)


def quorum_readers(state: LockState, quorum: int) -> list[str]:
    """The readers (values) of a read-write lock listed on a quorum of masters."""
    seen = Counter(value for node in state.nodes for value, _ in node.readers)
    return sorted(value for value, times in seen.items() if times >= quorum)


def status_of(state: LockState, quorum: int) -> Status:
    """Held, free, or unknown: free only when no value is on a quorum and none
    could be, even counting every master that did not answer as holding it."""
    if state.holder is not None or quorum_readers(state, quorum):
        return Status.HELD
    silent = len(state.nodes) - answered(state)
    seen = Counter(node.holder for node in state.nodes if node.holder is not None)
    seen.update(value for node in state.nodes for value, _ in node.readers)
    most = max(seen.values(), default=0)
    if answered(state) < quorum or (silent and most + silent >= quorum):
        return Status.UNKNOWN
    return Status.FREE


def shown(text: str) -> str:
    """``text`` for a line of text output: each character that is not printable
    escaped as ``repr()`` escapes it (``\\n``, ``\\x1b``, ``\\u202e``), so that a value
    any client may write (a holder, a reader, a key's name) cannot forge lines or
    drive the terminal. JSON output escapes them already, and stays exact."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def masters(number: int) -> str:
    """``"1 master"``, ``"5 masters"``."""
    return f"{number} master" if number == 1 else f"{number} masters"


def master_options() -> Parser:
    """Options shared by the commands that talk to existing masters."""
    options = Parser(add_help=False)
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


def lock_name(text: str) -> str:
    """An argparse ``type`` for a resource name: the library's own check."""
    try:
        return check_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def count(*, minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting whole numbers from ``minimum`` up."""

    def parse(text: str) -> int:
        value = int(text)  # argparse reports a ValueError as "invalid int value: ..."
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type by it: "invalid int value"
    return parse


def seconds(text: str) -> float:
    """An argparse ``type`` for a finite duration above zero (its name is the one
    argparse shows: "invalid seconds value")."""
    value = float(text)  # argparse reports a ValueError as "invalid seconds value: ..."
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


#: Whitespace and commas before a master URL's scheme: what separates two URLs. Nowhere
#: else: a password may hold a space (AsyncRedlock takes it), and a Sentinel URL lists
#: its sentinels with commas (``redis-sentinel://h1:26379,h2:26379/svc``).
_BETWEEN_URLS = re.compile(
    rf"[\s,]+(?=(?:{'|'.join(map(re.escape, (*SCHEMES, SENTINEL)))})://)", re.IGNORECASE
)


def _split_urls(text: str) -> list[str]:
    """URLs separated by whitespace or commas, each before a scheme the library takes
    (a space elsewhere, as in a password, is part of the URL)."""
    parts = _BETWEEN_URLS.split(text)
    return [url.strip().strip(",") for url in parts if url.strip().strip(",")]


def master_urls(args: argparse.Namespace) -> list[str]:
    """The masters the user named: the options, else ``$REDLOCK_MASTERS``.

    Raises:
        UsageError: None were named.
    """
    urls: list[str] = args.masters or _split_urls(os.environ.get(MASTERS_ENV, ""))
    if not urls:
        raise UsageError(f"no masters: give --master URL, --masters URL,URL,... or ${MASTERS_ENV}")
    return urls


def connect(args: argparse.Namespace) -> AsyncRedlock:
    """An ``AsyncRedlock`` over the masters the user named.

    Raises:
        UsageError: No masters, a malformed URL, a bad prefix, or a name whose key
            (after the prefix) is one of the library's own.
    """
    try:
        if isinstance(name := getattr(args, "name", None), str):
            lock_key(args.prefix, name)  # refuses a reserved key, before any call
        # The option bounds the whole wait: silence and a slow reply alike.
        wait = args.node_timeout
        redlock = AsyncRedlock(
            master_urls(args), prefix=args.prefix, node_timeout=wait, socket_timeout=wait
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    _load_no_script_ahead(redlock)
    return redlock


@asynccontextmanager
async def connected(args: argparse.Namespace) -> AsyncIterator[AsyncRedlock]:
    """`connect`, closed on the way out; interrupted (cancelled, as by Ctrl-C), at
    once: the calls still out fail, unwaited for (a master silent for
    ``--node-timeout`` would keep the command that long). They are reads, or
    ``force-release``'s deletes, which land or not (the docs say so: rerun it).

    Raises:
        UsageError: As `connect`.
    """
    redlock = connect(args)
    try:
        yield redlock
    except (asyncio.CancelledError, KeyboardInterrupt):
        await redlock._close_now()
        raise
    finally:
        await redlock.aclose()  # at once when closed already


def _load_no_script_ahead(redlock: AsyncRedlock) -> None:
    """A command runs one or two scripts once: none is loaded ahead on its connections
    (``SCRIPT LOAD`` of every script, refused and logged in ACL LOG for an operator's
    read-only user). Each goes by ``EVALSHA``, sent whole (``EVAL``) where unknown."""
    for node in redlock._core.nodes:
        if node.link is not None:  # a cluster master's client loads nothing ahead
            node.link.preload = ()


def fail(message: str, status: int) -> int:
    """Print ``message`` as one error line on stderr; return ``status``."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status
