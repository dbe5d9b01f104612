"""The pytest plugin's fixtures clean up after a failing test, in a pytest run of
its own (a subprocess, so its failures are its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

INNER = """
import json, os
from pathlib import Path

RECORD = Path(os.environ["RECORD"])

def record(group):
    seen = json.loads(RECORD.read_text()) if RECORD.exists() else []
    seen += [[server.pid, str(server.workdir)] for server in group]
    RECORD.write_text(json.dumps(seen))

def test_fails_holding_two_groups(make_servers):
    record(make_servers(2))
    record(make_servers(1))
    assert False, "the test fails with its servers running"

def test_fails_with_a_paused_server(make_servers):
    group = make_servers(2)
    record(group)
    group[0].pause()
    raise RuntimeError("the test fails with a server paused")

def test_a_group_that_cannot_start_fails_the_test(make_servers):
    record(make_servers(1))
    make_servers(1, extra_args=["--no-such-option", "x"])
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    # a zombie not yet reaped by its parent (gone with it) is not a running server
    return not (status.exists() and status.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_make_servers_closes_every_group_when_a_test_fails(tmp_path: Path) -> None:
    """Three failing tests, one of them with a paused server, one with a group that
    cannot start: every server process they made is gone and every private
    directory removed."""
    (tmp_path / "test_inner.py").write_text(INNER)
    record = tmp_path / "record.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "asyncredlock.testing.pytest_plugin", "--rootdir", str(tmp_path)]
    command += ["-c", os.devnull, str(tmp_path / "test_inner.py")]
    env = os.environ | {"RECORD": str(record)}
    run = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert "3 failed" in run.stdout, run.stdout + run.stderr
    assert "ServerStartError" in run.stdout
    seen = json.loads(record.read_text())
    assert len(seen) == 6
    assert [pid for pid, _ in seen if alive(pid)] == []
    assert [workdir for _, workdir in seen if Path(workdir).exists()] == []
