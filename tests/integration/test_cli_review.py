"""Review of the operator CLI (inspect, list, watch, force-release) against what the
library gained since its last review: fair queues and their hand-over terms, the
queue state of read-write locks, semaphores' slots, LostLeaseError. Real servers,
locks held and waiters queued by real clients; the command run as from a shell
(``main()`` in a worker thread, or ``python -m asyncredlock`` for Ctrl-C)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease, LockState, LostLeaseError, _tools
from asyncredlock.__main__ import main
from asyncredlock._core import Core
from asyncredlock._keys import identity_of
from asyncredlock.testing import ServerGroup
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import Masters, polled
from .test_force_release_queue import (  # the CLI run in a thread, as from a shell
    _no_masters_from_the_environment,  # noqa: F401 (an autouse fixture, used so)
    all_listed,
    cli,
    master_args,
    until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

WAIT = 30.0  # a bound on each wait, far above what it takes
USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


async def who_waits(url: str, name: str) -> dict[str, str | None]:
    """Waiter id -> the identity in the value it would be handed the key with (its
    hand-over terms, ``'<value> <px> <block> <attempt>'``), on one master."""
    async with Redis.from_url(url) as client:
        terms = await client.hgetall("{" + name + "}:queue:terms")
    return {
        waiter.decode(): identity_of(term.decode().split(" ", 1)[0])
        for waiter, term in terms.items()
        if not waiter.startswith(b"=")
    }


def rows(text: str) -> dict[str, list[str]]:
    """``inspect``'s table: the cells of each master's row, by master."""
    return {
        line.split()[0]: line.split()[1:]
        for line in text.splitlines()
        if line.startswith(("redis://", "unix://"))
    }


@asynccontextmanager
async def three(urls: list[str]) -> AsyncIterator[tuple[AsyncRedlock, AsyncRedlock, AsyncRedlock]]:
    """Clients "a", "b" and "c": three processes."""
    async with AsyncExitStack() as stack:
        made = [
            await stack.enter_async_context(AsyncRedlock(urls, identity=identity))
            for identity in "abc"
        ]
        yield made[0], made[1], made[2]


# -- what the commands show ------------------------------------------------------------


async def test_a_fair_lock_s_waiters_show_in_arrival_order_text_and_json_agree(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """A holds a fair lock, B then C wait for it: inspect's QUEUED says 2 on every
    master, its JSON lists B's id then C's (their hand-over terms tell whose), and the
    holder, fence and status agree between text, JSON and list."""
    urls, name = servers.urls, "rv:fair"
    async with three(urls) as (a, b, c):
        held = await a.lock(name, ttl=30.0, fair=True, auto_extend=False).acquire()
        async with anyio.create_task_group() as tg:
            for client, count in ((b, 1), (c, 2)):
                tg.start_soon(client.lock(name, ttl=30.0, fair=True, timeout=WAIT).acquire)
                await until(lambda count=count: all_listed(urls, name, count))
            whose = [await who_waits(url, name) for url in urls]
            text_code = await cli("inspect", name, *master_args(urls))
            text = capsys.readouterr().out
            json_code = await cli("inspect", name, "--json", *master_args(urls))
            document = json.loads(capsys.readouterr().out)
            list_code = await cli("list", "rv:*", "--json", *master_args(urls))
            listing = json.loads(capsys.readouterr().out)
            tg.cancel_scope.cancel()
        await held.release()
    assert (text_code, json_code, list_code) == (0, 0, 0)
    table = rows(text)  # holder, ttl, "s", fence, readers, queued
    assert [row[-2:] for row in table.values()] == [["0", "2"]] * 5, text
    assert {row[0] for row in table.values()} == {held.value}
    assert f"majority holder: {held.value} (on 5 of 5 masters; identity a)" in text
    assert (document["status"], document["holder"], document["identity"]) == (
        "held",
        held.value,
        "a",
    )
    for master, names in zip(document["masters"], whose, strict=True):
        assert [names[waiter] for waiter in master["queue"]] == ["b", "c"], master
        assert str(master["fence"]) == table[master["node"]][3]
    (lock,) = listing["locks"]
    assert (lock["status"], lock["held_on"], lock["identity"]) == ("held", 5, "a")


async def test_a_fair_rwlock_s_readers_and_queue_in_every_command(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """Readers A and B hold a fair read-write lock, writer C waits, then reader A2
    behind it: inspect counts 2 readers and 2 queued (the writer first), list and
    watch name the two readers, text and JSON alike."""
    urls, name = servers.urls, "rv:rw"
    async with three(urls) as (a, b, c), AsyncRedlock(urls, identity="a2") as a2:
        readers = [
            await client.rwlock(name, fair=True).read(ttl=30.0, auto_extend=False).acquire()
            for client in (a, b)
        ]
        await a.settle()
        await b.settle()  # every master lists both readers
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.rwlock(name, fair=True).write(ttl=30.0, timeout=WAIT).acquire)
            await until(lambda: all_listed(urls, name, 1))
            tg.start_soon(a2.rwlock(name, fair=True).read(ttl=30.0, timeout=WAIT).acquire)
            await until(lambda: all_listed(urls, name, 2))
            outs: list[str] = []
            codes: list[int] = []
            for argv in (
                ["inspect", name],
                ["inspect", name, "--json"],
                ["list", name],
                ["list", name, "--json"],
                ["watch", name, "--count", "1"],
            ):
                codes.append(await cli(*argv, *master_args(urls)))
                outs.append(capsys.readouterr().out)
            tg.cancel_scope.cancel()
        for lease in readers:
            await lease.release()
    text, inspected, table_text, listed, watched = outs
    assert codes == [0, 0, 0, 0, 0]
    document, listing = json.loads(inspected), json.loads(listed)
    assert [row[-2:] for row in rows(text).values()] == [["2", "2"]] * 5, text
    assert "majority holder: none (read-locked: 2 on a quorum)" in text
    values = sorted(lease.value for lease in readers)
    for master in document["masters"]:
        assert sorted(value for value, _ in master["readers"]) == values
        assert [waiter[:2] for waiter in master["queue"]] == ["w:", "r:"], master
    assert document["status"] == "held"
    row = re.split(r"\s{2,}", table_text.splitlines()[1])
    assert row == ["rv:rw", "5 of 5", "-", "2 (a, b)"], table_text
    (lock,) = listing["locks"]
    assert [(r["value"], r["identity"], r["on"]) for r in lock["readers"]] == [
        (value, identity_of(value), 5) for value in values
    ]
    assert watched.strip().endswith("  read by 2 readers (a, b)"), watched


# -- force-release with waiters --------------------------------------------------------


async def test_force_release_of_a_fair_lock_serves_its_waiters_in_order_and_leaves_no_key(
    servers: ServerGroup, masters: Masters, capsys: pytest.CaptureFixture[str]
) -> None:
    """A (as good as dead) holds a fair lock, B then C wait. force-release: exit 0,
    it says it deleted the key on every master; B takes the lock, C only after B's
    release; A's next extend() raises LostLeaseError; once all are done, nothing but
    the fence counter is left (no queue entry, hand-over terms or undo marker)."""
    urls, name = servers.urls, "rv:forced"
    async with three(urls) as (a, b, c):
        stuck = await a.lock(name, ttl=30.0, fair=True, auto_extend=False).acquire()
        got: dict[str, Lease] = {}
        async with anyio.create_task_group() as tg:

            async def take(client: AsyncRedlock, who: str) -> None:
                got[who] = await client.lock(name, ttl=30.0, fair=True, timeout=WAIT).acquire()

            for client, who, count in ((b, "b", 1), (c, "c", 2)):
                tg.start_soon(take, client, who)
                await until(lambda count=count: all_listed(urls, name, count))
            code = await cli("force-release", name, "--yes", *master_args(urls))
            assert await polled(lambda: "b" in got)
            assert "c" not in got  # fair: C waits for B's release
            await got["b"].release()
            assert await polled(lambda: "c" in got)
            await got["c"].release()
        with pytest.raises(LostLeaseError):
            await stuck.extend()
        for client in (a, b, c):
            await client.settle()
    captured = capsys.readouterr()
    assert code == 0
    assert captured.out == f"deleted the lock key of {name!r} on 5 of 5 masters\n"
    assert captured.err == ""
    assert await masters.keys() == [[]] * 5


async def test_force_release_of_a_fair_writer_lets_every_queued_reader_in(
    servers: ServerGroup, masters: Masters, capsys: pytest.CaptureFixture[str]
) -> None:
    """Writer A holds a fair read-write lock, readers B and C are queued behind it:
    force-release lets both readers in together, and leaves no key behind."""
    urls, name = servers.urls, "rv:rwforced"
    async with three(urls) as (a, b, c):
        writer = await a.rwlock(name, fair=True).write(ttl=30.0, auto_extend=False).acquire()
        got: list[Lease] = []
        async with anyio.create_task_group() as tg:

            async def read(client: AsyncRedlock) -> None:
                got.append(await client.rwlock(name, fair=True).read(timeout=WAIT).acquire())

            for client, count in ((b, 1), (c, 2)):
                tg.start_soon(read, client)
                await until(lambda count=count: all_listed(urls, name, count))
            assert await cli("force-release", name, "--yes", *master_args(urls)) == 0
            assert await polled(lambda: len(got) == 2)
        state = await b.inspect(name)
        assert {value for value, _ in state.nodes[0].readers} == {got[0].value, got[1].value}
        for lease in got:
            await lease.release()
        with pytest.raises(LostLeaseError):
            await writer.extend()
        for client in (a, b, c):
            await client.settle()
    capsys.readouterr()
    assert await masters.keys() == [[]] * 5


async def test_a_semaphore_is_reported_free_and_its_queue_left_alone(
    servers: ServerGroup, masters: Masters, capsys: pytest.CaptureFixture[str]
) -> None:
    """As documented (usage.md, semaphores: "the CLI see locks, not semaphore slots"):
    with a fair semaphore full and a waiter queued, inspect says free (exit 1, nothing
    queued), list lists nothing, force-release deletes nothing and leaves the
    semaphore's slots and queue as they were."""
    urls, name = servers.urls, "rv:sem"
    async with three(urls) as (a, b, c):
        held = [await client.semaphore(name, 2, fair=True).acquire() for client in (a, b)]
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.semaphore(name, 2, fair=True, timeout=WAIT).acquire)

            async def sem_queued() -> bool:
                return all(
                    [await client.zcard("{" + name + "}:sem:queue") for client in masters.clients]
                )

            await until(sem_queued)
            before = await masters.keys()
            codes, outs = [], []
            for argv in (["inspect", name, "--json"], ["list"], ["force-release", name, "--yes"]):
                codes.append(await cli(*argv, *master_args(urls)))
                outs.append(capsys.readouterr().out)
            after = await masters.keys()
            tg.cancel_scope.cancel()
        for lease in held:
            await lease.release()
    assert codes == [1, 0, 1]
    document = json.loads(outs[0])
    assert document["status"] == "free"
    assert all(master["queue"] == [] for master in document["masters"])
    assert outs[1].startswith("0 locks matching '*' held on 5 masters")
    assert outs[2].startswith("nothing to release")
    assert after == before


