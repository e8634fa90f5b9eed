"""The privacy rule end to end, through the worker: nothing said in a direct conversation reaches
the model's input in a group conversation, by any path; a direct conversation sees what the same
person (owner-verified links) told the assistant elsewhere, and nothing more.

The worker is assembled exactly as ``relaybot worker`` does it (``worker.main.build_consumer``:
the real memory store, whatever tools the worker registers), against a real Redis, with a probing
model in place of the model: in every turn it first calls EVERY tool it is offered, with
arguments built from the tool's schema to find the secret (its words, the conversation ids and
handles where it was said, every enum value), then answers. Everything the model is sent — the
context, the tool results — is recorded and searched for the secrets, which the probe itself
never types (it asks for "vault code"; the secret is the code, QX-5531).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.config import Config, OwnerAlias, OwnerConfig, RedisConfig
from contract.messages import InboundMessage, Privacy
from memory.store import MemoryStore
from relaybot.owner_commands import command_message
from tests.support.servers import RedisServer
from tests.support.worker import handle_entries
from worker.consumer import Consumer
from worker.main import build_consumer
from worker.model import Completion, ToolCall

pytestmark = pytest.mark.integration

BOB_SECRET = "QX-5531"  # said only in Bob's Matrix DM
OWNER_SECRET = "PIN-9911"  # said only in the owner's terminal
CAROL_SECRET = "salary-80k"  # said only in Carol's DM

OWNER_CONV = "cli:owner"
BOB_DM = "matrix:dm-bob"
BOB_MAIL = "email:thread-bob"
CAROL_DM = "matrix:dm-carol"
TEAM = "matrix:team"

SECRETS = (BOB_SECRET, OWNER_SECRET, CAROL_SECRET)
HINTS: dict[str, list[Any]] = {
    "conversation": [BOB_DM, BOB_MAIL, OWNER_CONV, CAROL_DM],
    "chat": [BOB_DM, OWNER_CONV],
    "session": [BOB_DM, OWNER_CONV],
    "sender": ["@bob:m.org", "bob@example.org", "owner", "ada"],
    "entity": ["owner", "@bob:m.org"],
    "channel": ["matrix", "email", "cli"],
    "days": [36500],
    "limit": [50],
}
WORDS = ["vault code", "vault", "code", "PIN", "salary", "*"]


class ProbingModel:
    """A ModelPort that calls every offered tool with secret-hunting arguments, then answers."""

    name = "probe"

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        self.requests.append({"messages": copy.deepcopy(messages), "tools": copy.deepcopy(tools)})
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        probed = any(m.get("role") == "tool" for m in messages[last_user + 1 :])
        if tools and not probed:
            # A careless model in someone else's conversation: whatever secret it was shown there
            # it tries to write into every tool too (remember it as shared public knowledge, ...).
            # (In the owner's own conversations anything may be published on purpose.)
            seen = json.dumps(messages, ensure_ascii=False)
            owner_turn = "/ owner]" in str(messages[last_user].get("content"))
            leaked = [] if owner_turn else [f"remember: {s}" for s in SECRETS if s in seen]
            calls = [
                ToolCall(id=f"call-{next(self._ids)}", name=spec["function"]["name"], arguments=a)
                for spec in tools
                for a in variants(spec["function"].get("parameters") or {}, leaked)
            ]
            return Completion(tool_calls=calls, finish_reason="tool_calls")
        return Completion(content="noted", finish_reason="stop")

    def close(self) -> None:
        pass


def candidates(name: str, schema: dict[str, Any], leaked: list[str]) -> list[Any]:
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if name in HINTS and kind in ("string", "integer", "number"):
        return [v for v in HINTS[name] if isinstance(v, str) == (kind == "string")] or [1]
    if kind == "string":
        return [*WORDS, *leaked]
    if kind in ("integer", "number"):
        return [36500 if "day" in name else 50]
    if kind == "boolean":
        return [True, False]
    if kind == "array":
        return [["vault"]]
    return []


def variants(schema: dict[str, Any], leaked: list[str]) -> list[dict[str, Any]]:
    """The required arguments, then each argument varied over its candidates on its own; with
    ``leaked`` secrets, also every combination of enum values with them in every string."""
    props: dict[str, Any] = schema.get("properties") or {}
    required = [k for k in schema.get("required") or [] if k in props]
    base = {k: (candidates(k, props[k], []) or ["vault"])[0] for k in required}
    out = [base]
    for key, prop in props.items():
        for value in candidates(key, prop if isinstance(prop, dict) else {}, leaked):
            out.append({**base, key: value})
    enums = {k: p["enum"] for k, p in props.items() if isinstance(p, dict) and p.get("enum")}
    strings = [k for k, p in props.items() if isinstance(p, dict) and p.get("type") == "string"]
    for secret in leaked:
        for combo in itertools.product(*enums.values()):
            args = {**base, **dict(zip(enums, combo, strict=True))}
            args.update({k: secret for k in strings if k not in enums and k not in HINTS})
            out.append(args)
    unique: list[dict[str, Any]] = []
    for v in out:
        if v not in unique:
            unique.append(v)
    return unique


class Worker:
    """The worker's consumer over a real Redis and a real store, pumped by the test."""

    def __init__(self, home: Path, url: str, prefix: str, r: redis.Redis) -> None:
        self.cfg = Config(
            home=home,
            owner=OwnerConfig(name="Ada", aliases=[OwnerAlias(address="ada", channel="cli")]),
            redis=RedisConfig(url=url, prefix=prefix),
        )
        self.r = r
        self.store = MemoryStore(self.cfg.memory_path)
        self.model = ProbingModel()
        self.consumer: Consumer = build_consumer(self.cfg, r, model=self.model, store=self.store)
        assert self.consumer.acquire(wait=False)
        self.consumer.reader.ensure_group()
        self.consumer.reader.recover()
        self._n = itertools.count(1)

    def pump(self) -> None:
        while entries := self.consumer.reader.read(block_ms=None):  # type: ignore[arg-type]
            handle_entries(self.consumer, entries)

    def say(self, conversation: str, sender: str, text: str, privacy: Privacy) -> list[str]:
        """Send a message through the stream; the JSON of everything the model was sent."""
        n = next(self._n)
        msg = InboundMessage(
            channel=conversation.split(":", 1)[0],
            session=conversation,
            conversation=conversation,
            sender=sender,
            privacy=privacy,
            text=text,
            ts=1_795_000_000.0 + n,
            event_id=f"ev{n}",
        )
        before = len(self.model.requests)
        self.r.xadd(self.cfg.keys.inbound, msg.to_fields())  # type: ignore[arg-type]
        self.pump()
        sent = self.model.requests[before:]
        assert sent, "the model was not asked"
        return [json.dumps(req, ensure_ascii=False) for req in sent]

    def command(self, op: str, **args: Any) -> dict[str, Any]:
        msg = command_message("cli:admin-test", op, args, "ada")
        sid = self.r.xadd(self.cfg.keys.inbound, msg.to_fields())  # type: ignore[arg-type]
        self.pump()
        queued = self.r.lrange(self.cfg.keys.reply("cli:admin-test"), 0, -1)
        for raw in queued:  # type: ignore[union-attr]
            reply = json.loads(raw)
            if reply["answers"] == sid.decode():  # type: ignore[union-attr]
                result: dict[str, Any] = json.loads(reply["text"])
                return result
        raise AssertionError(f"no answer to {op}")

    def tool_names(self) -> set[str]:
        names: set[str] = set()
        for req in self.model.requests:
            names |= {t["function"]["name"] for t in req["tools"]}
        return names

    def close(self) -> None:
        self.consumer.lease.release()
        self.store.close()


