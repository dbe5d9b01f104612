"""Every benchmark script's report step (``--report JSON``): it measures nothing and,
from the results it published, writes the same files again; and what the peers report
writes from the results (notes, ratios, cells)."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def report(script: str, results: str, out: Path, *extra: str) -> str:
    """Run ``script``'s report step on a published ``results`` file; its output."""
    command = [sys.executable, str(ROOT / "benchmarks" / script)]
    proc = subprocess.run(
        [*command, "--report", str(RESULTS / results), "--out", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize(
    ("script", "name"),
    [
        ("peers.py", "peers"),
        ("fanout.py", "fanout"),
        ("rwlock.py", "rwlock"),
        ("handover.py", "handover"),
        ("handover.py", "handover-query"),
        ("profile_throughput.py", "profile_throughput"),
    ],
)
def test_the_report_step_writes_the_published_files_again(
    tmp_path: Path, script: str, name: str
) -> None:
    report(script, f"{name}.json", tmp_path)
    assert (tmp_path / f"{name}.json").read_text() == (RESULTS / f"{name}.json").read_text()
    assert (tmp_path / f"{name}.md").read_text() == (RESULTS / f"{name}.md").read_text()


@pytest.mark.parametrize("name", ["transport", "transport-uvloop"])
def test_the_transport_report_keeps_its_event_loop(tmp_path: Path, name: str) -> None:
    """Each event loop's results go to its own files (the asyncio results were written
    before the title named the loop: only the table is compared)."""
    report("transport.py", f"{name}.json", tmp_path)
    assert (tmp_path / f"{name}.json").read_text() == (RESULTS / f"{name}.json").read_text()
    ours = (tmp_path / f"{name}.md").read_text().split("\n", 1)[1]
    published = (RESULTS / f"{name}.md").read_text().split("\n", 1)[1]
    assert ours == published


def test_the_peers_report_rewrites_its_docs_section_and_checks_the_targets(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copyfile(ROOT / "docs" / "peers.md", docs / "peers.md")
    printed = report("peers.py", "peers.json", tmp_path, "--docs", str(docs))
    assert (docs / "peers.md").read_text() == (ROOT / "docs" / "peers.md").read_text()
    assert (tmp_path / "peers.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    published = (RESULTS / "peers.md").read_text()
    (count,) = [line for line in published.splitlines() if line.startswith("Met ")]
    assert count in printed  # the targets, checked again from the JSON


@pytest.fixture
def peers_report(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("lockbench.peers_report")


def test_the_peers_notes_say_asyncredlock_has_one_connection_per_master(
    peers_report: ModuleType,
) -> None:
    """asyncredlock ignores max_connections (deprecated; the run records null) and
    reaches each master over one connection: the notes must not say it has the
    peers' pool of ``pool`` connections."""
    results = json.loads((RESULTS / "peers.json").read_text())
    recorded = results["libraries"]["asyncredlock"]["settings"]["uncontended"]["AsyncRedlock"]
    assert recorded["max_connections"] is None
    notes = peers_report.notes(results)
    assert "asyncredlock reaches each master over one connection" in notes
    assert f"Every peer gets a pool of up to {results['settings']['pool']}" in notes
    assert "asyncredlock's default" not in notes


def test_the_ratio_line_prints_a_small_ratio_with_its_digits(peers_report: ModuleType) -> None:
    """docs/peers.md e, N=5 read "asyncredlock 0.16 (0.00x) vs ... pottery 75.44": every
    ratio had two decimals. Below 0.1 a ratio keeps two significant digits."""
    infos = {
        "asyncredlock": {"label": "asyncredlock"},
        "pottery": {"label": "pottery AIORedlock"},
    }
    line = peers_report.ratio_line("N=5", {"asyncredlock": 0.16}, {"pottery": 75.44}, infos, True)
    assert "asyncredlock 0.16 (0.0021x)" in line, line
    assert peers_report.times(0.0287) == "0.029x"
    assert peers_report.times(0.71) == "0.71x"


def test_the_summary_calls_values_equal_when_they_show_equal(peers_report: ModuleType) -> None:
    """README summary, a N=1 RTT 2 ms read "5.01 | redis-py Lock 5.01 | 1.00x slower":
    the comparison was of the unrounded values. Values that show the same are equal."""
    infos = {
        "asyncredlock": {"label": "asyncredlock"},
        "redis-py": {"label": "redis-py Lock"},
    }
    case = {
        "name": "N=1, RTT 2 ms",
        "results": {
            "asyncredlock": {"status": "ok", "total": {"p50_ms": 5.0104}},
            "redis-py": {"status": "ok", "total": {"p50_ms": 5.0101}},
        },
    }
    cells = peers_report.summary_cells("a", case, infos, True)
    assert cells == "5.01 | redis-py Lock 5.01 | equal at this precision"


def summary(iterations: int) -> dict[str, float]:
    return {"iterations": iterations, "p50_ms": 1.0, "p99_ms": 2.0, "max_ms": 2.5}


def test_a_p99_from_fewer_than_100_samples_is_not_shown(peers_report: ModuleType) -> None:
    """docs/peers.md b showed pottery's p50/p99 from 3 acquires as "5007.40 / 5007.68 (3
    ok)": a p99 of 3 samples is their largest. Below 100 samples the cell says n/a
    (with the count, unless the cell has it already); the p50 stays."""
    b = {
        "status": "ok",
        "succeeded": 3,
        "failures": 0,
        "acquire": summary(3),
    }
    assert peers_report.cell(b) == "1.00 / n/a (3 ok)"
    assert peers_report.cell({"status": "ok", "wake": summary(60)}) == "1.00 / n/a (60 samples)"
    a = {"status": "ok", "total": summary(100), "acquire": summary(100), "release": summary(100)}
    assert peers_report.cell(a) == "1.00 / 2.00"


# The generated parts of docs/peers.md: the hand-over tables, and all after the marker.
GENERATED = re.compile(
    r"(<!-- (HANDOVER-FLOOR|HANDOVER-QUERY) -->.*?<!-- /\2 -->|<!-- PEERS-TABLE -->.*)", re.S
)
# A number precise enough to drift: with decimals, with thousands separators, or of
# three digits or more (not a date, nor in `code`).
NUMBER = re.compile(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+|\d{3,}")


def missing_numbers(sentence: str, tables: str) -> list[str]:
    """Each number ``sentence`` quotes that ``tables`` do not hold."""
    bare = re.sub(r"`[^`]*`|\d{4}-\d{2}-\d{2}", " ", sentence)
    return [
        f"{number}: {sentence[:120]}"
        for number in NUMBER.findall(bare)
        if not re.search(rf"(?<![\d.,]){re.escape(number)}(?!\d|[.,]\d)", tables)
    ]


def numbers_not_below(page: str) -> list[str]:
    """Each number a hand-written sentence quotes from "the run below" (or "the table
    below") that the generated text below it does not hold."""
    segments, pos = [], 0
    for match in GENERATED.finditer(page):
        segments += [("prose", page[pos : match.start()]), ("generated", match.group(0))]
        pos = match.end()
    segments.append(("prose", page[pos:]))
    stale = []
    for k, (kind, text) in enumerate(segments):
        if kind != "prose":
            continue
        below = " ".join(t for later, t in segments[k + 1 :] if later == "generated")
        for paragraph in re.split(r"\n\s*\n", text):
            for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", paragraph)):
                if re.search(r"\b(run|tables?) below\b", sentence):
                    stale += missing_numbers(sentence, below)
    return stale


#: A README sentence that quotes the generated tables of docs/peers.md.
CITES_PEERS = re.compile(r"\btables? in docs/peers\.md\b")


def numbers_not_in_peers(readme: str, page: str) -> tuple[int, list[str]]:
    """The README's sentences that cite "the table(s) in docs/peers.md" (a link's text
    read as plain text): how many there are, and each number they quote that the
    generated text of ``page`` (docs/peers.md) does not hold."""
    tables = " ".join(match.group(0) for match in GENERATED.finditer(page))
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", readme)
    cited, stale = 0, []
    for paragraph in re.split(r"\n\s*\n", text):
        for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", paragraph)):
            if CITES_PEERS.search(sentence):
                cited += 1
                stale += missing_numbers(sentence, tables)
    return cited, stale


def test_the_check_of_the_prose_finds_a_number_the_tables_do_not_hold() -> None:
    page = (
        "Prose. In the run below, 825 acquisitions/s (1.66x). Earlier, 1.60x.\n\n"
        "<!-- PEERS-TABLE -->\n| asyncredlock | 832 | 1.63x | 825.5 |\n"
    )
    assert numbers_not_below(page) == [
        "825: In the run below, 825 acquisitions/s (1.66x).",
        "1.66: In the run below, 825 acquisitions/s (1.66x).",
    ]


def test_the_prose_of_docs_peers_md_quotes_only_numbers_of_the_run_below() -> None:
    """docs/peers.md's hand-written paragraphs quoted "the run below" with numbers of
    another run (d at N = 5: 825/s and 1.66x against the table's 832/s and 1.63x; c at
    N = 1, d with a client per worker, d with 10 processes, a at N = 5). A sentence that
    speaks of the run (or table) below may quote only numbers the generated text below
    it holds; better, it points to the table."""
    assert numbers_not_below((ROOT / "docs" / "peers.md").read_text()) == []


def test_the_check_of_the_readme_finds_a_number_the_peers_tables_do_not_hold() -> None:
    readme = "Prose, 1.60x. In its tables in [docs/peers.md](x.md), 1.36x and 1.6x (0.69 ms).\n"
    page = "Prose 1.6x.\n\n<!-- PEERS-TABLE -->\n| 1.36x | 0.69 |\n"
    assert numbers_not_in_peers(readme, page) == (
        1,
        ["1.6: In its tables in docs/peers.md, 1.36x and 1.6x (0.69 ms)."],
    )


def test_the_readme_quotes_only_numbers_of_the_tables_in_docs_peers_md() -> None:
    """README.md's hand-over paragraph quoted "1.4-1.6x aioredlock's rate", hand-overs of
    "0.8-1.0 ms" against "1.0-1.2" and holds of "1.3-1.4 against 1.1 ms", numbers of
    neither published hand-over table (1.36x and 1.43x; 0.69 and 0.72 ms against 0.79
    and 0.84; 1.25 against 1.11 ms). A README sentence that cites the tables in
    docs/peers.md may quote only numbers their generated text holds; the hand-over
    paragraph cites them."""
    readme = (ROOT / "README.md").read_text()
    cited, stale = numbers_not_in_peers(readme, (ROOT / "docs" / "peers.md").read_text())
    assert cited >= 1, "no README sentence cites the tables in docs/peers.md"
    assert stale == []