def test_the_command_line_docs_say_semaphores_are_not_seen() -> None:
    """docs/usage.md, "From the command line" (where an operator looks), says what the
    test above shows: on a semaphore's name inspect says free, force-release has
    nothing to release; it said so only among the semaphores' own paragraphs."""
    page = USAGE.read_text(encoding="utf-8")
    start = page.index("### From the command line")
    section = " ".join(page[start : page.index("\n## ", start)].split())
    assert "The commands see locks, not [semaphores](#counting-semaphores)" in section
    assert "`inspect` and `watch` say `free`" in section
    assert "`force-release` deletes nothing (`nothing to release`, exit 1)" in section


# -- silent masters and Ctrl-C ---------------------------------------------------------


@pytest.mark.parametrize("freeze", ["before the scan", "at the first read"])
async def test_list_waits_out_a_silent_master_once_not_once_per_batch(
    servers: ServerGroup,
    make_servers: MakeServers,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    freeze: str,
) -> None:
    """3 masters, one frozen (before the scan: its SCAN fails, named in a warning; or
    at the first read of a lock), 201 locks held on the other two: the reads of the
    locks' states each waited for the frozen master. They are made 100 at a time, one
    batch after the other, so the command waited out --node-timeout 3 times (1 + 2
    batches; with the default --max-keys, 100 000 keys, about 1 000 times: some 17
    minutes at the default 1 s), where one wait tells all there is to tell: that
    master does not answer. Counted without a clock: the reads that asked it and got
    no reply, grouped where they overlapped in time. Once it gave no reply, it is no
    longer asked: each lock's state there reads not read (a row's "unread"), and one
    warning says so for the master, not one per lock."""
    frozen = make_servers(1)
    urls = [*servers.urls[:2], *frozen.urls]
    for url in servers.urls[:2]:
        async with Redis.from_url(url) as client, client.pipeline(transaction=False) as pipe:
            for i in range(201):
                pipe.set(f"rv:many:{i}", f"x:{i:032x}", px=60_000)
            await pipe.execute()
    spans: list[tuple[float, float]] = []
    read = _tools.read_state  # every read of a lock's state, inspect()'s included

    async def timed(core: Core, name: str, failed: dict[int, str] | None = None) -> LockState:
        asked = failed is None or 2 not in failed
        if not frozen[0].paused:
            frozen[0].pause()
        loop = asyncio.get_running_loop()
        start = loop.time()
        state = await read(core, name, *([] if failed is None else [failed]))
        if asked and state.nodes[2].error is not None:  # waited for the frozen master
            spans.append((start, loop.time()))
        return state

    monkeypatch.setattr(_tools, "read_state", timed)
    if freeze == "before the scan":
        frozen[0].pause()
    try:
        with anyio.fail_after(50):
            code = await cli("list", "rv:many:*", "--node-timeout", "0.3", *master_args(urls))
    finally:
        frozen[0].resume()
    captured = capsys.readouterr()
    assert code == 0
    waits = 0
    end = float("-inf")
    for start, stop in sorted(spans):
        if start >= end:  # not overlapping the earlier ones: a wait of its own
            waits += 1
        end = max(end, stop)
    assert waits <= 1, f"{waits} waits for the silent master, one after the other"
    answered = 2 if freeze == "before the scan" else 3
    summary = f"201 locks matching 'rv:many:*' held on 3 masters ({answered} answered"
    assert summary in captured.out
    assert "2 of 3 (1 unread)" in captured.out
    if freeze == "before the scan":
        (warning,) = captured.err.splitlines()
        assert warning.startswith(f"asyncredlock: warning: {frozen.urls[0]}: ")
    else:
        first, rest = captured.err.splitlines()
        assert first.startswith(
            f"asyncredlock: warning: lock rv:many:0 not read on {frozen.urls[0]}"
        )
        assert rest.startswith(
            f"asyncredlock: warning: {frozen.urls[0]}: 200 locks not read there, as a read failed: "
        )


