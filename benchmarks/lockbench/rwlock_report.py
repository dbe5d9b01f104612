"""The read-write lock benchmark's report: from its results (``rwlock.json``) to the
markdown tables, the plot and the docs page.

``rwlock.py`` measures and writes the JSON through `write_outputs`; ``python
benchmarks/rwlock.py --report results/rwlock.json`` runs this step alone on results
already written. The types here are the JSON's shape, for both.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TypedDict

from .harness import Environment, Summary, publish_section, pyplot, write_json, write_text

MARKER = "<!-- RWLOCK-BENCH -->"


class ReadRate(TypedDict):
    """Locks of one resource per second, by ``concurrency`` tasks of one client."""

    concurrency: int
    cycles: int
    cycles_per_s: float
    cpu_s_per_1000: float
    acquire: Summary
    handoffs: int


class WriterWait(TypedDict):
    """A writer among readers that keep the lock read without a gap."""

    options: dict[str, str | bool]  # the rwlock's fairness options (a float as a string)
    writes: int
    writer_timeouts: int
    writer_wait: Summary | None  # None: it never wrote
    reads: int
    reads_per_s: float


class RWLockReport(TypedDict):
    """``rwlock.json``."""

    environment: Environment
    masters: int
    seconds_per_case: float
    quick: bool
    readers: dict[str, ReadRate]  # by "read xN" / "exclusive xN"
    writer_wait: dict[str, WriterWait]  # by mode


def readers_table(report: RWLockReport) -> list[str]:
    """The lines of the readers-per-second section."""
    lines = [
        "### Readers per second",
        "",
        f"N = {report['masters']} masters on loopback; each case runs"
        f" {report['seconds_per_case']:g} s. A cycle is acquire + release of one"
        " resource; `read` cycles run together, `exclusive` ones (the same tasks on"
        " `lock()`) one at a time, passed on inside the process.",
        "",
        "| Case | cycles/s | acquire p50 (ms) | acquire p99 (ms) | CPU s / 1,000 cycles |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, r in report["readers"].items():
        lines.append(
            f"| {name} | {r['cycles_per_s']:,.0f} | {r['acquire']['p50_ms']:.2f}"
            f" | {r['acquire']['p99_ms']:.2f} | {r['cpu_s_per_1000']:.3f} |"
        )
    return lines


def writers_table(report: RWLockReport) -> list[str]:
    """The lines of the writer-wait section."""
    lines = [
        "### Writer wait under reader load",
        "",
        "8 readers of one client keep the resource read (each holds 5 ms, staggered so"
        " that their holds overlap); a writer of another client writes (1 ms) again and"
        " again, each `acquire()` waiting at most until the end of the case (so the last"
        " one of each case times out).",
        "",
        "| Mode | writes | writer timeouts | writer wait p50 (ms) | p99 (ms) | reads/s |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for mode, w in report["writer_wait"].items():
        wait = w["writer_wait"]
        p50 = "-" if wait is None else f"{wait['p50_ms']:.1f}"
        p99 = "-" if wait is None else f"{wait['p99_ms']:.1f}"
        lines.append(
            f"| {mode} | {w['writes']} | {w['writer_timeouts']} | {p50} | {p99}"
            f" | {w['reads_per_s']:,.0f} |"
        )
    return lines


def table(report: RWLockReport) -> str:
    """The results page, which is also the docs section: both tables, the machine,
    the plot and how to rerun."""
    env = report["environment"]
    lines = [
        *readers_table(report),
        "",
        *writers_table(report),
        "",
        f"Measured {env['date']} on {env['cpu_count']} CPUs ({env['cpu_model']}),"
        f" {env['platform']}; Python {env['python']}, redis-py {env['redis_py']},"
        f" {env['server']}, asyncredlock {env['asyncredlock']}."
        + (" Quick run: too short to compare." if report["quick"] else ""),
        "",
        "![read-write lock benchmark](img/rwlock.png)",
        "",
        "Rerun (about 2 minutes): `python benchmarks/rwlock.py --docs docs`.",
    ]
    return "\n".join(lines) + "\n"


def plot(report: RWLockReport, path: Path) -> None:
    """Read cycles/s per case, and the writer's p50 wait per mode (log scale)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(report["readers"])
    left.bar(names, [report["readers"][n]["cycles_per_s"] for n in names], color="#4477aa")
    left.set_ylabel("cycles/s")
    left.set_title(f"read vs exclusive, N={report['masters']}")
    left.tick_params(axis="x", rotation=30)
    modes = list(report["writer_wait"])
    waits = [w["p50_ms"] if (w := report["writer_wait"][m]["writer_wait"]) else 0.0 for m in modes]
    right.bar(modes, waits, color="#cc6677")
    right.set_yscale("log")
    right.set_ylabel("writer wait p50 (ms, log scale)")
    right.set_title("writer under a stream of readers")
    right.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(report: RWLockReport, out: Path, docs: Path | None) -> None:
    """JSON, markdown and PNG into ``out``; the plot and the section into ``docs``
    (``img/rwlock.png``, ``rwlock.md`` after its ``<!-- RWLOCK-BENCH -->`` line) if given."""
    text = table(report)
    write_json(out / "rwlock.json", report)
    write_text(out / "rwlock.md", text)
    plot(report, out / "rwlock.png")
    if docs is not None:
        (docs / "img").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "rwlock.png", docs / "img" / "rwlock.png")
        publish_section(docs / "rwlock.md", MARKER, text)
