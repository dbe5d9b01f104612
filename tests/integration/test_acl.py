"""A least-privilege user (exactly `acl_rules`) runs every feature against real servers;
refusals that retrying cannot mend (a missing permission, a wrong password) say so."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence

import anyio
import pytest
from redis.asyncio import Redis

from asyncredlock import (
    AsyncRedlock,
    Lease,
    LockNotOwnedError,
    QuorumUnavailableError,
    _transport,
    acl_rules,
)
from asyncredlock.testing import ServerGroup, Waits, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import polled
from .test_cli import cli, master_args

pytestmark = pytest.mark.anyio

HANG_GUARD = 30  # seconds; only stops a hung test, never decides an outcome
NEVER = 3600.0  # a retry delay no test waits out
PASSWORD = "s3cret-acl"
PREFIX = "app/"


async def add_user(group: ServerGroup, user: str, rules: Sequence[str]) -> list[str]:
    """Create ``user`` with exactly ``rules`` on every server; its URLs."""
    for url in group.urls:
        async with Redis.from_url(url) as client:
            await client.execute_command(
                "ACL", "SETUSER", user, "reset", "on", f">{PASSWORD}", *rules
            )
            await client.execute_command("ACL", "LOG", "RESET")
    return [url.replace("redis://", f"redis://{user}:{PASSWORD}@") for url in group.urls]


async def denials(group: ServerGroup) -> list[list[object]]:
    """What ``ACL LOG`` recorded on each server (commands, keys, channels refused)."""
    logs = []
    for url in group.urls:
        async with Redis.from_url(url) as client:
            logs.append(await client.execute_command("ACL", "LOG"))
    return logs


async def exists_anywhere(group: ServerGroup, key: str) -> int:
    count = 0
    for url in group.urls:
        async with Redis.from_url(url) as client:
            count += await client.exists(key)
    return count


@pytest.mark.parametrize("keys", ["orders:*", "*"])
async def test_the_least_privileged_user_runs_every_feature(
    make_servers: MakeServers, keys: str
) -> None:
    group = make_servers(3)
    urls = await add_user(group, "locker", acl_rules(keys))
    with anyio.fail_after(HANG_GUARD):
        async with (
            AsyncRedlock(urls) as one,
            AsyncRedlock(urls, retry_delay=NEVER) as two,
        ):
            for name in ("orders:1", "orders:{tag}:2", "orders:odd}3"):
                await _plain_cycle(one, name)
            await _rwlock(one, two)
            await _woken(one, two, fair=False)
            await _woken(one, two, fair=True)
            await _operator(one, group)
            await _decorated(one)
            await _semaphore(one, two)
            await one.settle()
            await two.settle()
            woken = two.statistics().wakeups
    assert woken >= 3
    assert await denials(group) == [[], [], []]


async def _plain_cycle(redlock: AsyncRedlock, name: str) -> None:
    """A fenced lock on a fresh resource, extended and released."""
    lease = await redlock.lock(name, ttl=30.0, auto_extend=False).acquire()
    assert isinstance(lease.token, int)
    await lease.extend(60.0)
    await lease.release()
    again = await redlock.lock(name).acquire()
    assert isinstance(again.token, int)
    assert again.token > lease.token
    await again.release()


async def _rwlock(one: AsyncRedlock, two: AsyncRedlock) -> None:
    """Readers together (one of them extended), then a writer once they left."""
    first = await one.rwlock("orders:rw").read(auto_extend=False).acquire()
    second = await two.rwlock("orders:rw").read().acquire()
    await first.extend()
    await first.release()
    await second.release()
    writer = await one.rwlock("orders:rw").write().acquire()
    assert isinstance(writer.token, int)
    await writer.release()


async def _woken(one: AsyncRedlock, two: AsyncRedlock, *, fair: bool) -> None:
    """A waiter of another client acquires when the holder releases."""
    name = f"orders:wake:{fair}"
    held = await one.lock(name, ttl=60.0, fair=fair).acquire()
    got: list[int | None] = []

    async def wait() -> None:
        lease = await two.lock(name, fair=fair, timeout=HANG_GUARD).acquire()
        got.append(lease.token)
        await lease.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await Waits(two).reach(1)
        await held.release()
    assert len(got) == 1


async def _semaphore(one: AsyncRedlock, two: AsyncRedlock) -> None:
    """A full semaphore; a waiter of another client woken when a slot is released."""
    held = [await one.semaphore("orders:sem", 2).acquire() for _ in range(2)]
    await held[0].extend()
    got: list[str] = []

    async def wait() -> None:
        lease = await two.semaphore("orders:sem", 2, timeout=HANG_GUARD).acquire()
        got.append(lease.key)
        await lease.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await Waits(two).reach(1)
        await held[0].release()
    assert got == [held[0].key]
    await held[1].release()


async def _operator(redlock: AsyncRedlock, group: ServerGroup) -> None:
    """``inspect`` names the holder; ``force_release`` takes the lock away."""
    lease = await redlock.lock("orders:op", ttl=60.0, auto_extend=False).acquire()
    state = await redlock.inspect("orders:op")
    assert state.holder == lease.value
    assert [node.error for node in state.nodes] == [None, None, None]
    assert all(node.fence is not None for node in state.nodes)
    assert await redlock.force_release("orders:op") >= 2
    assert await exists_anywhere(group, "orders:op") == 0
    free = await redlock.inspect("orders:op")
    assert free.holder is None
    with pytest.raises(LockNotOwnedError):
        await lease.release()


async def _decorated(redlock: AsyncRedlock) -> None:
    """``AsyncRedlock.locked``: each call holds the lock named from its arguments."""
    calls: list[int] = []

    @redlock.locked("orders:job:{job}", ttl=10.0)
    async def run(job: int) -> None:
        calls.append(job)

    await run(7)
    assert calls == [7]


async def test_a_release_refused_its_announcement_still_counts(make_servers: MakeServers) -> None:
    """A user without the channel permissions: PUBLISH in the scripts is refused,
    but the keys were deleted, so the release (and the rest) succeed."""
    group = make_servers(3)
    rules = [rule for rule in acl_rules("orders:*") if not rule.startswith("&")]
    urls = await add_user(group, "mute", rules)
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls) as redlock:
            lease = await redlock.lock("orders:quiet", auto_extend=False).acquire()
            await lease.release()
            assert await exists_anywhere(group, "orders:quiet") == 0
            reader = await redlock.rwlock("orders:quiet-rw").read(auto_extend=False).acquire()
            await reader.release()
            assert await exists_anywhere(group, "{orders:quiet-rw}:readers") == 0
            await redlock.lock("orders:forced", ttl=60.0, auto_extend=False).acquire()
            assert await redlock.force_release("orders:forced") == 3
            await redlock.settle()
    refused = [entry for log in await denials(group) for entry in log]
    assert refused  # the announcements were refused, on the channels only
    assert {(entry[b"reason"], entry[b"context"]) for entry in refused} == {(b"channel", b"lua")}


async def refused_at_once(urls: list[str], name: str, named: str) -> QuorumUnavailableError:
    """Acquire ``name`` with an hour-long timeout: it must fail after one attempt with
    the ACL refusal, quoting ``named`` (a regular expression); the error."""
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls, timeout=NEVER) as redlock:
            with pytest.raises(QuorumUnavailableError) as caught:
                await redlock.lock(name).acquire()
            attempts = redlock.statistics().attempts
    assert attempts == 1
    assert "refused by the masters' ACL" in str(caught.value)
    assert re.search(named, str(caught.value))
    return caught.value


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        # Valkey: "No permissions to access a key"; Redis 7.0: "... one of the keys"
        ("~{orders:*}:*", "[Nn]o permissions to access (a key|one of the keys)"),
        # inside a script, Redis 7.0 does not name the command
        ("+time", "'time' command|The user executing the script can't run this command"),
        ("+evalsha", "'evalsha' command"),
    ],
)
async def test_a_missing_permission_ends_the_acquisition_at_once(
    make_servers: MakeServers, missing: str, named: str
) -> None:
    """Refused by every master's ACL: one attempt, then `QuorumUnavailableError`
    naming the refusal, long before the (hour-long) timeout."""
    group = make_servers(3)
    rules = [rule for rule in acl_rules("orders:*") if rule != missing]
    assert len(rules) == len(acl_rules("orders:*")) - 1
    urls = await add_user(group, "partial", rules)
    error = await refused_at_once(urls, "orders:refused", named)
    refused = [o for o in error.outcomes if re.search(named, o.detail)]
    assert len(refused) >= 2
    assert not any(o.ok for o in refused)


async def test_a_refused_clock_leaves_no_fence_counter_behind(make_servers: MakeServers) -> None:
    """Without ``+time`` a fresh resource's counter cannot start from the clock: none
    may stay, or tokens would count up from the block once TIME is granted, below
    the clock-seeded tokens of any master that never lost its counter."""
    group = make_servers(3)
    rules = [rule for rule in acl_rules("orders:*") if rule != "+time"]
    urls = await add_user(group, "clockless", rules)
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls, timeout=NEVER) as redlock:
            with pytest.raises(QuorumUnavailableError):
                await redlock.lock("orders:fresh").acquire()
        assert await exists_anywhere(group, "{orders:fresh}:fence") == 0
        await add_user(group, "clockless", acl_rules("orders:*"))  # TIME granted now
        async with AsyncRedlock(urls) as redlock:
            lease = await redlock.lock("orders:fresh").acquire()
            await lease.release()
    assert lease.token is not None
    assert lease.token > 10**15  # from the clock in microseconds, not from the block
    # Every later count needs the clock too (its floor): refused, the counter untouched
    before = await fences(group, "{orders:fresh}:fence")
    await add_user(group, "clockless", rules)
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls, timeout=NEVER) as redlock:
            with pytest.raises(QuorumUnavailableError, match="time"):
                await redlock.lock("orders:fresh").acquire()
    assert await fences(group, "{orders:fresh}:fence") == before
    assert await exists_anywhere(group, "orders:fresh") == 0


async def fences(group: ServerGroup, key: str) -> list[bytes | None]:
    values = []
    for url in group.urls:
        async with Redis.from_url(url) as client:
            values.append(await client.get(key))
    return values


async def test_a_permission_refused_in_the_handshake_ends_the_acquisition_at_once(
    make_servers: MakeServers,
) -> None:
    """A URL naming database 1 needs +select, which the rules leave out: redis-py's
    handshake is refused (NoPermissionError), and the acquisition says so at once."""
    group = make_servers(3)
    urls = [f"{url}/1" for url in await add_user(group, "nodb", acl_rules("orders:*"))]
    await refused_at_once(urls, "orders:db1", "select")


async def test_an_extension_and_a_release_refused_by_the_acl_say_so(
    make_servers: MakeServers,
) -> None:
    """The permission taken away while a lease is held: `extend()` and `release()`
    raise `QuorumUnavailableError` naming the ACL refusal, not an outage."""
    group = make_servers(3)
    urls = await add_user(group, "revoked", acl_rules("orders:*"))
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls) as redlock:
            lease = await redlock.lock("orders:revoked", auto_extend=False).acquire()
            await add_user(group, "revoked", [r for r in acl_rules("orders:*") if r != "+evalsha"])
            with pytest.raises(QuorumUnavailableError) as extended:
                await lease.extend()
            with pytest.raises(QuorumUnavailableError) as released:
                await lease.release()
    for caught in (extended, released):
        assert "refused by the masters' ACL" in str(caught.value)
        assert "'evalsha' command" in str(caught.value)
    assert str(extended.value).startswith("could not extend 'orders:revoked'")
    assert str(released.value).startswith("released 'orders:revoked' on too few masters")
    assert await exists_anywhere(group, "orders:revoked") == 3  # left to expire


@pytest.mark.parametrize("ping", [True, False])
async def test_idle_connections_ping_within_the_rules(
    make_servers: MakeServers,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    ping: bool,
) -> None:
    """Idle connections PING their masters, which `acl_rules` allows (no denial). With
    rules that lack +ping (written before it was needed), each master's refusal is
    logged once, not counted as a failed call in the telemetry every time, the
    connections stay (a refusal is an answer) and locks still work."""
    counted: list[tuple[str, BaseException]] = []
    monkeypatch.setattr(_transport, "master_error", lambda *call: counted.append(call))
    group = make_servers(3)
    rules = [rule for rule in acl_rules("orders:*") if ping or rule != "+ping"]
    urls = await add_user(group, "idler", rules)
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls, socket_timeout=0.2) as redlock:
            await _plain_cycle(redlock, "orders:idle")
            links = [node.link for node in redlock._core.nodes]
            names = [node.name for node in redlock._core.nodes]
            assert await polled(lambda: all(link and link.pings >= 3 for link in links))
            await _plain_cycle(redlock, "orders:idle")
            state = client_state(redlock)
    assert (state.connections, state.silent) == ((1, 1, 1), (False, False, False))
    refusals = [r.getMessage() for r in caplog.records if "refuses the PING" in r.getMessage()]
    logged = await denials(group)
    if ping:
        assert (refusals, logged) == ([], [[], [], []])
    else:
        assert sorted(refusals) == sorted(
            f"master {name} refuses the PING of idle connections (NOPERM User idler has no "
            "permissions to run the 'ping' command): grant +ping (acl_rules() includes it)"
            for name in names
        )
        assert all(entry for entry in logged)  # the masters did refuse it
    assert counted == []


async def test_a_refused_ping_on_the_subscription_is_logged_as_a_ping_refusal(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture
) -> None:
    """Rules without +ping: the wake-up subscription's heartbeat PING is refused too.
    That is the PING's refusal (logged once per master, as the command connections'
    are), not a refused SUBSCRIBE: the subscription works, and wakes the waiter."""
    group = make_servers(3)
    urls = await add_user(group, "hushed", [r for r in acl_rules("orders:*") if r != "+ping"])
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    with anyio.fail_after(HANG_GUARD):
        async with (
            AsyncRedlock(urls, socket_timeout=0.2) as holder,
            AsyncRedlock(urls, socket_timeout=0.2, retry_delay=NEVER) as waiter,
        ):
            held = await holder.lock("orders:hushed", ttl=60.0).acquire()
            async with anyio.create_task_group() as tg:
                leases: list[Lease] = []

                async def wait() -> None:
                    leases.append(await waiter.lock("orders:hushed", timeout=NEVER).acquire())

                tg.start_soon(wait)
                await Waits(waiter).reach(1)
                listeners = waiter._core.waker.listeners
                # two PINGs each: the first one's refusal was read (it ended the quiet)
                assert await polled(
                    lambda: all(
                        each is not None
                        and each.connection is not None
                        and each.connection.heartbeat is not None
                        and each.connection.heartbeat.pings >= 2
                        for each in listeners
                    )
                )
                await held.release()
            (lease,) = leases
            await lease.release()
            names = [node.name for node in waiter._core.nodes]
    messages = [record.getMessage() for record in caplog.records]
    assert [m for m in messages if "wake-up subscription" in m] == []
    for name in names:
        assert f"master {name} refuses the PING of idle connections (NOPERM" in "\n".join(messages)


async def _fair_queue(one: AsyncRedlock, two: AsyncRedlock, three: AsyncRedlock) -> None:
    """Two queued fair waiters of two other clients: each is handed the lock in turn."""
    name = "orders:fair"
    held = await one.lock(name, ttl=60.0, fair=True).acquire()
    order: list[str] = []

    async def wait(redlock: AsyncRedlock, who: str) -> None:
        lease = await redlock.lock(name, fair=True, timeout=HANG_GUARD).acquire()
        order.append(who)
        await lease.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, two, "two")
        await Waits(two).reach(1)
        tg.start_soon(wait, three, "three")
        await Waits(three).reach(1)
        await held.release()
    assert sorted(order) == ["three", "two"]


async def _multi(one: AsyncRedlock, two: AsyncRedlock) -> None:
    """A lock on several resources, with fencing; a waiter on an overlapping set woken."""
    lease = await one.lock(["orders:a", "orders:b"], ttl=60.0).acquire()
    assert lease.tokens is not None
    assert len(lease.tokens) == 2
    got: list[Lease] = []

    async def wait() -> None:
        got.append(await two.lock(["orders:b", "orders:c"], timeout=HANG_GUARD).acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await Waits(two).reach(1)
        await lease.release()
    await got[0].release()


async def _writer_after_reader(one: AsyncRedlock, two: AsyncRedlock) -> None:
    reader = await one.rwlock("orders:rw").read(ttl=60.0).acquire()
    got: list[Lease] = []

    async def wait() -> None:
        got.append(await two.rwlock("orders:rw").write(timeout=HANG_GUARD).acquire())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await Waits(two).reach(1)
        await reader.release()
    await got[0].release()


async def test_rules_with_a_prefix_run_every_feature(make_servers: MakeServers) -> None:
    """`acl_rules("orders:*", prefix="app/")` exactly: multi-resource locks, queued
    fair waiters of several clients, a writer woken by a reader's release, a
    semaphore, inspect and force_release, with no denial in any master's ACL LOG."""
    group = make_servers(3)
    urls = await add_user(group, "prefixed", acl_rules("orders:*", prefix=PREFIX))
    with anyio.fail_after(HANG_GUARD):
        async with (
            AsyncRedlock(urls, prefix=PREFIX) as one,
            AsyncRedlock(urls, prefix=PREFIX, retry_delay=NEVER) as two,
            AsyncRedlock(urls, prefix=PREFIX, retry_delay=NEVER) as three,
        ):
            await _fair_queue(one, two, three)
            await _multi(one, two)
            await _writer_after_reader(one, two)
            held = [await one.semaphore("orders:sem", 1).acquire()]
            await held[0].release()
            lease = await one.lock("orders:op", ttl=60.0).acquire()
            state = await two.inspect("orders:op")
            assert state.holder == lease.value
            assert await two.force_release("orders:op") == 3
            for redlock in (one, two, three):
                await redlock.settle()
            assert client_state(two).subscribed == (True, True, True)
            assert two.statistics().wakeups >= 3
    assert await denials(group) == [[], [], []]


