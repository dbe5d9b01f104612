"""The fan-out benchmark's report: from its results (``fanout.json``) to the markdown
table, the findings, the plot, the docs section and the README summary.

``fanout.py`` measures and writes the JSON, then calls `write_outputs`; ``python
benchmarks/fanout.py --report results/fanout.json`` runs this step alone on results
already written. The JSON's records are typed here (`FanoutReport` and the records it
holds), with the names of the methods measured, which both steps use.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from .harness import (
    P99_MIN_SAMPLES,
    Environment,
    Summary,
    machine_line,
    p99_text,
    publish_between,
    publish_section,
    pyplot,
    write_json,
    write_text,
)

MARKER = "<!-- BENCH-TABLE -->"
SUMMARY_START = "<!-- BENCH-SUMMARY -->"
SUMMARY_END = "<!-- /BENCH-SUMMARY -->"

METHODS = ("sequential", "asyncredlock", "asyncredlock_fenced", "asyncredlock_fenced_apart")
LABELS = {
    "sequential": "sequential",
    "asyncredlock": "asyncredlock",
    "asyncredlock_fenced": "asyncredlock fenced",
    "asyncredlock_fenced_apart": "asyncredlock fenced, counters apart",
}
#: The fenced methods, and how many rounds each is expected to add to plain Redlock:
#: none when the fence counters are in step (the commit round is skipped), one when
#: they are apart (the commit round runs).
EXTRA_ROUNDS = {"asyncredlock_fenced": 0, "asyncredlock_fenced_apart": 1}
COUNTERS = {"asyncredlock_fenced": "in step", "asyncredlock_fenced_apart": "apart"}
NOT_MEASURED = "n/a"  # in a table cell
# A fencing cost more than FENCING_TOLERANCE round trips off the expected number of
# extra rounds is reported, as are the cases of the headline.
FENCING_TOLERANCE = 0.5
FENCING_HEADLINE_NS = (3, 5)
FENCING_HEADLINE_RTTS_MS = (2.0, 10.0)

RELEASE_NOTE = (
    "asyncredlock's release() returns once a quorum of masters confirmed; the other "
    "masters are released in the background, so its times do not include them. The "
    "sequential loop waits for every master, as the textbook does."
)
FENCING_NOTE = (
    "asyncredlock runs with fencing=False (plain Redlock, one round over the masters), "
    "like for like with the sequential loop. asyncredlock fenced is the same client with "
    "fencing on, taking the same lock again and again: its fence counters stay in step, "
    "a quorum of masters returns the token itself in the first round, and the commit "
    "round is skipped. asyncredlock fenced, counters apart is the same, but before each "
    "acquisition (outside the timed region, over direct connections that bypass the "
    "proxies) the key's fence counter on master i is set to top + 1 + i (top: the "
    "largest), so no two masters count the same token and the commit round runs, as "
    "after contention, on a master that missed rounds, or for a new resource. Fencing "
    "cost: a fenced p50 minus asyncredlock p50, in ms and in round trips (RTTs: the "
    "PING p50 measured through one proxy at that RTT); expected about 0 RTT in step, "
    "about 1 RTT (the commit round) apart. The benchmark counts the commit rounds each "
    "fenced acquisition ran."
)
APART_NOTE = (
    "With one master the counters cannot be apart (a quorum of one returns the token "
    "itself every time, so the commit round never runs): the counters-apart method is "
    "not measured at N=1."
)


# --- the JSON --------------------------------------------------------------------------


class SettingsRecord(TypedDict):
    """What every client of the run got."""

    ttl_s: float  # the lock's time to live
    node_timeout_s: float  # per-master timeout of every client
    seed: int  # seeds `random`, which asyncredlock's retry jitter draws from


class PlanRecord(TypedDict):
    """How many iterations the run measured, and how it interleaved them."""

    quick: bool
    iterations_by_rtt_ms: dict[str, int]  # per nominal RTT, e.g. "2"
    blackhole_iterations: int
    warmup: int
    block: int


class MethodRecord(TypedDict):
    """One method's latencies in one case: acquire + release, and each phase."""

    total: Summary
    acquire: Summary
    release: Summary


