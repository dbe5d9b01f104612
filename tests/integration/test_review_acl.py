"""Review of ACL users: a user made exactly from `acl_rules()` (with a prefix) runs
multi-resource locks, queued fair hand-overs, rwlocks, semaphores and the CLI; a wrong
password or unknown user; a refused wake-up subscription. Complements test_acl.py."""

from __future__ import annotations

import json
import logging

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, QuorumUnavailableError, acl_rules
from asyncredlock.testing import Waits, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .test_acl import PASSWORD, add_user, denials
from .test_cli import cli, master_args

pytestmark = pytest.mark.anyio

HANG_GUARD = 30
NEVER = 3600.0
PREFIX = "app/"


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
    # the `list` command's redis-py client sends CLIENT SETINFO, refused and ignored
    # (noise in ACL LOG only); nothing else is refused
    refused = {entry[b"object"] for log in await denials(group) for entry in log}
    assert refused <= {b"client|setinfo"}


@pytest.mark.parametrize("user", ["locker", "nobody"])
async def test_a_wrong_password_or_unknown_user_fails_at_once_without_the_secret(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture, user: str
) -> None:
    """AUTH refused by every master is a configuration error, as a refused
    certificate or a missing permission is (those end an acquisition after one
    attempt, see errors.md): retrying cannot mend it. The password shows nowhere."""
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
    assert all("AuthenticationError" in o.detail for o in caught.value.outcomes)
    # the finding: it is retried until the timeout (dozens of attempts), and the
    # message reads as an outage ("too many masters failed or did not answer")
    assert "too many masters failed" not in str(caught.value)
    assert attempts == 1


@pytest.mark.parametrize(
    "missing", ["+subscribe", "&asyncredlock:inbox:*"], ids=["no-subscribe", "no-inbox"]
)
async def test_a_refused_subscription_is_not_silent(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture, missing: str
) -> None:
    """Rules lacking what the wake-up subscription needs: locks still work (waiters
    poll at their retry delay), but the refusal is logged at WARNING, as a refused
    idle PING is (errors.md), not only at DEBUG where nobody sees it."""
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
    refused = [r for r in caplog.records if "NOPERM" in r.getMessage()]
    assert refused, "the masters refused the SUBSCRIBE"
    assert woken == 0  # it polled: no wake-up came
    assert [r.levelname for r in refused if r.levelno >= logging.WARNING], [
        (r.levelname, r.getMessage()) for r in refused
    ]
