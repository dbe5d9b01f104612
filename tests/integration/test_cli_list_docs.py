"""What the docs say about ``asyncredlock list`` (docs/usage.md, and
src/asyncredlock/__main__.py's docstring of the exit codes), checked against real
servers (from the docs review of 2026-11-29; each test quotes the page it checks)."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

import asyncredlock.__main__
from asyncredlock.testing import ServerGroup

from .conftest import Masters
from .test_cli_list import WAIT, cli, master_args, reader_urls, table

pytestmark = pytest.mark.anyio

USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


@pytest.fixture(autouse=True)
def _no_masters_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDLOCK_MASTERS", raising=False)


async def listed(
    servers: ServerGroup, masters: Masters, capsys: pytest.CaptureFixture[str], *, on: int
) -> tuple[int, str]:
    """``list`` of a lock key on the first ``on`` masters, which refuse the lister's
    EVALSHA there (its state unread there, its key scanned): exit status, stdout."""
    for client in masters.clients[:on]:
        await client.set("jobs:1", "v", px=60_000)
    async with reader_urls(servers.urls, refused=on) as urls:
        with anyio.fail_after(WAIT):
            status = await cli("list", *master_args(urls))
    return status, capsys.readouterr().out


def _list_paragraph() -> str:
    page = USAGE.read_text(encoding="utf-8")
    start = page.index("- **`list [PATTERN]`**")
    return " ".join(page[start : page.index("- **`watch NAME`**", start)].split())


async def test_a_lock_found_only_where_unread_is_described_as_its_row_reads(
    servers: ServerGroup, masters: Masters, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/usage.md (``list``): the last line counts apart the locks found on fewer
    than a quorum; a lock key on one master whose state that master cannot give (and
    on none of the others) is one of them: its row reads `0 of 5 (1 unread)`, holder
    `-`, no readers, and the exit status is 0. The page describes that row."""
    status, out = await listed(servers, masters, capsys, on=1)
    summary = out.splitlines()[-1]
    assert status == 0
    assert table(out) == {"jobs:1": ["0 of 5 (1 unread)", "-", "-"]}
    minority = re.search(r", (\d+) without a majority", summary)
    assert minority is not None, summary
    assert minority.group(1) == "1", summary
    assert "unknown" not in summary
    paragraph = _list_paragraph()
    assert "`0 of 5 (1 unread)` with holder `-`" in paragraph
    assert "`without a majority`, and the exit status stays 0" in paragraph


async def test_list_exit_3_with_every_master_answering_is_documented(
    servers: ServerGroup, masters: Masters, capsys: pytest.CaptureFixture[str]
) -> None:
    """src/asyncredlock/__main__.py's docstring (the command line's exit codes): ``list``
    exits 3 when fewer than a quorum answered, and also with every master answering,
    when a lock's state could not be read on enough masters to tell whether it is held
    (as usage.md's table and ``list --help`` say)."""
    status, out = await listed(servers, masters, capsys, on=3)
    assert status == 3
    assert out.splitlines()[-1].endswith("(5 answered, quorum 3)")
    doc = asyncredlock.__main__.__doc__ or ""
    bullet = doc.split("\n- 3:", 1)[1].split("\n- 130:", 1)[0]
    about_list = " ".join(bullet.split("``list``:", 1)[1].split())
    assert "could not be read on enough masters to tell whether it is held" in about_list
    zero = " ".join(doc.split("\n- 0:", 1)[1].split("\n- 1:", 1)[0].split())
    assert "``list``: listed, even when nothing is held" in zero
    two = " ".join(doc.split("\n- 2:", 1)[1].split("\n- 3:", 1)[0].split())
    assert "a name asyncredlock refuses" in two
