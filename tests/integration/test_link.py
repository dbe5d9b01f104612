"""A master's connection (`Link`) delivers a reply to a hook the moment it is read,
only for calls it made, and goes on reading when a hook fails."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from asyncredlock._config import DEFAULTS
from asyncredlock._connect import make_node
from asyncredlock._node import Reply
from asyncredlock._transport import Link
from asyncredlock._wire import Stream
from asyncredlock.testing import ServerGroup

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome


@contextlib.asynccontextmanager
async def _link(url: str) -> AsyncIterator[Link]:
    """A master's connection, made as an AsyncRedlock makes it, closed at exit."""
    node, _ = make_node(url, DEFAULTS)
    assert node.link is not None
    try:
        yield node.link
    finally:
        await node.aclose()


class TestReplyHooks:
    async def test_the_hook_sees_the_reply_before_the_futures_callbacks(
        self, servers: ServerGroup
    ) -> None:
        seen: list[tuple[str, Any]] = []
        async with _link(servers.urls[0]) as link:
            future = link.call(("PING",))
            future.add_done_callback(lambda f: seen.append(("callback", f.result().value)))
            assert link.listen(future, lambda i, reply: seen.append((f"hook {i}", reply.value)), 7)
            with anyio.fail_after(HANG_GUARD):
                await future
            assert seen == [("hook 7", b"PONG"), ("callback", b"PONG")]

    async def test_only_an_unresolved_call_made_here_takes_a_hook(
        self, servers: ServerGroup
    ) -> None:
        async with _link(servers.urls[0]) as link:
            foreign: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
            assert not link.listen(foreign, lambda i, reply: None, 0)
            foreign.cancel()
            future = link.call(("PING",))
            assert link.listen(future, lambda i, reply: None, 0)
            assert not link.listen(future, lambda i, reply: None, 1)  # one hook per call
            with anyio.fail_after(HANG_GUARD):
                await future
            assert not link.listen(future, lambda i, reply: None, 0)  # resolved

    async def test_an_unlistened_hook_is_not_called(self, servers: ServerGroup) -> None:
        called: list[int] = []
        async with _link(servers.urls[0]) as link:
            future = link.call(("PING",))
            assert link.listen(future, lambda i, reply: called.append(i), 0)
            link.unlisten(future)
            with anyio.fail_after(HANG_GUARD):
                assert (await future).value == b"PONG"
            assert called == []

    async def test_a_failing_hook_is_reported_and_the_replies_go_on(
        self, servers: ServerGroup
    ) -> None:
        reported: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()
        loop.set_exception_handler(lambda loop, context: reported.append(context))
        try:
            async with _link(servers.urls[0]) as link:

                def broken(i: int, reply: Reply) -> None:
                    raise RuntimeError("hook broke")

                first = link.call(("PING",))
                second = link.call(("ECHO", "after"))
                assert link.listen(first, broken, 0)
                with anyio.fail_after(HANG_GUARD):
                    assert (await first).value == b"PONG"
                    assert (await second).value == b"after"
                assert link.outstanding == 0
        finally:
            loop.set_exception_handler(previous)
        assert [str(context["exception"]) for context in reported] == ["hook broke"]


class TestOwnPing:
    async def test_the_links_ping_is_not_a_callers_call(self, servers: ServerGroup) -> None:
        """The PING of an idle connection is counted out of `calls` (what `settle()`
        waits for) while it is out, and the count is whole again once answered; a
        closed link sends none (a heartbeat firing while `aclose()` waits)."""
        async with _link(servers.urls[0]) as link:
            with anyio.fail_after(HANG_GUARD):
                assert (await link.call(("PING",))).value == b"PONG"  # connected
                link._ping()
                assert (link.outstanding, link.calls, link.pings) == (1, 0, 1)
                caller = link.call(("ECHO", "mine"))
                assert (link.outstanding, link.calls) == (2, 1)
                assert (await caller).value == b"mine"
                await link.wait_idle()
                assert (link.outstanding, link.calls) == (0, 0)
        link._ping()
        assert (link.outstanding, link.calls, link.pings) == (0, 0, 1)