class FencingRecord(TypedDict):
    """What fencing cost one fenced method over plain asyncredlock in one case."""

    counters: str  # "in step" or "apart"
    extra_rounds_expected: int  # rounds it should add to plain Redlock: 0 or 1
    commit_rounds: int  # run by the measured acquisitions (not the warm-up)
    acquisitions: int
    cost_p50_ms: float  # fenced p50 - unfenced p50
    cost_rtts: float  # that in round trips of this RTT (PING p50)
    acquire_ratio: float  # fenced acquire p50 / unfenced: 1 is no more round, 2 one more
    release_cost_p50_ms: float  # fenced release p50 - unfenced (should be about 0)


#: ``AsyncRedlock.statistics()`` of one client at the end of a case, by field name.
ClientStatistics = dict[str, int]


class ApartStatistics(TypedDict, total=False):
    """The counters-apart client's statistics, in the cases that measured it (N > 1)."""

    asyncredlock_fenced_apart_statistics: ClientStatistics


class CaseRecord(ApartStatistics):
    """One case: its setup, each method's latencies, and what fencing cost.

    The ``*_statistics`` of each asyncredlock client count the warm-up too; their
    gauges (in_flight, background_tasks) are taken right after the last iteration,
    before the client is closed.
    """

    name: str
    n: int  # masters
    rtt_ms: float  # nominal delay the proxies add
    blackholed: bool  # one master silent
    iterations: int  # measured per method
    methods: dict[str, MethodRecord]  # per method measured in the case
    asyncredlock_statistics: ClientStatistics
    asyncredlock_fenced_statistics: ClientStatistics
    speedup_p50: float  # sequential p50 / asyncredlock p50
    measured_rtt_p50_ms: float  # the PING p50 at this RTT: the fencing cost's unit
    fencing: dict[str, FencingRecord]  # per fenced method measured in the case
    seconds: float


class FanoutReport(TypedDict):
    """``fanout.json``: what was run, on what, and what came out."""

    benchmark: str
    unit: str
    measures: str
    methods: dict[str, str]  # label per method
    notes: list[str]
    settings: SettingsRecord
    plan: PlanRecord
    environment: Environment
    measured_rtt: dict[str, Summary]  # PING through one proxy, per nominal RTT
    cases: list[CaseRecord]
    seconds: float


def method_notes(settings: SettingsRecord) -> list[str]:
    """How the methods were measured, one note each (the JSON keeps them too)."""
    timeout = settings["node_timeout_s"]
    sequential = (
        f"sequential: SET NX PX then a compare-and-delete EVAL, one master at a time, each "
        f"under asyncio.wait_for({timeout:g} s), redis-py retries off; a blackholed "
        f"master costs that timeout once in acquire and once in release."
    )
    return [RELEASE_NOTE, sequential, FENCING_NOTE, APART_NOTE]


# --- tables ----------------------------------------------------------------------------


