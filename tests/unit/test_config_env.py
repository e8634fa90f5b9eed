"""Every setting by environment, one rule (issue 26): ``RELAYBOT_<SECTION>__<KEY>``, lists
comma-separated or JSON, tables JSON; a variable of that form that names no key is a one-line
configuration error. Before: a gateway configured by environment alone (deploy/README.md) had
no way to get ``owner.aliases``, and recorded the owner's mail without answering it."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.config import ConfigError, OwnerAlias, parse_config
from gateways.email.gateway import addresses_of

HOME = Path("/nonexistent/relaybot-home")


def test_a_gateway_gets_the_owner_and_its_section_from_the_environment_alone() -> None:
    cfg = parse_config(
        None,
        HOME,
        {
            "RELAYBOT_OWNER__ALIASES": "ada@example.org, @ada:example.org",
            "RELAYBOT_EMAIL__IMAP_HOST": "127.0.0.1",
            "RELAYBOT_EMAIL__ALLOWLIST": "bob@example.com,@example.net",
            "RELAYBOT_EMAIL__TRUSTED_AUTHSERV_IDS": "mx.example.org",
            "RELAYBOT_EMAIL__REPLY_WINDOW": "0",
            "RELAYBOT_MATRIX__GROUP_POLICY": "open",
            "RELAYBOT_MATRIX__ROOMS": '{"!r:hs": {"policy": "allowlist", "allowlist": ["@b:hs"]}}',
        },
    )
    addrs = addresses_of(cfg)
    assert addrs.owner == frozenset({"ada@example.org"})  # the owner's mail is answered
    assert addrs.allow == frozenset({"bob@example.com", "@example.net"})
    assert addrs.trusted_ids == frozenset({"mx.example.org"})
    assert cfg.email.reply_window == 0  # type: ignore[attr-defined]
    assert cfg.matrix.group_policy == "open"  # type: ignore[attr-defined]
    assert cfg.matrix.rooms["!r:hs"].allowlist == ["@b:hs"]  # type: ignore[attr-defined]


def test_json_gives_scoped_aliases_and_nested_keys() -> None:
    cfg = parse_config(
        None,
        HOME,
        {
            "RELAYBOT_OWNER__ALIASES": '[{"address": "ada@example.org", "channel": "email"}]',
            "RELAYBOT_MODEL__DERIVE__MODEL": "small",
            "RELAYBOT_EMAIL__TRUST_UNAUTHENTICATED": "true",
        },
    )
    assert cfg.owner.aliases == [OwnerAlias(address="ada@example.org", channel="email")]
    assert cfg.model.derive is not None and cfg.model.derive.model == "small"
    assert cfg.email.trust_unauthenticated is True  # type: ignore[attr-defined]


def test_the_environment_wins_over_the_file_and_the_older_names() -> None:
    raw = b'[email]\nallowlist = ["a@x.org"]\n'
    env = {"RELAYBOT_EMAIL_ALLOWLIST": "old@x.org", "RELAYBOT_EMAIL__ALLOWLIST": "new@x.org"}
    cfg = parse_config(raw, HOME, env)
    assert cfg.email.allowlist == ["new@x.org"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"RELAYBOT_EMIAL__ALLOWLIST": "x"}, "no section 'emial' (did you mean email?)"),
        (
            {"RELAYBOT_EMAIL__ALLOWLST": "x"},
            "[email] has no key 'allowlst' (did you mean allowlist?)",
        ),
        ({"RELAYBOT_OWNER__ALIASES": "[oops"}, "not valid JSON"),
        ({"RELAYBOT_MATRIX__ROOMS": "x"}, "give it as a JSON object"),
        (
            {"RELAYBOT_EMAIL__IMAP_PORT": "abc"},
            "with RELAYBOT_EMAIL__IMAP_PORT from the environment",
        ),
        ({"RELAYBOT_EMAIL__IMAP_HOST__X": "1"}, "email.imap_host is not a table"),
        ({"RELAYBOT_REDIS__CA_FILE": "/ca.pem"}, "not rediss://"),
    ],
)
def test_a_variable_that_names_no_key_or_holds_a_bad_value_is_one_line(
    env: dict[str, str], said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(None, HOME, env)
    message = str(caught.value)
    assert said in message and "\n" not in message
    assert next(iter(env)) in message or "ca_file" in message
