"""``asyncredlock list`` on masters that lost their script cache (restarted, failed
over to a replica, ``SCRIPT FLUSH``): the CLI loads no script ahead, and reads up to
100 locks at once (``inspect()`` each), so on one connection per master the INSPECT
calls go out back to back. A NOSCRIPT with calls behind it is not re-sent as EVAL
(algorithm.md): that call failed, and every one behind it, and the listing showed
held locks as not held, or sent SCRIPT LOAD (a read-only user's ACL LOG denial). The
first lock is now read alone."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock
from asyncredlock.__main__ import main
from asyncredlock.testing import ServerGroup

pytestmark = pytest.mark.anyio

WAIT = 30.0


@pytest.fixture(autouse=True)
def _no_masters_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDLOCK_MASTERS", raising=False)


async def _flush_scripts(urls: list[str]) -> None:
    for url in urls:
        async with Redis.from_url(url) as client:
            await client.script_flush()


async def test_list_after_the_masters_lost_their_script_cache_shows_the_held_locks(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = servers.urls[:3]
    args = [arg for url in urls for arg in ("--master", url)]
    with anyio.fail_after(WAIT):
        async with AsyncRedlock(urls, identity="lister") as redlock:
            leases = [
                await redlock.lock(name, ttl=60.0, auto_extend=False).acquire()
                for name in ("jobs:1", "jobs:2", "jobs:3")
            ]
            await redlock.settle()
            # the masters restarted with their data (or failed over): no script cached
            await _flush_scripts(urls)
            code = await anyio.to_thread.run_sync(main, ["list", "--json", *args])
            captured = capsys.readouterr()
            for lease in leases:
                await lease.release()
    assert code == 0, captured.err
    for name in ("jobs:1", "jobs:2", "jobs:3"):
        assert f'"name": "{name}"' in captured.out, (
            f"{name!r} is held on 3 of 3 masters but not listed: {captured.out!r}"
        )


async def test_inspect_alone_after_the_masters_lost_their_script_cache(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control: one INSPECT per master (``asyncredlock inspect``) is re-sent as
    EVAL (nothing behind it) and reads the lock. Passes on main."""
    urls = servers.urls[:3]
    args = [arg for url in urls for arg in ("--master", url)]
    with anyio.fail_after(WAIT):
        async with AsyncRedlock(urls, identity="lister") as redlock:
            lease = await redlock.lock("jobs:9", ttl=60.0, auto_extend=False).acquire()
            await redlock.settle()
            await _flush_scripts(urls)
            code = await anyio.to_thread.run_sync(main, ["inspect", "jobs:9", *args])
            captured = capsys.readouterr()
            await lease.release()
    assert code == 0, captured.err
    assert lease.value in captured.out


async def test_list_by_a_read_only_user_leaves_no_denial_in_acl_log(
    servers: ServerGroup, capsys: pytest.CaptureFixture[str]
) -> None:
    """usage.md: the commands load no script ahead, "so a read-only user allowed
    EVALSHA, EVAL and the commands inspect.lua calls [...], plus SCAN for list, runs
    inspect, list and watch without a denial in ACL LOG". With two locks to read on a
    master lacking the script, the NOSCRIPT path sends SCRIPT LOAD: denied."""
    urls = servers.urls[:3]
    user, password = "rdiffreader", "rdiff-pw"
    rules = ["on", f">{password}", "~*", "+evalsha", "+eval", "+scan", "+ping"]
    rules += ["+time", "+get", "+pttl", "+hget", "+zrange", "+zrangebyscore", "+zscore"]
    reader_urls = [url.replace("redis://", f"redis://{user}:{password}@") for url in urls]
    args = [arg for url in reader_urls for arg in ("--master", url)]
    try:
        with anyio.fail_after(WAIT):
            for url in urls:
                async with Redis.from_url(url) as client:
                    await client.execute_command("ACL", "SETUSER", user, "reset", *rules)
                    await client.execute_command("ACL", "LOG", "RESET")
            async with AsyncRedlock(urls, identity="lister") as redlock:
                leases = [
                    await redlock.lock(name, ttl=60.0, auto_extend=False).acquire()
                    for name in ("ro:1", "ro:2")
                ]
                await redlock.settle()
                await _flush_scripts(urls)
                code = await anyio.to_thread.run_sync(main, ["list", *args])
                captured = capsys.readouterr()
                for lease in leases:
                    await lease.release()
            denials = []
            for url in urls:
                async with Redis.from_url(url) as client:
                    for entry in await client.acl_log():
                        if entry.get("username") in (user, user.encode()):
                            denials.append((entry.get("reason"), entry.get("object")))
    finally:
        for url in urls:
            async with Redis.from_url(url) as client:
                await client.execute_command("ACL", "DELUSER", user)
                await client.execute_command("ACL", "LOG", "RESET")
    assert code == 0, captured.err
    assert denials == [], f"list by a read-only user was denied: {denials!r}"
