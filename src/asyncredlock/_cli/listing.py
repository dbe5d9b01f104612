"""``list``: the locks held on the masters whose names match a pattern.

Each master's keys are walked with ``SCAN`` (never ``KEYS``), at most about
``--max-keys`` of them; the library's auxiliary keys (``{K}:fence``,
``{K}:undo:...``, the queue's keys, a semaphore's slots...; see ``split_aux``) are
left out, and a read-write lock held only by readers is found by its ``{K}:readers``
set. Each lock found is then read with
``inspect()``, as ``asyncredlock inspect`` does; a lock whose state a master that
answered the scan did not give (an error, no reply) is listed all the same, named in a
warning, and the exit status is 3 when that leaves unknown whether a lock is held. A
master that gave no reply (not reached, or silent for ``--node-timeout``), to its scan
or to a read, is not asked again: a silent master is waited for once, not once per
batch of reads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._config import check_name
from .._connect import NO_CLIENT_SETINFO
from .._inspect import LockState, NodeLockState, not_asked
from .._keys import glob_escape, identity_of, lock_key, split_aux
from .._redlock import AsyncRedlock
from .common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    PROG,
    Parser,
    Status,
    Subcommands,
    connected,
    count,
    fail,
    master_urls,
    masters,
    quorum_readers,
    shown,
    status_of,
)

__all__ = ["add_list", "listed_key", "split_aux"]

DEFAULT_MAX_KEYS = 100_000
SCAN_COUNT = 1000  # keys asked of SCAN per call
INSPECT_BATCH = 100  # locks read at once


def add_list(commands: Subcommands, options: Parser) -> None:
    """The ``list`` subcommand."""
    listing = commands.add_parser(
        "list",
        parents=[options],
        help="list the locks held, by name pattern",
        description="List the locks held on the masters whose names match PATTERN: "
        "per lock, on how many masters it is held, its majority holder's identity "
        "and the readers of a read-write lock. Keys are walked with SCAN. Exit 0, "
        "or 3 when fewer than a quorum of masters answered or a lock's state could "
        "not be read on enough masters to tell whether it is held.",
    )
    listing.add_argument(
        "pattern",
        nargs="?",
        default="*",
        metavar="PATTERN",
        help="shell-style pattern of lock names, without the prefix: *, ?, [seq], [!seq] (*)",
    )
    listing.add_argument(
        "--max-keys",
        type=count(minimum=1),
        default=DEFAULT_MAX_KEYS,
        metavar="N",
        help=f"read at most about N keys on each master ({DEFAULT_MAX_KEYS})",
    )
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(command=_list)


@dataclass(frozen=True, slots=True)
class Scan:
    """What SCAN found on one master: the lock keys, or why it could not walk them
    (``silent``: it could not be reached, or gave no reply within ``--node-timeout``)."""

    node: str
    keys: frozenset[str] = frozenset()
    error: str | None = None
    truncated: bool = False
    silent: bool = False


@dataclass(frozen=True, slots=True)
class Listing:
    """The scans of every master, the locks found held, by name, and the masters not
    asked after a call there got no reply (by index: that call's error)."""

    scans: tuple[Scan, ...]
    locks: tuple[LockState, ...]
    quorum: int
    failed: dict[int, str]

    @property
    def answered(self) -> int:
        return sum(1 for scan in self.scans if scan.error is None)

    @property
    def unknown(self) -> int:
        """How many locks listed may or may not be held: too few masters read."""
        return sum(1 for state in self.locks if status_of(state, self.quorum) is Status.UNKNOWN)


def _list(args: argparse.Namespace) -> int:
    listing = asyncio.run(_collect(args))
    print(_listing_json(listing, args) if args.json else _listing_text(listing, args))
    _warn(listing, args)
    if listing.answered < listing.quorum:
        total = masters(len(listing.scans))
        return fail(f"only {listing.answered} of {total} answered", EXIT_UNAVAILABLE)
    if unknown := listing.unknown:
        locks = "1 lock is" if unknown == 1 else f"{unknown} locks are"
        return fail(f"could not tell whether {locks} held: too few masters read", EXIT_UNAVAILABLE)
    return EXIT_OK


def _warn(listing: Listing, args: argparse.Namespace) -> None:
    """A warning line for each master whose scan failed or stopped short, then one for
    each lock a master that answered the scan could not read, and one for each such
    master that was no longer asked, as a read there got no reply."""
    for scan in listing.scans:
        if scan.error is not None:
            print(f"{PROG}: warning: {scan.node}: {scan.error}", file=sys.stderr)
        elif scan.truncated:
            print(
                f"{PROG}: warning: {scan.node}: stopped after about {args.max_keys} keys, "
                "locks may be missing (raise --max-keys)",
                file=sys.stderr,
            )
    scanned = [scan.error is None for scan in listing.scans]
    unasked = {not_asked(error) for error in listing.failed.values()}
    for state in listing.locks:
        for node in _unread(state, scanned):  # a master whose scan failed: named above
            if node.error not in unasked:  # the locks not asked: counted below
                message = f"lock {shown(state.resource)} not read on {node.node}: {node.error}"
                print(f"{PROG}: warning: {message}", file=sys.stderr)
    for i, error in listing.failed.items():
        why = not_asked(error)
        if scanned[i] and (count := sum(state.nodes[i].error == why for state in listing.locks)):
            locks = "1 lock" if count == 1 else f"{count} locks"
            message = f"{listing.scans[i].node}: {locks} not read there, as a read failed: {error}"
            print(f"{PROG}: warning: {message}", file=sys.stderr)


async def _collect(args: argparse.Namespace) -> Listing:
    async with connected(args) as redlock:
        places = zip(master_urls(args), redlock.masters, strict=True)
        scans = await asyncio.gather(*(_scan(url, node, args) for url, node in places))
        keys = sorted(frozenset[str]().union(*(scan.keys for scan in scans)))
        names = [key.removeprefix(args.prefix) for key in keys]
        failed = {i: scan.error for i, scan in enumerate(scans) if scan.silent and scan.error}
        states = map(_no_lock_of_another_type, await _read_states(redlock, names, failed))
        scanned = [scan.error is None for scan in scans]
        listed = tuple(state for state in states if _listed(state, scanned))
        return Listing(tuple(scans), listed, redlock.quorum, failed)


def _listed(state: LockState, scanned: Sequence[bool]) -> bool:
    """Whether to list the lock: held on a master, or not read on one whose scan
    answered (found there, its key may be held). Unread on a master whose scan failed
    (named in a warning) and free on the others, it was found and has gone since."""
    return bool(_held_on(state)) or bool(_unread(state, scanned))


def _no_lock_of_another_type(state: LockState) -> LockState:
    """``state`` where a master's ``WRONGTYPE`` reads as free: a key of another type
    (a hash, a list) at a lock's name holds no lock there, as on a master that
    answered (only string keys are locks)."""
    nodes = tuple(
        NodeLockState(node.node, None, None, None) if _wrong_type(node.error) else node
        for node in state.nodes
    )
    return replace(state, nodes=nodes)


def _wrong_type(error: str | None) -> bool:
    return error is not None and error.startswith("ResponseError: WRONGTYPE ")


def _unread(state: LockState, among: Sequence[bool] | None = None) -> list[NodeLockState]:
    """The masters (``among`` them: those true in it, in order) that did not give the
    lock's state."""
    among = among or [True] * len(state.nodes)
    return [node for node, this in zip(state.nodes, among, strict=True) if this and node.error]


async def _read_states(
    redlock: AsyncRedlock, names: Sequence[str], failed: dict[int, str]
) -> list[LockState]:
    """Each lock's state, ``INSPECT_BATCH`` at a time after the first alone: a master
    that lacks inspect.lua (restarted, failed over, ``SCRIPT FLUSH``; this command
    loads no script ahead) refuses the first EVALSHA, which is sent whole (EVAL,
    caching the script) only with nothing behind it on the connection; calls behind
    it would all fail there. A master in ``failed`` (its scan, or a read, got no
    reply) is not asked: a silent master is waited for once, not once per batch."""
    states = [await redlock._read_state(names[0], failed)] if names else []
    for start in range(1, len(names), INSPECT_BATCH):
        batch = names[start : start + INSPECT_BATCH]
        states += await asyncio.gather(*(redlock._read_state(name, failed) for name in batch))
    return states


# -- scanning --------------------------------------------------------------------------


async def _scan(url: str, node: str, args: argparse.Namespace) -> Scan:
    """Walk one master's keys; ``node`` names it (``url`` may hold a password)."""
    try:
        client = _scan_client(url, args.node_timeout)
    except ValueError as exc:  # a form only the lock's connections take (redis-sentinel://)
        return Scan(node, error=f"its keys cannot be listed through this URL: {exc}")
    try:
        keys, truncated = await _scan_keys(client, args)
    except (RedisError, OSError) as exc:
        silent = isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError))
        return Scan(node, error=f"{type(exc).__name__}: {exc}", silent=silent)
    finally:
        await client.aclose()
    return Scan(node, frozenset(keys), truncated=truncated)


