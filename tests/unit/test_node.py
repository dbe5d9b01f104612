"""`_node`: a round's command is packed once for all of its masters."""

from __future__ import annotations

import hiredis

from asyncredlock._node import _LastPacked
from asyncredlock._scripts import ACQUIRE, RELEASE


def test_the_same_tuples_are_packed_once_and_equal_a_fresh_packing() -> None:
    last = _LastPacked()
    keys, args = ("k", "{k}:fence"), ("v", 10_000, "64")
    command, packed = last.pack(ACQUIRE, keys, args)
    assert command == ("EVALSHA", ACQUIRE.sha, 2, "k", "{k}:fence", "v", 10_000, "64")
    assert packed == hiredis.pack_command(command)
    again = last.pack(ACQUIRE, keys, args)
    assert again[1] is packed  # the next master of the round: not packed again


def test_another_script_or_other_objects_are_packed_anew() -> None:
    last = _LastPacked()
    keys, args = ("k",), ("v", 0)
    _, packed = last.pack(ACQUIRE, keys, args)
    assert last.pack(RELEASE, keys, args)[1] is not packed
    _, release = last.pack(RELEASE, keys, args)
    equal_keys = ("".join(keys),)  # equal, but not the same object
    assert equal_keys == keys
    assert equal_keys is not keys
    assert last.pack(RELEASE, equal_keys, args)[1] is not release


def test_lists_are_never_kept_as_they_could_change() -> None:
    last = _LastPacked()
    keys, args = ["k"], ("v",)
    _, first = last.pack(RELEASE, keys, args)
    keys[0] = "other"
    command, packed = last.pack(RELEASE, keys, args)
    assert command[3] == "other"
    assert packed != first
