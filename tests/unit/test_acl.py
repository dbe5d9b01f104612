"""`acl_rules`: what it grants, and that it names every command the scripts call."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from asyncredlock import acl_rules
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