def markdown_table(cases: Sequence[CaseRecord]) -> str:
    """Rows = cases; acquire + release latency of the four methods, the p50 speed-up
    (sequential / asyncredlock) and the fencing cost of each fenced method (its p50 -
    asyncredlock p50, in round trips)."""
    head = (
        "| Case | N | RTT (ms) | sequential p50 (ms) | sequential p99 (ms) "
        "| asyncredlock p50 (ms) | asyncredlock p99 (ms) | speed-up (p50) "
        "| asyncredlock fenced p50 (ms) | asyncredlock fenced p99 (ms) "
        "| fencing cost, in step (RTTs) "
        "| fenced, counters apart p50 (ms) | fenced, counters apart p99 (ms) "
        "| fencing cost, apart (RTTs) |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    rows = []
    for c in cases:
        seq, par = (c["methods"][m]["total"] for m in ("sequential", "asyncredlock"))
        fenced = " | ".join(
            fenced_cells(c, m) if m in c["methods"] else " | ".join([NOT_MEASURED] * 3)
            for m in EXTRA_ROUNDS
        )
        rtt = f"{c['rtt_ms']:g}"
        case = "1 of 5 blackholed" if c["blackholed"] else "all up"
        rows.append(
            f"| {case} | {c['n']} | {rtt} | {seq['p50_ms']:.2f} | {p99_text(seq, counted=True)} "
            f"| {par['p50_ms']:.2f} | {p99_text(par, counted=True)} | {c['speedup_p50']:.2f}x "
            f"| {fenced} |"
        )
    return head + "\n".join(rows) + "\n"


def fenced_cells(case: CaseRecord, method: str) -> str:
    """p50, p99 and fencing cost in RTTs of one fenced method in one case."""
    total = case["methods"][method]["total"]
    cost = case["fencing"][method]["cost_rtts"]
    return f"{total['p50_ms']:.2f} | {p99_text(total, counted=True)} | {cost:+.2f}"


def summary_table(report: FanoutReport) -> str:
    """The README's excerpt: p50 of the four methods for N = 3 and 5 and the blackhole
    case, with where and when it was measured."""
    head = (
        "| Case | N | RTT (ms) | sequential p50 (ms) | asyncredlock p50 (ms) "
        "| speed-up (p50) | asyncredlock fenced p50 (ms) | fenced, counters apart p50 (ms) |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    rows = []
    for c in report["cases"]:
        if c["n"] not in (3, 5):
            continue
        seq, par, fenced, apart = (
            f"{c['methods'][m]['total']['p50_ms']:.2f}" if m in c["methods"] else NOT_MEASURED
            for m in METHODS
        )
        case = "1 of 5 blackholed" if c["blackholed"] else "all up"
        rows.append(
            f"| {case} | {c['n']} | {c['rtt_ms']:g} | {seq} | {par} "
            f"| {c['speedup_p50']:.2f}x | {fenced} | {apart} |"
        )
    return (
        head
        + "\n".join(rows)
        + "\n\nAcquire + release, p50 in milliseconds. asyncredlock fenced: fence counters "
        + "in step, the usual case, so the commit round is skipped; counters apart (after "
        + "contention, a master that missed rounds, a new resource): the commit round "
        + "runs. Every case, p99 and the notes: "
        + "[docs/benchmarks.md](docs/benchmarks.md). "
        + machine_line(report["environment"])
        + "\n"
    )


# --- notes and findings ----------------------------------------------------------------


def notes(report: FanoutReport) -> str:
    """What the table measured, under it."""
    rtt = ", ".join(f"{k} ms → {v['p50_ms']:.2f} ms" for k, v in report["measured_rtt"].items())
    iters = sorted({c["iterations"] for c in report["cases"]}, reverse=True)
    release, sequential, fencing, apart = method_notes(report["settings"])
    return (
        "Acquire + release of one uncontended lock, in milliseconds. "
        f"Iterations per method and case: {', '.join(map(str, iters))} "
        f"(after {report['plan']['warmup']} warm-up iterations). A p99 is shown from "
        f"{P99_MIN_SAMPLES} samples up, and n/a below (from fewer it is about the largest "
        "sample; the JSON has it, and the max).\n\n"
        f"- {release}\n"
        f"- {sequential}\n"
        f"- {fencing} {apart}\n"
        f"- RTT is the delay the proxies add (nominal → PING p50 measured through one "
        f"proxy): {rtt}.\n" + "".join(f"- {line}\n" for line in findings(report["cases"]))
    )


def findings(cases: Sequence[CaseRecord]) -> list[str]:
    """Observations computed from the results: where the fan-out lost, which commit
    rounds ran, what fencing cost, what the blackhole left."""
    lines = []
    slower = [c for c in cases if c["speedup_p50"] < 1]
    if slower:
        where = "; ".join(f"{c['name']} ({c['speedup_p50']:.2f}x)" for c in slower)
        why = (
            " With one master there is nothing to overlap, so only the fan-out's own "
            "per-call work (a task per master, quorum bookkeeping, a Lua script instead "
            "of a bare SET) shows."
            if all(c["n"] == 1 for c in slower)
            else ""
        )
        lines.append(f"asyncredlock's p50 was higher than the sequential loop's in: {where}.{why}")
    if cases:
        lines.append(commits_finding(cases))
        lines.extend(fencing_finding(cases, method) for method in EXTRA_ROUNDS)
    lines.extend(blackhole_finding(c) for c in cases if c["blackholed"])
    return lines


def blackhole_finding(case: CaseRecord) -> str:
    """What the asyncredlock clients still had out at the end of a blackhole case."""
    plain = case["asyncredlock_statistics"]
    fenced = "; ".join(
        f"{LABELS[m]}: {g['in_flight']} and {g['background_tasks']}"
        for m, g in fenced_statistics(case).items()
    )
    return (
        f"At the end of the blackhole case asyncredlock had {plain['in_flight']} calls "
        f"in flight and {plain['background_tasks']} background tasks ({fenced}), "
        "mostly waiting on the silent master (each ends at the socket timeout, 5 s by "
        "default)."
    )


def fenced_statistics(case: CaseRecord) -> dict[str, ClientStatistics]:
    """The statistics of each fenced client measured in ``case``, by method."""
    stats = {"asyncredlock_fenced": case["asyncredlock_fenced_statistics"]}
    if (apart := case.get("asyncredlock_fenced_apart_statistics")) is not None:
        stats["asyncredlock_fenced_apart"] = apart
    return stats


def commits_finding(cases: Sequence[CaseRecord]) -> str:
    """How many commit rounds each fenced method ran, against none with the counters
    in step and one per acquisition with them apart; every case that differs."""
    parts, odd = [], []
    for method, extra in EXTRA_ROUNDS.items():
        records = [(c, c["fencing"][method]) for c in cases if method in c["fencing"]]
        if not records:
            continue
        ran = sum(f["commit_rounds"] for _, f in records)
        total = sum(f["acquisitions"] for _, f in records)
        expected = "one per acquisition" if extra else "none"
        parts.append(f"{LABELS[method]} {ran} of {total} (expected: {expected})")
        odd += [
            (method, f"{c['name']}: {LABELS[method]} {f['commit_rounds']} of {f['acquisitions']}")
            for c, f in records
            if f["commit_rounds"] != extra * f["acquisitions"]
        ]
    line = (
        "Commit rounds run by the measured acquisitions (counted in the client), over all "
        f"cases: {'; '.join(parts)}. "
    )
    if not odd:
        return line + (
            "So in every case the counters-in-step acquisitions skipped their commit "
            "round and the counters-apart ones ran it."
        )
    why = (
        " With the counters in step a commit round still runs when a master that "
        "answered early had missed a round: one whose release of the previous lease was "
        "still on its way when the next acquisition, sent right after the release "
        "returned at quorum, reached it refuses that acquisition and does not count its "
        "fence up."
        if any(EXTRA_ROUNDS[method] == 0 for method, _ in odd)
        else ""
    )
    return line + f"Cases that differ: {'; '.join(where for _, where in odd)}.{why}"


def fencing_finding(cases: Sequence[CaseRecord], method: str) -> str:
    """What fencing cost ``method`` in the headline cases, and every case more than
    the tolerance off its expected number of extra rounds."""
    extra = EXTRA_ROUNDS[method]
    cases = [c for c in cases if method in c["fencing"]]

    def cost(c: CaseRecord) -> str:
        f = c["fencing"][method]
        return f"{f['cost_p50_ms']:+.2f} ms ({f['cost_rtts']:+.2f} RTT)"

    headline = []
    for n in FENCING_HEADLINE_NS:
        row = [
            f"{cost(c)} at RTT {c['rtt_ms']:g} ms"
            for c in cases
            if c["n"] == n and c["rtt_ms"] in FENCING_HEADLINE_RTTS_MS and not c["blackholed"]
        ]
        if row:
            headline.append(f"N={n}: {', '.join(row)}")
    lo, hi = extra - FENCING_TOLERANCE, extra + FENCING_TOLERANCE
    off = [c for c in cases if not lo <= c["fencing"][method]["cost_rtts"] <= hi]
    line = (
        f"Fencing cost, counters {COUNTERS[method]} ({LABELS[method]} p50 - asyncredlock "
        f"p50; one RTT is the PING p50 at that RTT; expected about {extra} RTT): "
        f"{'; '.join(headline) or 'no headline case measured'}. "
    )
    if not off:
        what = (
            "costs about the one round trip of its commit round, nothing else"
            if extra
            else "costs no extra round trip: its commit round is skipped"
        )
        return line + f"Every case is within {lo:g} to {hi:g} RTT: fencing {what}."

    def gap(c: CaseRecord) -> str:
        diff = c["fencing"][method]["cost_rtts"] - extra
        return f"{abs(diff):.2f} RTT {'more' if diff > 0 else 'less'} than the {extra} expected"

    where = "; ".join(f"{c['name']}: {cost(c)}, {gap(c)}" for c in off)
    return line + f"Outside {lo:g} to {hi:g} RTT: {where}. {rounds_finding(off, method)}"


def rounds_finding(cases: Sequence[CaseRecord], method: str) -> str:
    """How ``method``'s acquire p50 compares with the unfenced one in ``cases``
    (``1 + extra`` times is exactly the expected extra rounds), and whether its
    release p50 differs by more than the tolerance (fencing adds nothing there)."""
    extra = EXTRA_ROUNDS[method]
    records = [(c, c["fencing"][method]) for c in cases]
    ratios = [f["acquire_ratio"] for _, f in records]
    other = [(c, f) for c, f in records if abs(f["acquire_ratio"] - 1 - extra) > FENCING_TOLERANCE]
    slower = [
        (c, f)
        for c, f in records
        if abs(f["release_cost_p50_ms"]) > FENCING_TOLERANCE * c["measured_rtt_p50_ms"]
    ]
    rounds = "one more acquisition round" if extra else "no more acquisition rounds"
    line = (
        f"In these, the {LABELS[method]} acquire p50 was {min(ratios):.2f} to "
        f"{max(ratios):.2f} times the unfenced one"
    )
    if not other and not slower:
        top = max(abs(f["release_cost_p50_ms"]) for _, f in records)
        why = (
            " A round over N masters waits for the quorum-th answer (plus the client's "
            "and the servers' work), so it takes longer than one PING through one proxy."
            if extra
            else " The difference lies within the one round (or is noise), not in a round "
            "of its own."
        )
        return f"{line} and the release p50 within {top:.2f} ms of it: {rounds}, nothing else.{why}"
    parts = [f"{line} (about {1 + extra} would be {rounds})."]
    if other:
        where = "; ".join(f"{c['name']} ({f['acquire_ratio']:.2f}x)" for c, f in other)
        parts.append(f"Not about {1 + extra} in: {where}.")
    if slower:
        parts.append(release_finding(slower, method))
    return " ".join(parts)


def release_finding(slower: Sequence[tuple[CaseRecord, FencingRecord]], method: str) -> str:
    """The cases where ``method``'s release p50 differed from the unfenced one by more
    than the tolerance."""
    where = "; ".join(
        f"{c['name']} ({f['release_cost_p50_ms']:+.2f} ms, "
        f"{f['release_cost_p50_ms'] / c['measured_rtt_p50_ms']:+.2f} RTT)"
        for c, f in slower
    )
    return (
        f"{LABELS[method]} release p50 minus the unfenced one, beyond "
        f"{FENCING_TOLERANCE:g} RTT: {where}."
    )


# --- pages -----------------------------------------------------------------------------


def markdown(report: FanoutReport) -> str:
    """``fanout.md``: the table, what it measured, and where."""
    return (
        "# Sequential vs parallel acquisition\n\n"
        + markdown_table(report["cases"])
        + "\n"
        + notes(report)
        + "\n"
        + machine_line(report["environment"])
        + "\n"
    )


def docs_section(report: FanoutReport) -> str:
    """The generated part of ``docs/benchmarks.md``."""
    return (
        markdown_table(report["cases"])
        + "\n"
        + notes(report)
        + "\n![Sequential vs parallel acquisition](img/fanout.png)\n\n"
        + machine_line(report["environment"])
        + "\n\nTo rerun (about 5 minutes; `--quick` for a smoke run of a few seconds):\n\n"
        + "```bash\npip install -e '.[bench]'\n"
        + "python benchmarks/fanout.py --out benchmarks/results \\\n"
        + "    --docs docs --readme README.md\n```\n"
    )


# --- the plot --------------------------------------------------------------------------

COLORS = {
    "sequential": "tab:gray",
    "asyncredlock": "tab:blue",
    "asyncredlock_fenced": "tab:red",
    "asyncredlock_fenced_apart": "tab:purple",
}
STYLES: dict[str, dict[str, str | float]] = {
    "sequential": {"linestyle": "--", "marker": "o", "markerfacecolor": "white"},
    "asyncredlock": {"linestyle": "-", "marker": "o"},
    "asyncredlock_fenced": {"linestyle": "-", "marker": "s", "markersize": 5},
    "asyncredlock_fenced_apart": {"linestyle": ":", "marker": "^", "markersize": 6},
}


def plot(cases: Sequence[CaseRecord], path: Path) -> None:
    """p50 acquire + release vs N: one panel per RTT, one line per method in each; the
    blackhole case starred in its RTT's panel; one legend for all."""
    plt = pyplot()
    rtts = sorted({c["rtt_ms"] for c in cases})
    fig, grid = plt.subplots(1, len(rtts), figsize=(13.5, 5.2), dpi=110, squeeze=False)
    axes = list(grid[0])
    ns = sorted({c["n"] for c in cases})
    for ax, rtt in zip(axes, rtts, strict=True):
        row = [c for c in cases if c["rtt_ms"] == rtt and not c["blackholed"]]
        for method in METHODS:
            plot_line(ax, row, method)
        mark_blackhole(ax, [c for c in cases if c["rtt_ms"] == rtt and c["blackholed"]])
        style_axes(ax, rtt, ns)
    axes[0].set_ylabel("acquire + release, p50 (ms, log scale)")
    fig.suptitle(
        "Sequential vs parallel Redlock acquisition, one uncontended lock "
        "(RTT: delay added by a proxy per master; lower is better)",
        fontsize=11,
    )
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:  # the blackhole star is only in its own panel
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_line(ax: Any, row: Sequence[CaseRecord], method: str) -> None:
    """One method at one RTT across N (where it was measured)."""
    row = [c for c in row if method in c["methods"]]
    if not row:
        return
    ax.plot(
        [c["n"] for c in row],
        [c["methods"][method]["total"]["p50_ms"] for c in row],
        color=COLORS[method],
        linewidth=1.8,
        label=LABELS[method],
        **STYLES[method],
    )


def mark_blackhole(ax: Any, cases: Sequence[CaseRecord]) -> None:
    """Stars for the blackhole case (one master silent), labelled with their p50; the
    lowest label goes under its star, the others above theirs."""
    for c in cases:
        ys = {m: c["methods"][m]["total"]["p50_ms"] for m in METHODS if m in c["methods"]}
        lowest = min(ys, key=ys.__getitem__)
        for method, y in ys.items():
            face = "white" if method == "sequential" else COLORS[method]
            ax.plot(
                [c["n"]],
                [y],
                marker="*",
                markersize=15,
                color=COLORS[method],
                markerfacecolor=face,
                linestyle="none",
                label=f"1 of {c['n']} masters blackholed" if method == METHODS[0] else None,
            )
            below = method == lowest
            ax.annotate(
                f"{'1 blackholed: ' if method == 'sequential' else ''}{y:.1f} ms",
                (c["n"], y),
                xytext=(-10, -5 if below else 5),
                textcoords="offset points",
                horizontalalignment="right",
                verticalalignment="top" if below else "bottom",
                fontsize=8,
                color=COLORS[method],
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
            )


def style_axes(ax: Any, rtt: float, ns: Sequence[int]) -> None:
    """Log-y with plain millisecond labels, the masters ``ns`` on x, the RTT as title,
    grid."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low / 1.3, high * 1.3)  # room for the blackhole labels
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
    ax.set_xticks(ns)
    ax.set_xlim(min(ns) - 0.4, max(ns) + 0.4)
    ax.set_xlabel("masters (N)")
    ax.set_title(f"RTT {rtt:g} ms", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def write_outputs(
    report: FanoutReport, out: Path, docs: Path | None, readme: Path | None = None
) -> None:
    """JSON, markdown and PNG into ``out``; the plot and section into ``docs`` and the
    summary into ``readme``, if given."""
    write_json(out / "fanout.json", report)
    write_text(out / "fanout.md", markdown(report))
    plot(report["cases"], out / "fanout.png")
    if docs is not None:
        (docs / "img").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "fanout.png", docs / "img" / "fanout.png")
        publish_section(docs / "benchmarks.md", MARKER, docs_section(report))
    if readme is not None:
        publish_between(readme, SUMMARY_START, SUMMARY_END, summary_table(report))