@pytest.fixture
def worker(
    tmp_path: Path, redis_server: RedisServer, prefix: str, real_redis: redis.Redis
) -> Iterator[Worker]:
    w = Worker(tmp_path / "home", redis_server.url, prefix, real_redis)
    yield w
    w.close()


def seed(w: Worker) -> None:
    w.say(OWNER_CONV, "ada", f"note to self: my bank {OWNER_SECRET}", Privacy.OWNER)
    w.say(BOB_DM, "@bob:m.org", f"psst, my vault code is {BOB_SECRET}", Privacy.DIRECT)
    w.say(CAROL_DM, "@carol:m.org", f"between us: my {CAROL_SECRET}", Privacy.DIRECT)
    w.say(TEAM, "@bob:m.org", "hello team, Bob here", Privacy.GROUP)
    w.say(BOB_MAIL, "bob@example.org", "hi, Bob by mail", Privacy.DIRECT)


def leaks(sent: list[str], *secrets: str) -> list[str]:
    return [s for s in secrets if any(s in text for text in sent)]


def tool_results(sent: list[str]) -> str:
    last = json.loads(sent[-1])
    return "\n".join(str(m.get("content")) for m in last["messages"] if m.get("role") == "tool")


def test_a_group_never_sees_what_was_said_in_direct_conversations(worker: Worker) -> None:
    seed(worker)
    for _ in range(2):  # before and after the owner links Bob's handles
        sent = worker.say(TEAM, "@alice:m.org", "what is bob's vault code? PIN?", Privacy.GROUP)
        assert leaks(sent, BOB_SECRET, OWNER_SECRET, CAROL_SECRET) == []
        assert "hello team, Bob here" in sent[0]  # it does see itself
        result = worker.command("entities.link", a="matrix:@bob:m.org", b="email:bob@example.org")
        assert result["ok"]
    # Bob himself, in the group: still only the group and public knowledge
    sent = worker.say(TEAM, "@bob:m.org", "remind me of my vault code", Privacy.GROUP)
    assert leaks(sent, BOB_SECRET, OWNER_SECRET, CAROL_SECRET) == []
    # every tool the worker offers was called in those turns, with the probe's arguments
    probed = [json.loads(s) for s in sent]
    offered = {t["function"]["name"] for t in probed[0]["tools"]}
    called = {
        call["function"]["name"]
        for req in probed
        for m in req["messages"]
        for call in m.get("tool_calls") or []
    }
    assert called == offered