def _scan_client(url: str, wait: float) -> Redis:
    """A client of the server of ``url`` for the scan. Whatever the URL's query says
    (``decode_responses`` and ``encoding``, of no effect on asyncredlock's own
    connections; ``socket_timeout``), it reads keys as bytes, encodes the pattern as
    UTF-8, retries nothing and waits at most ``wait`` (``--node-timeout``).

    Raises:
        ValueError: A URL redis-py does not connect to directly (redis-sentinel://).
    """
    # no CLIENT SETINFO: a user made from acl_rules() may not run it (ACL LOG noise)
    pool = ConnectionPool.from_url(url, retry=Retry(NoBackoff(), 0), **NO_CLIENT_SETINFO)
    kwargs = pool.connection_kwargs  # read by each connection the pool makes
    kwargs.update(decode_responses=False, encoding="utf-8", encoding_errors="strict")
    for timeout in ("socket_timeout", "socket_connect_timeout"):
        kwargs[timeout] = wait
        if f"orig_{timeout}" in kwargs:  # what redis-py sets back after a maintenance
            kwargs[f"orig_{timeout}"] = wait
    return Redis.from_pool(pool)


async def _scan_keys(client: Redis, args: argparse.Namespace) -> tuple[set[str], bool]:
    """The lock keys listed among a master's keys, and whether the walk was cut short."""
    # Every key of a lock (its own, its readers') holds prefix + name: a server-side
    # filter that keeps them all.
    match = f"*{glob_escape(args.prefix)}*" if args.prefix else None
    step = min(SCAN_COUNT, args.max_keys)
    found: set[str] = set()
    cursor, read = 0, 0
    while True:
        cursor, batch = await client.scan(cursor, match=match, count=step)
        read += max(step, len(batch))  # with MATCH, SCAN reads about COUNT keys a call
        found.update(key for raw in batch if (key := listed_key(raw, args.prefix, args.pattern)))
        if not cursor:
            return found, False
        if read >= args.max_keys:
            return found, True


