"""Recognising the owner from configured aliases."""

from __future__ import annotations

import pytest

from contract.config import OwnerAlias, OwnerConfig
from memory.identity import OwnerResolver


def test_unscoped_alias_counts_on_every_channel_case_insensitively() -> None:
    resolver = OwnerResolver(["  Me@Example.org "])
    assert resolver.configured
    assert resolver.is_owner("email", "me@example.org")
    assert resolver.is_owner("EMAIL", "  ME@EXAMPLE.ORG\n")
    assert resolver.is_owner("matrix", "me@example.org")
    assert not resolver.is_owner("email", "someone@example.org")
    assert not resolver.is_owner("email", "")


def test_a_channel_scoped_alias_wins_over_unscoped_ones() -> None:
    resolver = OwnerResolver(
        ["me@example.org", OwnerAlias(address="@Me:Matrix.org", channel="Matrix")]
    )
    assert resolver.is_owner("matrix", "@me:matrix.org")
    # on a channel with scoped aliases only those count, even if an unscoped one matches
    assert not resolver.is_owner("matrix", "me@example.org")
    # other channels keep using the unscoped aliases; the scoped one does not leak
    assert resolver.is_owner("email", "me@example.org")
    assert not resolver.is_owner("email", "@me:matrix.org")


def test_an_unscoped_owner_alias_object_is_like_a_plain_string() -> None:
    resolver = OwnerResolver([OwnerAlias(address="me@example.org")])
    assert resolver.is_owner("email", "ME@example.org")
    assert resolver.is_owner("cli", "me@example.org")


@pytest.mark.parametrize("aliases", [[], ["   "]])
def test_with_no_aliases_only_the_terminal_is_the_owner(aliases: list[str]) -> None:
    resolver = OwnerResolver(aliases)
    assert not resolver.configured
    assert resolver.is_owner("cli", "anyone")
    assert resolver.is_owner(" CLI ", "alice")
    assert not resolver.is_owner("matrix", "@me:matrix.org")
    assert not resolver.is_owner("email", "me@example.org")


def test_unscoped_aliases_do_not_disown_the_terminal() -> None:
    resolver = OwnerResolver(["me", OwnerAlias(address="@me:m.org", channel="matrix")])
    assert resolver.is_owner("cli", "me")
    assert resolver.is_owner("cli", "alice")  # whoever sits at the owner's terminal
    assert not resolver.is_owner("email", "alice")


def test_cli_scoped_aliases_decide_on_the_terminal() -> None:
    resolver = OwnerResolver([OwnerAlias(address="ada", channel="cli")])
    assert resolver.is_owner("cli", "ada")
    assert not resolver.is_owner("cli", "guest")


def test_accepts_aliases_as_configured() -> None:
    cfg = OwnerConfig.model_validate(
        {"aliases": ["me@example.org", {"address": "@me:m.org", "channel": "matrix"}]}
    )
    resolver = OwnerResolver(cfg.aliases)
    assert resolver.is_owner("matrix", "@me:m.org")
    assert resolver.is_owner("email", "me@example.org")
