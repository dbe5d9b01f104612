"""The results table of the fault-injection suite, written by the suite itself.

Each scenario `record`s what it expected and what the checker observed; at the end of
the session, if the environment variable ``CHAOS_REPORT`` names a file, the table is
written there (``nox -s chaos`` sets it to ``docs/guarantees-results.md``). Rerunning
the suite regenerates it; nothing in it is written by hand.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .harness import Outcome

REPORT_ENV = "CHAOS_REPORT"


@dataclass(frozen=True)
class Expected:
    """What a scenario expects: mutual exclusion broken (validity overlapping; for a
    semaphore, its bound: more than ``limit`` valid leases at once), updates lost,
    stale writes refused by the fence, and writes the resource accepted
    after the writer's validity (late writes: none unless said). A late write is
    outside what the overlap of valid leases can see, so one a scenario does not
    expect fails it as an unexpected overlap would."""

    violation: bool
    lost_updates: bool
    rejected: bool | None  # None: either (the scenario does not decide it)
    late_writes: bool = False


RESULTS: list[tuple[str, str, Expected, Outcome]] = []


def record(scenario: str, mode: str, expected: Expected, outcome: Outcome) -> None:
    RESULTS.append((scenario, mode, expected, outcome))


def _yes(value: bool | None) -> str:
    return "either" if value is None else "yes" if value else "no"


def matches(expected: Expected, o: Outcome) -> bool:
    """Whether the observed outcome is the expected one (and left nothing behind)."""
    return (
        o.violated == expected.violation
        and (o.lost_updates > 0) == expected.lost_updates
        and (o.late_writes > 0) == expected.late_writes
        and (expected.rejected is None or (o.rejected_writes > 0) == expected.rejected)
        and o.token_regressions == 0
        and o.orphans == 0
    )


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values) or "-"


def _at_once(o: Outcome) -> str:
    """A semaphore's limit and the most holders at once, valid / believed; a
    read-write lock's most readers at once."""
    if o.limit is not None:
        return f"limit {o.limit}: {o.most_valid} / {o.most_believed}"
    return f"readers: {o.most_valid} / {o.most_believed}" if o.most_believed else "-"


def table() -> str:
    lines = [
        "| scenario | client | expected: exclusion (a semaphore's bound) broken / updates "
        "lost / late writes / stale write refused "
        "| observed: validity overlaps / believed overlaps / lost updates / late writes "
        "/ refused / acknowledged, final "
        "| most at once, valid / believed: a semaphore's holders, a read-write lock's readers "
        "| orphan keys | loss reported after (s) "
        "| hand-over after (s) | as expected |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario, mode, expected, o in sorted(RESULTS, key=lambda r: (r[0], r[1] != "plain")):
        wanted = " / ".join(
            _yes(v)
            for v in (
                expected.violation,
                expected.lost_updates,
                expected.late_writes,
                expected.rejected,
            )
        )
        seen = (
            f"{o.overlaps} / {o.believed} / {o.lost_updates} / {o.late_writes} / "
            f"{o.rejected_writes} / {o.acknowledged}, {o.final}"
        )
        lines.append(
            f"| {scenario} | {mode} | {wanted} | {seen} | {_at_once(o)} | {o.orphans} "
            f"| {_seconds(o.detection)} "
            f"| {_seconds(o.handover)} | {_yes(matches(expected, o))} |"
        )
    return "\n".join(lines)


def write(path: Path) -> None:
    when = datetime.now(UTC).isoformat(timespec="seconds")
    text = (
        "# Guarantees: results of the fault-injection suite\n\n"
        "Produced by `tests/chaos` (`nox -s chaos`), not written by hand: each scenario"
        " runs client processes against five real masters, injects its fault at a"
        " point the clients report, and checks the merged history (see"
        " [Guarantees](guarantees.md)). *Plain*: `fencing=False`, the counter written"
        " with a plain `SET`; *fenced*: the counter in the library's `FencedStore`,"
        " read with the token (`read(key, token)`) and written with it (readers of a"
        " read-write lock have no token: they read without one). *Loss reported"
        " after*: from when a lost lease's holder could know (it resumed, or its"
        " validity, as last extended, ended) to the report; *hand-over after*: from a"
        " holder's last write (its release follows) to the next holder's acquisition."
        " A lease is *valid* until the end of validity in force: the one reported at"
        " its acquisition, then the one each successful extension granted, from when"
        " it was granted (a lease extending itself is measured over its whole hold);"
        " *late writes*: writes the resource accepted after that. *Semaphore* rows:"
        " clients holding slots of `semaphore(name, 2)`, plain only (a slot's lease"
        " carries no token), each incrementing the counter with `INCR` (holders at once"
        " lose nothing of each other's); there an overlap is a group of limit + 1"
        " holders at one moment (each such group counted), valid or believed, and the"
        " most-at-once column gives the most holders at once. *Read-write lock* rows:"
        " clients holding `rwlock(name).read()` (they read the counter, and read it"
        " again instead of writing) or `.write()` (they increment it); readers may"
        " overlap each other, so an overlap is a writer's with anyone, and the"
        " most-at-once column gives the most readers holding at once.\n\n"
        f"Run {when}, Python {platform.python_version()}, {platform.platform()}.\n\n"
        + table()
        + "\n"
    )
    path.write_text(text, encoding="utf-8")


def write_if_asked() -> None:
    target = os.environ.get(REPORT_ENV)
    if target and RESULTS:
        write(Path(target))