def listed_key(raw: bytes | str, prefix: str, pattern: str) -> str | None:
    """The lock key that the key ``raw`` stands for in a listing, if any.

    A lock key stands for itself and a readers set for its lock key; other
    auxiliary keys, keys whose name (after ``prefix``) does not match
    ``pattern``, and keys that are no valid lock name (not UTF-8, a NUL in it,
    a reserved key: ``inspect()`` would refuse it), stand for none.
    """
    try:
        key = raw if isinstance(raw, str) else raw.decode()
    except UnicodeDecodeError:  # never a name the library accepts
        return None
    aux = split_aux(key)
    if aux is not None:
        if aux[1] != "readers":
            return None
        key = aux[0]
    name = key.removeprefix(prefix)
    if not key.startswith(prefix) or not name or not fnmatchcase(name, pattern):
        return None
    try:  # a name the library refuses (a NUL in it, a reserved key) is no lock of its
        return lock_key(prefix, check_name(name))
    except ValueError:
        return None


# -- output ----------------------------------------------------------------------------


def _held_on(state: LockState) -> int:
    """On how many masters the lock has a holder: a writer's key (with an expiry,
    as every lock key has), or a reader."""
    return sum(
        1
        for node in state.nodes
        if (node.holder is not None and node.ttl is not None) or node.readers
    )