async def test_the_cli_within_the_rules(
    make_servers: MakeServers, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's commands as the user of `acl_rules()` (+scan for `list`, as
    documented), on a server that also holds keys outside the user's patterns."""
    group = make_servers(3)
    urls = await add_user(group, "cliuser", [*acl_rules("orders:*"), "+scan"])
    async with AsyncRedlock(group.urls) as admin:  # the default user: any key
        other = await admin.lock("billing:1", ttl=60.0).acquire()
        with anyio.fail_after(HANG_GUARD):
            async with AsyncRedlock(urls) as redlock:
                lease = await redlock.lock("orders:cli", ttl=60.0).acquire()
                args = master_args(urls)
                codes = {}
                codes["inspect"] = await cli("inspect", "orders:cli", *args)
                codes["watch"] = await cli("watch", "orders:cli", "--count", "1", *args)
                shown = capsys.readouterr().out
                codes["list"] = await cli("list", "orders:*", "--json", *args)
                listed = json.loads(capsys.readouterr().out)
                codes["force-release"] = await cli("force-release", "orders:cli", "--yes", *args)
                out = shown + capsys.readouterr().out
        await other.release()
    assert codes == {"inspect": 0, "watch": 0, "list": 0, "force-release": 0}, out
    assert [lock["name"] for lock in listed["locks"]] == ["orders:cli"]
    assert lease.value in out
    # nothing is refused: not even the CLIENT SETINFO redis-py sends by default
    assert await denials(group) == [[], [], []]


