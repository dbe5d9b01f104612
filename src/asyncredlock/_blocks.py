"""A ``Lock``'s open ``async with`` blocks, by entering task: finding the block an
exit belongs to, and forgetting blocks whose lease has ended."""

from __future__ import annotations

import asyncio
from inspect import CO_ASYNC_GENERATOR
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._lease import Lease

__all__ = [
    "ENDED",
    "Entered",
    "Owner",
    "by_frame",
    "drop_ended",
    "exits_by_frame",
    "latest",
    "may_exit_elsewhere",
]


class _Ended:
    """The key of the open blocks of tasks that ended."""


ENDED = _Ended()
# a Lock's open blocks by entering task: each the frame that entered it and its lease
Owner = asyncio.Task[Any] | None | _Ended
Entered = dict[Owner, list[tuple[FrameType | None, "Lease"]]]


def by_frame(entered: Entered, task: Owner, frame: FrameType | None) -> tuple[Owner, int] | None:
    """The block entered from ``frame`` (``async with`` enters and exits a block from
    one frame, a generator's when another task resumes it): its task and index,
    ``task``'s looked at first."""
    if frame is None:
        return None
    stack = entered.get(task)
    if stack is not None and stack[-1][0] is frame:
        return task, len(stack) - 1
    found = None  # (the latest: two blocks of one frame exit innermost first)
    for owner, blocks in entered.items():
        for index, (entered_from, _) in enumerate(blocks):
            if entered_from is frame:
                found = owner, index
    return found


def latest(entered: Entered, task: Owner) -> tuple[Owner, int] | None:
    """``task``'s latest block that may be exited from another frame than its own."""
    for index in reversed(range(len(entered.get(task, ())))):
        if not exits_by_frame(entered[task][index][0]):
            return task, index
    return None


def exits_by_frame(frame: FrameType | None) -> bool:
    """Whether a block entered from ``frame`` is exited from it alone: an async
    generator's (``async with`` around a ``yield``), whose exit is found by frame."""
    return frame is not None and bool(frame.f_code.co_flags & CO_ASYNC_GENERATOR)


def may_exit_elsewhere(entered: Entered) -> list[tuple[Owner, int]]:
    """The blocks an exit from another task and frame may be of whose lease is still
    held (a block whose lease has ended has none left to release)."""
    return [
        (owner, index)
        for owner, stack in entered.items()
        for index, (frame, lease) in enumerate(stack)
        if lease.held and not exits_by_frame(frame)
    ]


def drop_ended(entered: Entered) -> None:
    """Forget the blocks of tasks that ended whose lease has ended (released by hand,
    lost, closed by max_hold), so as not to keep their frames and leases: nothing is
    left to release on their exit. (A live task's are kept: its exits find its blocks
    by frame, or its latest.)"""
    stack = entered.get(ENDED)
    if stack is None:
        return
    stack[:] = [entry for entry in stack if entry[1].held]
    if not stack:
        del entered[ENDED]
