"""The command line: ``python -m asyncredlock`` or ``asyncredlock``.

```
asyncredlock --version
asyncredlock demo [--servers N] [--requests N] [--limit N]
asyncredlock inspect NAME --master URL [--master URL ...] [--json]
asyncredlock force-release NAME --masters URL,URL,... [--yes]
asyncredlock list [PATTERN] --master URL ... [--max-keys N] [--json]
asyncredlock watch NAME --master URL ... [--interval SECONDS] [--count N]
```

Masters come from ``--master`` (repeatable) and ``--masters`` (comma-separated), or
else from the ``REDLOCK_MASTERS`` environment variable (separated by commas or
whitespace);
``--prefix`` and ``--node-timeout`` apply to every command that reads them.
``demo --masters N`` is a deprecated spelling of ``demo --servers N``.

Exit codes:

- 0: success; ``inspect``: the lock is held (a value, or a reader, on a quorum);
  ``force-release``: a key was deleted (whatever its status, it names each master
  that failed or did not answer in a warning on stderr); ``list``: listed, even
  when nothing is held; ``watch``: ``--count`` lines printed.
- 1: ``inspect``: the lock is free; ``force-release``: there was nothing to delete,
  or the confirmation was declined; ``demo``: the locked round was wrong, or a
  dependency is missing.
- 2: bad usage (no masters, a malformed URL, a bad option, a name asyncredlock
  refuses).
- 3: too few masters answered: ``inspect`` cannot tell (fewer than a quorum
  answered, or those that did not could make a quorum with a value seen);
  ``force-release``: too many failed, the lock may still be held; ``list``: fewer
  than a quorum answered, or a lock listed could not be read on enough masters to
  tell whether it is held (its holder reads ``(unknown)``).
- 130: interrupted (Ctrl-C): at once, without waiting for a master's reply still out
  (an interrupted ``force-release`` may have deleted the key on some masters only:
  run it again).
- 141: standard output was a pipe whose reader went away (``watch NAME | head -n1``):
  nothing more is printed, no error either (128 + SIGPIPE, as a shell reports a
  command that SIGPIPE killed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__
from ._cli.common import (
    EXIT_CLOSED_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    MASTERS_ENV,
    PROG,
    Parser,
    Subcommands,
    UsageError,
    count,
    fail,
    master_options,
)
from ._cli.listing import add_list
from ._cli.state import add_force_release, add_inspect
from ._cli.watch import add_watch

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status (see the module docstring).
    """
    try:
        code = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here, not as the interpreter exits
    except BrokenPipeError:
        return _closed_pipe()
    return code


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except UsageError as exc:
        return fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_INTERRUPTED)


def _closed_pipe() -> int:
    """Standard output's reader went away (``asyncredlock watch NAME | head -n1``):
    end quietly, with the status a shell gives a command killed by SIGPIPE."""
    # What is still buffered goes nowhere, rather than fail again as Python exits
    # (see "Note on SIGPIPE" in the docs of the signal module).
    with contextlib.suppress(OSError, ValueError):  # not a file (a test's capture)
        stdout = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout)
        os.close(devnull)
    return EXIT_CLOSED_PIPE


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``asyncredlock`` command."""
    parser = Parser(
        prog=PROG,
        description="Distributed locks over N Redis/Valkey masters (Redlock).",
        epilog=(
            f"Masters may also be given in ${MASTERS_ENV} (URLs separated by commas or whitespace)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    _add_demo(commands)
    options = master_options()
    add_inspect(commands, options)
    add_force_release(commands, options)
    add_list(commands, options)
    add_watch(commands, options)
    return parser


# -- demo ------------------------------------------------------------------------------


class _DeprecatedAlias(argparse.Action):
    """Stores like its option's new spelling (given as ``const``), and says so on stderr."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(
            f"{parser.prog}: warning: {option_string} is deprecated, use {self.const}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def _add_demo(commands: Subcommands) -> None:
    demo = commands.add_parser(
        "demo",
        help="replay the /items race without and with a lock, on local servers",
        description="Start local servers, run a FastAPI app's check-then-append under "
        "concurrent requests without and with a lock, and compare. Exit 0 when the "
        "locked run gave exactly the expected statuses.",
    )
    positive, natural = count(minimum=1), count(minimum=0)
    demo.add_argument(
        "--servers", type=positive, default=5, metavar="N", help="servers as Redlock masters (5)"
    )
    demo.add_argument(  # the old name, for a count where the other commands take URLs
        "--masters",
        dest="servers",
        type=positive,
        action=_DeprecatedAlias,
        const="--servers",
        help=argparse.SUPPRESS,
    )
    demo.add_argument("--requests", type=positive, default=5, metavar="N", help="requests (5)")
    demo.add_argument("--limit", type=natural, default=3, metavar="N", help="items allowed (3)")
    demo.set_defaults(command=_demo)


def _demo(args: argparse.Namespace) -> int:
    from .testing import ServerBinaryNotFoundError, ServerStartError
    from .testing._demo import DemoDependencyError, run_demo

    # sys.stdout as it is now: run_demo's default is the one at its import
    out = sys.stdout
    demo = run_demo(masters=args.servers, requests=args.requests, limit=args.limit, out=out)
    try:
        result = asyncio.run(demo)
    except (DemoDependencyError, ServerBinaryNotFoundError, ServerStartError) as exc:
        return fail(str(exc), EXIT_FAILURE)
    return EXIT_OK if result.lock_held_limit else EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