class TestWrites:
    async def test_a_call_goes_out_at_once_unless_a_burst_is_on_the_connection(
        self, servers: ServerGroup
    ) -> None:
        """A call with no request, or one, out before it on the link is written at once
        (unless a write already waits); from two on, the calls of a loop iteration wait
        for one write at its end."""
        async with _link(servers.urls[0]) as link:
            with anyio.fail_after(HANG_GUARD):
                await link.call(("PING",))  # connected
                conn = link._conn
                assert conn is not None
                calls = [link.call(("ECHO", "a")), link.call(("ECHO", "b"))]
                assert conn.out == []  # both written already
                calls += [link.call(("ECHO", "c")), link.call(("ECHO", "d"))]
                assert len(conn.out) == 2  # c and d: this iteration's write, to come
                replies = [(await call).value for call in calls]
                assert replies == [b"a", b"b", b"c", b"d"]
                assert conn.out == []

    async def test_a_call_behind_one_joins_the_write_of_a_new_connection(
        self, servers: ServerGroup
    ) -> None:
        """A call with one request out before it, made while a new connection's first
        write (its scripts, then the call queued while it opened) waits, joins that
        write: written at once, it would pass them, and every reply would go to the
        wrong call."""
        async with _link(servers.urls[0]) as link:
            opener, late, seen = link.opener, [], []

            async def open_then_call(conn: Stream) -> None:
                await opener(conn)

                def call() -> None:  # after the connection queued its writes, before them
                    seen.append((link._conn is conn and bool(conn.out), link.outstanding))
                    late.append(link.call(("ECHO", "b")))

                asyncio.get_running_loop().call_soon(call)

            link.opener = open_then_call
            with anyio.fail_after(HANG_GUARD):
                assert (await link.call(("ECHO", "a"))).value == b"a"
                assert (await late[0]).value == b"b"
            assert seen == [(True, 1)]

    async def test_a_call_behind_one_joins_the_write_of_a_script_sent_again(
        self, servers: ServerGroup
    ) -> None:
        """A script the master did not have (``NOSCRIPT``), with nothing sent behind
        it, is sent again as ``EVAL`` in the iteration's write; a call made before that
        write, with one request out before it, joins it behind the ``EVAL``."""
        source = f"return 'sent again {random.random()}'"
        sha = hashlib.sha1(source.encode()).hexdigest()
        async with _link(servers.urls[0]) as link:
            with anyio.fail_after(HANG_GUARD):
                await link.call(("PING",))  # connected
                conn = link._conn
                assert conn is not None
                later: list[asyncio.Future[Reply]] = []
                waiting: list[bool] = []
                send = conn.send

                def send_then_call(
                    packed: bytes, request: Any, *, ahead: int | None = None
                ) -> None:
                    send(packed, request, ahead=ahead)
                    if b"$4\r\nEVAL\r\n" in packed[:16] and not later:  # the EVAL waits
                        waiting.append(bool(conn.out))
                        later.append(link.call(("ECHO", "c")))

                conn.send = send_then_call  # type: ignore[method-assign]
                script = link.call(("EVALSHA", sha, 0), source)  # alone on the wire
                assert (await script).value == source[8:-1].encode()
                assert (await later[0]).value == b"c"
            assert waiting == [True]

    async def test_a_script_lost_with_calls_behind_it_fails_unrun_and_is_loaded_again(
        self, servers: ServerGroup
    ) -> None:
        """A command sent after another runs after it on the master (what orders an
        undo or a release behind its ``SET``). A script the master lost (``NOSCRIPT``,
        after a ``SCRIPT FLUSH``) is known to be missing only once its reply is read,
        after the calls sent behind it have run: sent again then, it would run after
        them. So it fails, not run, and the script is loaded again for later calls."""
        key = f"order:{random.random()}"
        source = f"redis.call('RPUSH', KEYS[1], 'first') return {random.random()!r}"
        sha = hashlib.sha1(source.encode()).hexdigest()  # a script no master has cached
        async with _link(servers.urls[0]) as link:
            with anyio.fail_after(HANG_GUARD):
                await link.call(("PING",))  # connected
                first = link.call(("EVALSHA", sha, 1, key), source)
                second = link.call(("RPUSH", key, "second"))
                failed = await first
                assert failed.error is not None
                assert str(failed.error).startswith("NOSCRIPT")
                assert (await second).error is None
                assert (await link.call(("LRANGE", key, 0, -1))).value == [b"second"]
                again = link.call(("EVALSHA", sha, 1, key), source)
                also = link.call(("RPUSH", key, "third"))  # behind it: found loaded
                assert ((await again).error, (await also).error) == (None, None)
                assert (await link.call(("LRANGE", key, 0, -1))).value == [
                    b"second",
                    b"first",
                    b"third",
                ]
                await link.call(("DEL", key))


class TestSilence:
    async def test_a_stall_before_a_calls_write_is_not_the_masters_silence(
        self, servers: ServerGroup
    ) -> None:
        """Silence is counted from when a request is written, not from when it was
        made: a call queued for the iteration's joined write, then a stall of the
        loop (under half of `node_timeout`: not "late") before that write, is not a
        silent master — every request is answered. (A burst on a slow host marked
        healthy masters silent this way: on uvloop the watchdog ran before the write.)"""
        node_timeout = 0.2
        settings = dataclasses.replace(DEFAULTS, node_timeout=node_timeout)
        node, _ = make_node(servers.urls[0], settings)
        link = node.link
        assert link is not None
        alarms: list[str] = []
        link.watchers.add(lambda: alarms.append("silent"))
        third: list[asyncio.Future[Reply]] = []
        queued: list[bool] = []

        def stall(i: int, reply: Reply) -> None:
            third.append(link.call(("ECHO", "third")))  # joins the next write
            queued.append(link._conn is not None and bool(link._conn.out))  # (two out)
            time.sleep(node_timeout * 1.25)  # the loop stalls before that write

        try:
            with anyio.fail_after(HANG_GUARD):
                await link.call(("PING",))  # connected
                link.call(("PING",))  # written at once (nothing out before it)
                link.call(("ECHO", "next"))  # and so is this one (one call out)
                first = link.call(("ECHO", "first"))  # these three join one write:
                second = link.call(("ECHO", "second"))  # their replies are usually read
                last = link.call(("ECHO", "last"))  # together (two out: third waits)
                assert link.listen(first, stall, 0)
                assert (await first).value == b"first"
                assert (await second).value == b"second"
                assert (await last).value == b"last"
                assert (await third[0]).value == b"third"
            assert queued == [True]
            assert (alarms, link.silent) == ([], False)
        finally:
            await node.aclose()
