"""Review of ACL users: a user made exactly from `acl_rules()` (with a prefix) runs
multi-resource locks, queued fair hand-overs, rwlocks, semaphores and the CLI; a wrong
password or unknown user; a refused wake-up subscription. Complements test_acl.py."""

from __future__ import annotations

import logging

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, acl_rules
from asyncredlock.testing import Waits
from asyncredlock.testing.pytest_plugin import MakeServers

from .test_acl import add_user

pytestmark = pytest.mark.anyio

HANG_GUARD = 30


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