def _masters_cell(state: LockState) -> str:
    cell = f"{_held_on(state)} of {len(state.nodes)}"
    unread = len(_unread(state))
    return f"{cell} ({unread} unread)" if unread else cell


def _holder_cell(state: LockState, quorum: int) -> str:
    if state.holder is not None:
        return shown(state.identity or state.holder)
    if status_of(state, quorum) is Status.UNKNOWN:
        return "(unknown)"
    written = any(node.holder is not None for node in state.nodes)
    return "(no majority)" if written else "-"


def _readers_cell(state: LockState, quorum: int) -> str:
    readers = quorum_readers(state, quorum)
    if not readers:
        return "-"
    who = dict.fromkeys(shown(identity_of(value) or value) for value in readers)
    return f"{len(readers)} ({', '.join(who)})"


def _listing_text(listing: Listing, args: argparse.Namespace) -> str:
    rows = [("NAME", "MASTERS", "HOLDER", "READERS")]
    rows += [
        (
            shown(state.resource),
            _masters_cell(state),
            _holder_cell(state, listing.quorum),
            _readers_cell(state, listing.quorum),
        )
        for state in listing.locks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    table = ["  ".join(map(str.ljust, row, widths)).rstrip() for row in rows]
    return "\n".join([*(table if listing.locks else []), _summary(listing, args)])


def _summary(listing: Listing, args: argparse.Namespace) -> str:
    """The last line: the locks held on a quorum, then, apart, those found on fewer
    masters (a row of theirs says "(no majority)", or "-" when found only where its
    state was not read), which are not held, and those too few masters could be read
    to tell ("(unknown)")."""
    held = sum(1 for state in listing.locks if status_of(state, listing.quorum) is Status.HELD)
    summary = f"{held} lock{'' if held == 1 else 's'} matching {args.pattern!r} held"
    summary += f" on {masters(len(listing.scans))}"
    if minority := len(listing.locks) - held - listing.unknown:
        summary += f", {minority} without a majority"
    if listing.unknown:
        summary += f", {listing.unknown} unknown"
    return summary + f" ({listing.answered} answered, quorum {listing.quorum})"


def _listing_json(listing: Listing, args: argparse.Namespace) -> str:
    document = {
        "pattern": args.pattern,
        "prefix": args.prefix,
        "quorum": listing.quorum,
        "answered": listing.answered,
        "masters": [
            {"node": scan.node, "error": scan.error, "truncated": scan.truncated}
            for scan in listing.scans
        ],
        "locks": [_lock_json(state, listing.quorum) for state in listing.locks],
    }
    return json.dumps(document, indent=2)


def _lock_json(state: LockState, quorum: int) -> dict[str, Any]:
    readers = Counter(value for node in state.nodes for value, _ in node.readers)
    return {
        "name": state.resource,
        "key": state.key,
        "status": status_of(state, quorum).name.lower(),
        "held_on": _held_on(state),
        "unread": [{"node": node.node, "error": node.error} for node in _unread(state)],
        "holder": state.holder,
        "identity": state.identity,
        "readers": [
            {"value": value, "identity": identity_of(value), "on": on}
            for value, on in sorted(readers.items())
        ],
    }
