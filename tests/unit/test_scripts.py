"""The scripts and the Python side agree on the names they both build."""

from __future__ import annotations

from asyncredlock._scripts import DELETE, DEQUEUE, RELEASE, RELEASE_READ
from asyncredlock._wakeup import INBOX_PREFIX


def test_the_scripts_that_announce_to_an_inbox_name_it_as_the_waker_listens() -> None:
    for script in (RELEASE, RELEASE_READ, DEQUEUE, DELETE):
        assert f"'{INBOX_PREFIX}'" in script.source, script.name
        assert "local function inbox(" in script.source, script.name
