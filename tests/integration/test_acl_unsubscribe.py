"""A user whose ACL rules lack only ``+unsubscribe`` (the docs review of 2026-11-29):
docs/errors.md ("Logging") and docs/usage.md ("Least-privilege ACL") say that the
warning "master ... refuses the wake-up subscription (...): waiters poll at their retry
delay instead" is for a refused ``SUBSCRIBE`` (a user without ``+subscribe`` or the
channels), and that ``client_state()`` then shows that master as not ``subscribed``;
a refused ``UNSUBSCRIBE`` has a warning of its own. Checked against real servers."""

from __future__ import annotations

import logging

import anyio
import pytest

from asyncredlock import AsyncRedlock, Lease, _log, acl_rules
from asyncredlock.testing import Waits, client_state
from asyncredlock.testing.pytest_plugin import MakeServers

from .conftest import polled
from .test_acl import HANG_GUARD, NEVER, add_user, denials

pytestmark = pytest.mark.anyio


async def test_a_refused_unsubscribe_is_not_logged_as_a_refused_subscription(
    make_servers: MakeServers, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rules without +unsubscribe (SUBSCRIBE and the channels granted): a semaphore
    waiter subscribes its slots' channels and is woken by the release (its retry delay
    is an hour), so the subscription works; once it holds the slot nobody waits on the
    channels and its UNSUBSCRIBE is refused. That is logged once per master as the
    UNSUBSCRIBE's refusal, not as "refuses the wake-up subscription ... waiters poll at
    their retry delay instead", and client_state() shows every master subscribed."""
    monkeypatch.setattr(_log, "_REFUSALS_LOGGED", set())  # once per process: fresh here
    group = make_servers(3)
    rules = [rule for rule in acl_rules("sem:*") if rule != "+unsubscribe"]
    urls = await add_user(group, "nounsub", rules)
    caplog.set_level(logging.WARNING, logger="asyncredlock")
    with anyio.fail_after(HANG_GUARD):
        async with (
            AsyncRedlock(urls) as holder,
            AsyncRedlock(urls, retry_delay=NEVER) as waiter,
        ):
            held = await holder.semaphore("sem:unsub", 1, ttl=60.0).acquire()
            leases: list[Lease] = []
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    semaphore = waiter.semaphore("sem:unsub", 1, ttl=60.0, timeout=NEVER)
                    leases.append(await semaphore.acquire())

                with Waits(waiter) as waits:
                    tg.start_soon(wait)
                    await waits.reach(waiting=1)
                await held.release()
            (lease,) = leases  # woken by the release: the subscription works
            # the UNSUBSCRIBE went out once nobody waited: wait until every master's
            # reply to it is read (nothing expected on the subscription connections)
            listeners = waiter._core.waker.listeners
            assert await polled(
                lambda: all(
                    each is not None
                    and each.connection is not None
                    and not each.channels
                    and not each.connection.expected
                    for each in listeners
                )
            )
            logged = await denials(group)
            await lease.release()
            state = client_state(waiter)
            names = [node.name for node in waiter._core.nodes]
    refused = [[entry for entry in log if b"unsubscribe" in repr(entry).encode()] for log in logged]
    messages = [record.getMessage() for record in caplog.records]
    wrongly = [m for m in messages if "refuses the wake-up subscription" in m]
    assert any(refused), logged  # the masters did refuse the UNSUBSCRIBE
    assert wrongly == [], wrongly
    assert all(state.subscribed), state
    unsubscribe = sorted(m for m in messages if "refuses UNSUBSCRIBE" in m)
    assert unsubscribe == sorted(
        f"master {name} refuses UNSUBSCRIBE (NOPERM User nounsub has no permissions to run"
        " the 'unsubscribe' command): the channels nobody waits on stay subscribed until"
        " the connection is reopened; grant +unsubscribe (acl_rules() includes it)"
        for name, log in zip(names, refused, strict=True)
        if log
    )