#: ``python -m asyncredlock`` that says on stderr when the command's first read of a
#: lock (or its force-release) is out (its calls to the masters made), before it waits
#: for their replies.
_MARKED = """
import asyncio, sys
from asyncredlock import AsyncRedlock
from asyncredlock.__main__ import main
def marked(call):
    async def marked_call(redlock, name):
        calling = asyncio.ensure_future(call(redlock, name))
        await asyncio.sleep(0)  # it ran to its first wait: the calls are out
        print("sent", file=sys.stderr, flush=True)
        return await calling
    return marked_call
AsyncRedlock.inspect = marked(AsyncRedlock.inspect)
AsyncRedlock._force_free = marked(AsyncRedlock._force_free)
sys.exit(main())
"""


@pytest.mark.parametrize("command", ["inspect", "watch", "force-release"])
async def test_ctrl_c_ends_the_command_at_once_while_a_master_is_silent(
    servers: ServerGroup, make_servers: MakeServers, command: str
) -> None:
    """One master of 3 frozen, --node-timeout 1000: Ctrl-C while the command waits
    for it ends the command (exit 130, one line on stderr) at once, not when the
    1000 s are up. Found: the first SIGINT cancels the read, then the AsyncRedlock's
    close waited up to node_timeout for the call still out (a second Ctrl-C ended
    it). force-release too, its delete still out there (docs: rerun it)."""
    frozen = make_servers(1)
    urls = [*servers.urls[:2], *frozen.urls]
    argv = [sys.executable, "-c", _MARKED, command, "rv:ctrl-c", "--node-timeout", "1000"]
    argv += ["--yes"] if command == "force-release" else []
    frozen[0].pause()
    code: int | None = None
    err = b""
    try:
        async with await anyio.open_process(
            [*argv, *master_args(urls)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as process:
            assert process.stderr is not None
            stderr = BufferedByteReceiveStream(process.stderr)
            with anyio.fail_after(WAIT):
                assert await stderr.receive_until(b"\n", 1000) == b"sent"
            process.send_signal(signal.SIGINT)
            with anyio.move_on_after(10):  # a hang guard: 1000 s is the alternative
                err = b"".join([chunk async for chunk in stderr])
                code = await process.wait()
            if code is None:
                process.kill()
    finally:
        frozen[0].resume()
    assert code == 130, "still running after Ctrl-C"
    assert err == b"asyncredlock: error: interrupted\n"


async def test_a_silent_master_is_named_and_the_verdict_kept(
    servers: ServerGroup, make_servers: MakeServers, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fair lock held on 3 masters, one of them frozen: inspect (exit 0) names it in
    an error row, list (exit 0) says 1 unread and warns, watch prints the holder,
    force-release deletes on 2 of 3 (exit 0) and names the frozen one in a warning."""
    frozen = make_servers(1)
    urls = [*servers.urls[:2], *frozen.urls]
    name = "rv:silent"
    async with AsyncRedlock(urls, identity="a") as a:
        held = await a.lock(name, ttl=30.0, fair=True, auto_extend=False).acquire()
        await a.settle()
        frozen[0].pause()
        try:
            timeout = ["--node-timeout", "0.3", *master_args(urls)]
            with anyio.fail_after(WAIT):
                code = await cli("inspect", name, *timeout)
                inspected = capsys.readouterr()
                listed_code = await cli("list", *timeout)
                listed = capsys.readouterr()
                watch_code = await cli("watch", name, "--count", "1", *timeout)
                watched = capsys.readouterr()
                forced_code = await cli("force-release", name, "--yes", *timeout)
                forced = capsys.readouterr()
        finally:
            frozen[0].resume()
        with pytest.raises(LostLeaseError):
            await held.extend()
    assert (code, listed_code, watch_code, forced_code) == (0, 0, 0, 0)
    assert f"{frozen.urls[0]}  error: " in inspected.out
    assert "identity a)" in inspected.out
    assert "2 of 3 (1 unread)" in listed.out
    assert frozen.urls[0] in listed.err
    assert watched.out.strip().endswith(f"held by a (value {held.value})")
    assert forced.out == f"deleted the lock key of {name!r} on 2 of 3 masters\n"
    assert forced.err.startswith(f"asyncredlock: warning: {frozen.urls[0]}: ")
    for captured in (inspected, listed, watched, forced):
        assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["inspect", "a\x00b"], "must not contain a NUL character"),
        (["inspect", "x", "--prefix", "p\x00"], "prefix must not contain a NUL character"),
        (["inspect", "{rv}:sem:0"], "is reserved: it is the 'sem:0' key"),
        (["force-release", "{rv}:queue:terms", "--yes"], "is reserved"),
        (["watch", "x", "--node-timeout", "inf"], "node_timeout must be a finite number"),
        (["watch", "x", "--node-timeout", "1e20"], "node_timeout must be at most"),
        (["list", "--max-keys", "-5"], "must be >= 1, got -5"),
        (["watch", "x", "--interval", "-1"], "must be a number of seconds above 0"),
        (["inspect", "x", "--jsn"], "unrecognized arguments: --jsn"),
        (["force-release", "x", "--master", "redis://h:1,redis://h:2"], "has a comma"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    masters = [] if any(arg.startswith("--master") for arg in argv) else ["--master", "redis://h:1"]
    assert main([*argv, *masters]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert complaint in captured.err
    assert "Traceback" not in captured.err
