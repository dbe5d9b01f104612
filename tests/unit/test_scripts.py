"""The scripts and the Python side agree on the names they both build."""

from __future__ import annotations

import re
from importlib import resources

from asyncredlock._scripts import DELETE, DEQUEUE, FENCED_WRITE, RELEASE, RELEASE_READ, SCRIPTS
from asyncredlock._wakeup import INBOX_PREFIX


def test_the_scripts_that_announce_to_an_inbox_name_it_as_the_waker_listens() -> None:
    for script in (RELEASE, RELEASE_READ, DEQUEUE, DELETE):
        assert f"'{INBOX_PREFIX}'" in script.source, script.name
        assert "local function inbox(" in script.source, script.name


HELPERS = {"clock": ("now_ms",), "queue": ("purge", "inbox"), "fence": ("fence_count",)}


def test_every_script_gets_the_helpers_it_calls() -> None:
    for script in (*SCRIPTS, FENCED_WRITE):
        for functions in HELPERS.values():
            for function in functions:
                calls = re.search(rf"(?<!function ){function}\(", script.source)
                if calls:
                    assert f"local function {function}(" in script.source, (script.name, function)


def test_the_server_clock_and_the_fence_counter_are_read_in_one_place_each() -> None:
    lua = resources.files("asyncredlock").joinpath("lua")
    own = {p.name: p.read_text("utf-8") for p in lua.iterdir() if p.name.endswith(".lua")}
    reading = sorted(
        name for name, text in own.items() if re.search(r"redis\.p?call\('TIME'\)", text)
    )
    # the fence counter starts from the clock in microseconds, not ms
    assert reading == ["clock.lua", "fence.lua"]
    assert [name for name, text in own.items() if "'INCRBY'" in text] == ["fence.lua"]
