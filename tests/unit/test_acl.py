"""`acl_rules`: what it grants, and that it names every command the scripts call."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from asyncredlock import NodeOutcome, acl_rules
from asyncredlock._quorum import Decision
from asyncredlock._refusal import refusal as acl_refusal
from asyncredlock._scripts import SCRIPTS


class TestRules:
    def test_orders_rules(self) -> None:
        rules = acl_rules("orders:*")
        assert "+evalsha" in rules
        assert "+script|load" in rules
        assert "+time" in rules
        assert "+publish" in rules
        assert "+subscribe" in rules
        assert "~orders:*" in rules
        assert "~{orders:*}:*" in rules
        assert "&{orders:*}:released" in rules
        assert "&{orders:*}:sem:*:released" in rules
        assert "&asyncredlock:inbox:*" in rules
        assert len(rules) == len(set(rules))
        assert not any(rule.startswith(("+@", "~*", "&*")) for rule in rules)

    def test_any_name(self) -> None:
        assert [r for r in acl_rules() if r[0] in "~&"] == [
            "~*",
            "&*:released",
            "&asyncredlock:inbox:*",
        ]

    def test_one_name_and_a_prefix(self) -> None:
        rules = acl_rules("42", prefix="app*:")
        assert [r for r in rules if r[0] in "~&"] == [
            "~app\\*:42",
            "~{app\\*:42}:*",
            "&{app\\*:42}:released",
            "&{app\\*:42}:sem:*:released",
            "&asyncredlock:inbox:*",
        ]

    @pytest.mark.parametrize("keys", ["", "a b"])
    def test_bad_patterns(self, keys: str) -> None:
        with pytest.raises(ValueError, match="keys"):
            acl_rules(keys)


def test_every_command_the_scripts_call_is_granted() -> None:
    granted = {rule[1:] for rule in acl_rules() if rule.startswith("+")}
    called = set()
    for script in SCRIPTS:
        called |= {name.lower() for name in re.findall(r"redis\.p?call\('(\w+)'", script.source)}
    assert called
    assert called <= granted, called - granted
    assert {"evalsha", "eval", "script|load", "subscribe", "unsubscribe"} <= granted


def test_announcements_are_published_with_pcall() -> None:
    """A PUBLISH refused (by an ACL) must not fail the release that deleted the key."""
    lua = resources.files("asyncredlock").joinpath("lua")
    for path in lua.iterdir():
        text = path.read_text("utf-8")
        assert "redis.call('PUBLISH'" not in text, path.name


def test_the_docs_print_the_rules_for_orders() -> None:
    usage = Path(__file__).parents[2] / "docs" / "usage.md"
    assert " ".join(acl_rules("orders:*")) in usage.read_text("utf-8")


@pytest.mark.parametrize(
    "refusal",
    [
        "NoPermissionError: No permissions to access a key",
        "ResponseError: ACL failure in script: User u has no permissions to run the 'time' command",
        # Redis 7.0 words a refusal inside a script differently (seen with 7.0.15)
        "ResponseError: The user executing the script can't run this command or subcommand",
        "ResponseError: The user executing the script can't access at least one of the keys "
        "mentioned in the command arguments",
        "ResponseError: The user executing the script can't publish to the channel mentioned "
        "in the command",
    ],
)
def test_a_refusal_on_a_majority_is_named(refusal: str) -> None:
    """Each server's wording of an ACL refusal ends the acquisition (no retry can help)."""
    outcomes = (
        NodeOutcome("a", False, refusal),
        NodeOutcome("b", False, refusal),
        NodeOutcome("c", True, "granted"),
    )
    assert acl_refusal(Decision(1, 0, 2, outcomes)) == refusal
    # on a minority only, a quorum could still be reached elsewhere: not a refusal
    assert (
        acl_refusal(Decision(2, 0, 1, (*outcomes[1:], NodeOutcome("d", True, "granted")))) is None
    )


def test_an_error_that_is_not_a_refusal_is_not_named() -> None:
    outcomes = tuple(NodeOutcome(n, False, "ConnectionError: reset") for n in "abc")
    assert acl_refusal(Decision(0, 0, 3, outcomes)) is None
