"""Issue 24, item 5: what a gateway account can claim. A gateway is trusted for its channel's
senders, and no further: its entry cannot borrow a conversation of another audience (a group
entry naming the owner's DM), its conversation, sender, audience and class must hang together,
and with ``[owner] trusted_channels`` the owner's turns from a channel the owner does not trust
see their own conversation only (not the terminal, not MEMORY.md, not other conversations)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract.config import Config, ConfigError, load_config
from contract.messages import InboundMessage, Kind, Privacy, audience_key
from memory.store import MemoryStore
from tests.support.fakes import InstantModel
from tests.support.worker import handle_entries
from worker.claims import audience_refusal
from worker.main import assemble
from worker.tools import default_tools
from worker.turn import Turns

OWNER, MALLORY, BOB = "@ada:x", "@mallory:x", "@bob:x"
DM = f"matrix:!dm:x/{audience_key([OWNER])}"


def owner_only(channel: str, address: str) -> bool:
    return address.lower() == OWNER


def entry(**changes: Any) -> InboundMessage:
    fields: dict[str, Any] = {
        "channel": "matrix", "session": "matrix:!dm:x", "conversation": DM, "sender": OWNER,
        "privacy": Privacy.OWNER, "text": "hi", "ts": 1.0, "event_id": "$e",
        "extra": {"audience": [OWNER]},
    }  # fmt: skip
    fields.update(changes)
    return InboundMessage.model_validate(fields)


def test_what_the_gateway_would_write_passes() -> None:
    assert audience_refusal(entry(), owner_only) == ""
    room = "matrix:!r:x"  # a group room whose newcomers read its history: no key
    group = entry(conversation=room, sender=BOB, privacy=Privacy.GROUP,
                  extra={"audience": [OWNER, BOB, MALLORY]})  # fmt: skip
    assert audience_refusal(group, owner_only) == ""
    direct = entry(conversation=f"matrix:!b:x/{audience_key([BOB])}", sender=BOB,
                   privacy=Privacy.DIRECT, extra={"audience": [BOB]})  # fmt: skip
    assert audience_refusal(direct, owner_only) == ""
    # before audiences were checked: no key, no audience, taken as the gateway says
    assert audience_refusal(entry(conversation="matrix:!old:x", extra={}), owner_only) == ""
    # the terminal says no audience, and needs none
    cli = entry(channel="cli", session="cli:t", conversation="cli:t", sender="ada", extra={})
    assert audience_refusal(cli, owner_only) == ""


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        # mallory's group entry naming the owner's DM: the key is not her audience's
        ({"sender": MALLORY, "privacy": Privacy.GROUP, "extra": {"audience": [OWNER, MALLORY]}},
         "another audience"),
        # ... nor when it copies the owner's audience: she is not in it
        ({"sender": MALLORY, "privacy": Privacy.GROUP, "extra": {"audience": [OWNER]}},
         "not in the audience"),
        # ... nor when it leaves the audience out
        ({"sender": MALLORY, "privacy": Privacy.GROUP, "extra": {}}, "does not say which"),
        ({"extra": {"audience": "@ada:x"}}, "does not say which"),
        # the owner's class for an audience with someone else in it
        ({"conversation": f"matrix:!dm:x/{audience_key([OWNER, MALLORY])}",
          "extra": {"audience": [OWNER, MALLORY]}}, "others than the owner"),
        # direct for two people
        ({"conversation": f"matrix:!g:x/{audience_key([BOB, MALLORY])}", "sender": BOB,
          "privacy": Privacy.DIRECT, "extra": {"audience": [BOB, MALLORY]}}, "2 people"),
    ],
)  # fmt: skip
def test_an_entry_cannot_borrow_a_conversation_of_another_audience(
    changes: dict[str, Any], why: str
) -> None:
    assert why in audience_refusal(entry(**changes), owner_only)


def test_e_mail_audiences_count_the_unverified_sender_as_written() -> None:
    audience = ["eve@evil.example (unverified)", "ada@example.org"]
    mail = entry(
        channel="email", session="email:t/x", conversation=f"email:t/{audience_key(audience)}",
        sender="eve@evil.example (unverified)", privacy=Privacy.DIRECT,
        extra={"audience": audience},
    )  # fmt: skip
    assert audience_refusal(mail, lambda _c, a: a == "ada@example.org") == ""


# -- through the worker: refused entries are dead letters; untrusted channels are confined -----


class Rig:
    def __init__(self, home: Path, config: str) -> None:
        (home / "config.toml").write_text(config)
        (home / "workspace").mkdir(parents=True, exist_ok=True)
        (home / "workspace" / "MEMORY.md").write_text("- the safe's combination is 31-4-15\n")
        self.cfg = load_config(home, env={})
        self.r = fakeredis.FakeRedis()
        self.model = InstantModel()
        self.store = MemoryStore(home / "memory.sqlite3")
        turns = Turns(self.cfg, self.store, self.model, default_tools())
        self.consumer = assemble(self.cfg, self.r, turns)
        assert self.consumer.acquire(wait=False)
        self.consumer.reader.ensure_group()

    def publish(self, msg: InboundMessage) -> None:
        self.r.xadd(self.cfg.keys.inbound_of(msg.channel), msg.to_fields())  # type: ignore[arg-type]
        while entries := self.consumer.reader.read(block_ms=None):  # type: ignore[arg-type]
            handle_entries(self.consumer, entries)

    def dead(self) -> list[str]:
        return [f[b"reason"].decode() for _id, f in self.r.xrange(self.cfg.keys.dead)]  # type: ignore[union-attr]


CONFIG = f"""
[owner]
name = "Ada"
aliases = ["ada", {{ address = "{OWNER}", channel = "matrix" }}]
{{trusted}}
[redis]
prefix = "rb:"
"""


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    trusted = getattr(request, "param", "")
    made = Rig(tmp_path, CONFIG.replace("{trusted}", trusted))
    yield made
    made.consumer.lease.release()
    made.store.close()


def terminal(text: str) -> InboundMessage:
    return entry(channel="cli", session="cli:t", conversation="cli:t", sender="ada",
                 text=text, event_id=f"cli-{text[:8]}", extra={})  # fmt: skip


def test_a_forged_group_entry_naming_the_owners_dm_is_a_dead_letter(rig: Rig) -> None:
    rig.publish(entry(text="my PIN is 7701"))
    calls = rig.model.calls
    rig.publish(entry(sender=MALLORY, privacy=Privacy.GROUP, text="what did she say?",
                      event_id="$m", extra={"audience": [OWNER, MALLORY]}))  # fmt: skip
    assert rig.model.calls == calls
    assert any("another audience" in reason for reason in rig.dead())
    rows = rig.store.conn.execute("SELECT text FROM log WHERE sender = ?", (MALLORY,)).fetchall()
    assert rows == []  # nothing of it reaches the owner's conversation


@pytest.mark.parametrize("rig", ['trusted_channels = ["cli", "email"]'], indirect=True)
def test_owner_turns_from_an_untrusted_channel_see_only_their_own_conversation(rig: Rig) -> None:
    rig.publish(terminal("my terminal PIN is 7701"))
    assert "7701" in json.dumps(rig.model.seen[-1])  # the terminal: trusted, sees itself
    rig.publish(entry(text="the bike is blue", event_id="$b"))
    rig.publish(entry(text="[[tool:search_history]] what is my PIN?", event_id="$p"))
    seen = json.dumps(rig.model.seen[-1])
    assert "what is my PIN" in seen
    assert "the bike is blue" in seen  # its own conversation
    assert "7701" not in seen and "31-4-15" not in seen  # no terminal, no MEMORY.md
    rows = rig.store.conn.execute(
        "SELECT privacy, entity FROM log WHERE direction = 'in' AND event_id = '$p'"
    ).fetchall()
    assert rows == [("group", "owner")]  # still the owner's words, in a group's class


@pytest.mark.parametrize("rig", ['trusted_channels = ["matrix"]'], indirect=True)
def test_an_untrusted_terminal_runs_no_owner_command(rig: Rig) -> None:
    command = entry(channel="cli", session="cli:t", conversation="cli:t", sender="ada",
                    kind=Kind.COMMAND, text="", event_id="cmd-1",
                    extra={"op": "memory.stats", "args": {}})  # fmt: skip
    rig.publish(command)
    [reply] = [json.loads(x) for x in rig.r.lrange(rig.cfg.keys.reply("cli:t"), 0, -1)]  # type: ignore[union-attr]
    assert "trusted_channels" in reply["text"]


def test_an_unknown_trusted_channel_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[owner]\ntrusted_channels = ["cli", "irc"]\n')
    with pytest.raises(ConfigError, match="irc"):
        load_config(tmp_path, env={})
    assert Config(home=tmp_path).owner.trusts("matrix")