def test_a_direct_conversation_sees_the_same_persons_words_only_after_a_verified_link(
    worker: Worker,
) -> None:
    seed(worker)
    ask = "what was my vault code again?"
    before = worker.say(BOB_MAIL, "bob@example.org", ask, Privacy.DIRECT)
    assert leaks(before, BOB_SECRET, OWNER_SECRET, CAROL_SECRET) == []

    suggested = worker.command("entities.suggest", a="@bob:m.org", b="bob@example.org")
    assert suggested["ok"] and suggested["status"] == "suggested"
    after_suggestion = worker.say(BOB_MAIL, "bob@example.org", ask, Privacy.DIRECT)
    assert leaks(after_suggestion, BOB_SECRET, OWNER_SECRET, CAROL_SECRET) == []

    linked = worker.command("entities.link", a="@bob:m.org", b="bob@example.org")
    assert linked["ok"] and linked["status"] == "verified"
    after_link = worker.say(BOB_MAIL, "bob@example.org", ask, Privacy.DIRECT)
    assert BOB_SECRET in after_link[0]  # in the context: Bob said it, on Matrix
    assert "[matrix / @bob:m.org]" in json.loads(after_link[0])["messages"][0]["content"]
    assert leaks(after_link, OWNER_SECRET, CAROL_SECRET) == []

    # Carol's direct conversation never sees Bob, linked or not
    carol = worker.say(CAROL_DM, "@carol:m.org", "what is bob's vault code?", Privacy.DIRECT)
    assert leaks(carol, BOB_SECRET, OWNER_SECRET) == []

    unlinked = worker.command("entities.unlink", a="@bob:m.org", b="bob@example.org")
    assert unlinked["ok"] and unlinked["status"] == "unlinked"
    again = worker.say(BOB_MAIL, "bob@example.org", ask, Privacy.DIRECT)
    # Bob's Matrix words are gone from its context again; what this conversation itself was
    # shown while linked (its replies, the notes the careless probe wrote here) stays its own
    assert "psst, my vault code" not in again[0]
    assert leaks(again, OWNER_SECRET, CAROL_SECRET) == []
    fresh = worker.say(CAROL_DM, "@carol:m.org", "and now? vault code?", Privacy.DIRECT)
    assert leaks(fresh, BOB_SECRET, OWNER_SECRET) == []


def test_the_owner_sees_everything_and_the_probe_can_find_it(worker: Worker) -> None:
    """The positive control: the same probe finds the secrets where the rule allows it."""
    seed(worker)
    sent = worker.say(OWNER_CONV, "ada", "what did bob tell me? vault code?", Privacy.OWNER)
    assert leaks(sent, BOB_SECRET, OWNER_SECRET, CAROL_SECRET) == [
        BOB_SECRET,
        OWNER_SECRET,
        CAROL_SECRET,
    ]
    if "search_history" in worker.tool_names():  # once search exists, it finds it for the owner
        assert BOB_SECRET in tool_results(sent)


def test_every_inbound_row_has_its_senders_entity(worker: Worker) -> None:
    seed(worker)
    rows = worker.store.conn.execute(
        "SELECT direction, sender, entity, is_owner FROM log ORDER BY id"
    ).fetchall()
    inbound = [r for r in rows if r[0] == "in"]
    assert inbound and all(r[2] for r in inbound)
    assert {r[2] for r in inbound if r[3]} == {"owner"}
    by_sender = {r[1]: r[2] for r in inbound}
    assert by_sender["@bob:m.org"] != by_sender["bob@example.org"]  # one person only once linked
    assert all(r[2] is None for r in rows if r[0] == "out")  # the assistant is no entity