async def test_a_read_only_user_inspects_lists_and_watches_without_a_denial(
    make_servers: MakeServers, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user allowed only what inspect.lua reads (and SCAN for list): inspect, list
    and watch load no script ahead, so nothing lands in ACL LOG; force-release is
    refused (exit 3), its DEL the one denial logged."""
    group = make_servers(3)
    reader = ["+evalsha", "+eval", "+time", "+get", "+pttl", "+hget", "+zrange"]
    urls = await add_user(group, "ro", [*reader, "+zrangebyscore", "+zscore", "+scan", "~*"])
    async with AsyncRedlock(group.urls, identity="h") as admin:
        await admin.lock("ro:x", ttl=60.0).acquire()
        with anyio.fail_after(HANG_GUARD):
            args = master_args(urls)
            codes = [
                await cli("inspect", "ro:x", *args),
                await cli("list", *args),
                await cli("watch", "ro:x", "--count", "1", *args),
            ]
            read = await denials(group)
            codes.append(await cli("force-release", "ro:x", "--yes", *args))
    err = capsys.readouterr().err
    assert codes == [0, 0, 0, 3], err
    assert "refused by the masters' ACL" in err
    assert read == [[], [], []]
    refused = {
        (entry[b"reason"], entry[b"object"])
        for log in await denials(group)
        for entry in (
            e if isinstance(e, dict) else dict(zip(e[::2], e[1::2], strict=True)) for e in log
        )
    }
    assert refused == {(b"command", b"del")}


@pytest.mark.parametrize("user", ["locker", "nobody"])
async def test_a_wrong_password_or_unknown_user_fails_at_once_without_the_secret(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture, user: str
) -> None:
    """A wrong password or an unknown user (redis-py's AuthenticationError, WRONGPASS)
    on every master is a configuration error, as a refused certificate or a missing
    permission is: the acquisition ends after one attempt, saying so, instead of
    retrying it as an outage until its timeout. The password shows nowhere."""
    group = make_servers(3)
    await add_user(group, "locker", acl_rules("orders:*"))
    secret = "Wr0ngPa55word"
    urls = [url.replace("redis://", f"redis://{user}:{secret}@") for url in group.urls]
    caplog.set_level(logging.DEBUG)
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls, timeout=5.0) as redlock:
            shown = [repr(redlock), *redlock.masters]
            with pytest.raises(QuorumUnavailableError) as caught:
                await redlock.lock("orders:auth").acquire()
            attempts = redlock.statistics().attempts
    text = " ".join([str(caught.value), repr(caught.value), *shown, caplog.text])
    text += " ".join(o.detail for o in caught.value.outcomes)
    assert secret not in text
    assert PASSWORD not in text
    refused = [o for o in caught.value.outcomes if "AuthenticationError" in o.detail]
    assert len(refused) >= 2  # enough to decide the round; the third may be unheard
    assert "refused by the masters' AUTH (user or password)" in str(caught.value)
    assert "too many masters failed" not in str(caught.value)
    assert attempts == 1  # not retried until the timeout as an outage


@pytest.mark.parametrize(
    "missing", ["+subscribe", "&asyncredlock:inbox:*"], ids=["no-subscribe", "no-inbox"]
)
async def test_a_refused_subscription_is_not_silent(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture, missing: str
) -> None:
    """Rules lacking what the wake-up subscription needs: locks still work (waiters
    poll at their retry delay), but the refusal is logged at WARNING once per master,
    as a refused idle PING is (errors.md), not only at DEBUG where nobody sees it; and
    client_state() does not show the refused subscription as subscribed."""
    group = make_servers(3)
    rules = [rule for rule in acl_rules("orders:*") if rule != missing]
    assert len(rules) == len(acl_rules("orders:*")) - 1
    urls = await add_user(group, "deaf", rules)
    caplog.set_level(logging.DEBUG, logger="asyncredlock")
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls) as one, AsyncRedlock(urls, retry_delay=0.2) as two:
            held = await one.lock("orders:deaf", ttl=60.0).acquire()
            got: list[Lease] = []

            async def wait() -> None:
                got.append(await two.lock("orders:deaf", timeout=HANG_GUARD).acquire())

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await Waits(two).reach(1)
                await held.release()
            await got[0].release()
            woken = two.statistics().wakeups
            subscribed = client_state(two).subscribed
            masters = sorted(two.masters)
    refused = [r for r in caplog.records if "NOPERM" in r.getMessage()]
    assert refused, "the masters refused the SUBSCRIBE"
    assert woken == 0  # it polled: no wake-up came
    assert [r.levelname for r in refused if r.levelno >= logging.WARNING], [
        (r.levelname, r.getMessage()) for r in refused
    ]
    assert subscribed == (False, False, False)
    warned = [r.getMessage() for r in refused if r.levelno >= logging.WARNING]
    assert sorted(message.split()[1] for message in warned) == masters
    assert all("acl_rules()" in message for message in warned)


async def subscribers(group: ServerGroup, channel: str) -> list[int]:
    """How many connections each server has subscribed to ``channel``."""
    counts = []
    for url in group.urls:
        async with Redis.from_url(url) as admin:
            counts.append(dict(await admin.pubsub_numsub(channel))[channel.encode()])
    return counts


async def test_a_refused_channel_does_not_refuse_the_others_after_a_reconnection(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture
) -> None:
    """The user may use the keys of ``billing:*`` but not its channels: a semaphore's
    waiter there polls, as documented. After the subscription connections are lost,
    the waiters' channels are subscribed again; the refused one must not take the
    allowed ones with it (one SUBSCRIBE for them all was refused as a whole: the
    waiter on ``orders:s``, with no retry delay to fall back on, was never woken)."""
    group = make_servers(3)
    rules = [*acl_rules("orders:*"), "~billing:*", "~{billing:*}:*"]
    urls = await add_user(group, "halfdeaf", rules)
    channel = "{orders:s}:sem:0:released"
    caplog.set_level(logging.DEBUG, logger="asyncredlock")
    with anyio.fail_after(HANG_GUARD):
        async with AsyncRedlock(urls) as one, AsyncRedlock(urls, retry_delay=NEVER) as two:
            billing = await one.semaphore("billing:s", 1, ttl=60.0).acquire()
            held = await one.semaphore("orders:s", 1, ttl=60.0).acquire()
            waits, took = Waits(two), anyio.Event()
            got: list[Lease] = []

            async def wait(name: str) -> None:
                got.append(await two.semaphore(name, 1, timeout=HANG_GUARD).acquire())
                took.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait, "billing:s")
                await waits.reach(1)
                tg.start_soon(wait, "orders:s")
                await waits.reach(2)
                assert await subscribers(group, channel) == [1, 1, 1]
                for url in group.urls:  # every subscription connection is lost
                    async with Redis.from_url(url) as admin:
                        await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                for _ in range(400):  # (no event tells a master subscribed it again)
                    if await subscribers(group, channel) == [1, 1, 1]:
                        break
                    await anyio.sleep(0.025)
                assert await subscribers(group, channel) == [1, 1, 1]
                await held.release()
                await took.wait()  # the waiter on orders:s is woken and takes the slot
                assert [lease.resource for lease in got] == ["orders:s"]
                tg.cancel_scope.cancel()  # the billing waiter, which polls (NEVER)
            await got[0].release()
            await billing.release()
    assert any("NOPERM" in r.getMessage() for r in caplog.records)
