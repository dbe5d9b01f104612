"""Faults on the client's side of the wire: what a test needs to make happen inside
an ``AsyncRedlock`` that no server or proxy fault can, at a point it chooses.

Each is a context manager: the fault holds inside the ``with`` block and is undone
when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from .._node import Node
from .._redlock import AsyncRedlock
from .._scripts import FENCED_WRITE, SCRIPTS, Script
from .._wire import Reply

__all__ = ["HeldCalls", "deafened", "hold_calls", "whole_retry_delay"]

_SCRIPTS = {script.name: script for script in (*SCRIPTS, FENCED_WRITE)}


def _check(redlock: object) -> AsyncRedlock:
    if not isinstance(redlock, AsyncRedlock):
        raise TypeError(f"expected an AsyncRedlock, not {type(redlock).__name__}")
    return redlock


@contextlib.contextmanager
def whole_retry_delay(*redlocks: AsyncRedlock) -> Iterator[None]:
    """Every retry pause of these clients lasts their whole ``retry_delay`` (no
    jitter; still cut short by the holder's expiry, the deadline, or a release's
    announcement).

    With a ``retry_delay`` longer than the test's own bound, a waiter that gets the
    lock in time can only have been woken by the release: the test shows the
    announcement works, not that a retry happened to come soon after it.

    Raises:
        TypeError: An argument is not an ``AsyncRedlock``.
    """
    cores = list({id(core): core for core in (_check(each)._core for each in redlocks)}.values())
    before = [vars(core).get("retry_pause") for core in cores]  # an enclosing block's
    for core in cores:
        # shadows the method in the instance's dict for this block
        vars(core)["retry_pause"] = functools.partial(float, core.settings.retry_delay)
    try:
        yield
    finally:
        for core, pause in zip(cores, before, strict=True):
            _restore(core, "retry_pause", pause)


def _restore(owner: object, name: str, value: Any) -> None:
    """Put back what the instance's dict held under ``name`` (nothing: the method)."""
    if value is None:
        vars(owner).pop(name, None)
    else:
        vars(owner)[name] = value


@contextlib.contextmanager
def deafened(redlock: AsyncRedlock) -> Iterator[None]:
    """The client's subscriptions drop every message they receive: releases, and
    keys handed over to its waiters by the masters, go unheard (as pub/sub
    messages are lost around a reconnect). Its waiters retry on their own.

    Raises:
        TypeError: ``redlock`` is not an ``AsyncRedlock``.
    """
    listeners = [each for each in _check(redlock)._core.waker.listeners if each is not None]
    heard = [listener.on_message for listener in listeners]
    for listener in listeners:
        listener.on_message = _drop
    try:
        yield
    finally:
        for listener, on_message in zip(listeners, heard, strict=True):
            listener.on_message = on_message


def _drop(index: int, channel: str, value: bytes) -> None:
    """A message that never arrived."""


class HeldCalls:
    """The calls `hold_calls` holds back before they are sent.

    Attributes:
        reached: Set when the first call is held.
        held: How many calls were held so far.
    """

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.held = 0
        self._gate = asyncio.Event()

    def let_go(self) -> None:
        """Send the calls held so far, and every later one at once."""
        self._gate.set()

    async def _later(
        self,
        send: Callable[..., Awaitable[Reply]],
        call: tuple[Script, Sequence[str], Sequence[Any]],
    ) -> Reply:
        self.held += 1
        self.reached.set()
        await self._gate.wait()
        return await send(*call)


@contextlib.contextmanager
def hold_calls(redlock: AsyncRedlock, script: str) -> Iterator[HeldCalls]:
    """Hold back the client's calls of one script (``"commit"``, the second phase of
    a fenced acquisition, for instance) before they are sent, until
    `HeldCalls.let_go`: a test can act between two steps of the protocol. The
    calls still run on the servers once let go; those held when the block ends
    are let go then. Blocks for different scripts may be nested: each holds its
    own script's calls.

    Raises:
        TypeError: ``redlock`` is not an ``AsyncRedlock``.
        ValueError: ``script`` names none of the library's scripts.
    """
    nodes = _check(redlock)._core.nodes
    held_script = _SCRIPTS.get(script)
    if held_script is None:
        raise ValueError(f"no script {script!r}; the scripts are {', '.join(sorted(_SCRIPTS))}")
    held = HeldCalls()

    def holding(node: Node, outer: Any) -> Any:
        # an enclosing block's hold, else the method itself
        send = outer if outer is not None else functools.partial(Node.call, node)

        def call(script: Script, keys: Sequence[str], args: Sequence[Any]) -> asyncio.Future[Reply]:
            if script is not held_script:
                return asyncio.ensure_future(send(script, keys, args))
            return asyncio.ensure_future(held._later(send, (script, keys, args)))

        return call

    before = [vars(node).get("call") for node in nodes]
    for node, outer in zip(nodes, before, strict=True):
        vars(node)["call"] = holding(node, outer)  # shadows the method for this block
    try:
        yield held
    finally:
        held.let_go()
        for node, outer in zip(nodes, before, strict=True):
            _restore(node, "call", outer)
