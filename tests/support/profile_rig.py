"""Layer 2 end to end (issue 28), the rig: a real Redis, the real ``relaybot worker`` and
``relaybot jobs`` processes, our model server answering the profile job's four questions with a
scripted model (:class:`Scribe`) that reads what each prompt shows.

The messages carry what the scripted model is to find in them:

- ``%KIND:TEXT%`` (``%preference:Ada drinks green tea%``): the PROFILE answer has the fact TEXT of
  that KIND about the message's sender, resting on that message (the same TEXT on several
  messages of a range: one fact resting on all of them, as the job merges them);
- ``%gap:NEEDS%``: the GAPS answer has a gap of the sender, described by the message's text
  without its markers, needing NEEDS, resting on that message and the assistant's answer after
  it, ``same_as`` the known gap of that person with the same need;
- ``%slow%``: the PROFILE answer waits :attr:`Scribe.slow` seconds first.

Which new fact is the same insight as a known one, contradicts one, and which known facts are no
longer relevant, the test says in :attr:`Scribe.same`, :attr:`Scribe.contradicts` (new text ->
known text) and :attr:`Scribe.stale` (known text -> why). Every prompt is kept
(:attr:`Scribe.asked`), with the log ids it showed.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from gateways.cli.gateway import normalize
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import Procs, memory_rows, relaybot_env, wait_until, write_config

CONFIG = """
[owner]
name = "Ada"

[derive]
judge_after = 0.3
quiet = 0
check_every = 0.2
min_rows = 2

[profiles]
check_every = 0.2
"""

LINE = re.compile(r"^\[log (\d+)\] (.+?) \((E\d+)\): (.*)$")
ASSISTANT = re.compile(r"^\[log (\d+)\] .+? \(assistant\): ")
MARK = re.compile(r"%(\w+)(?::([^%]*))?%")
KNOWN_FACT = re.compile(r"^F(\d+) \[(E\d+) [^·]*· (\w+)\] (.*)$")
NEW_FACT = re.compile(r"^N(\d+) \[(E\d+) [^·]*· (\w+)\] (.*)$")
EARLIER = re.compile(r"^F(\d+) \[[^\]]*\] (.*)$")
KNOWN_GAP = re.compile(r"^G(\d+) \[(E\d+|\?) · (\w+)(?: · needs (\w+))?\] (.*)$")

SECTION = "## What is known about the people here"
PROFILE, SAME, RELEVANT, GAPS = (
    "TASK: profile facts", "TASK: same insight", "TASK: still relevant", "TASK: capability gaps",
)  # fmt: skip


def section(prompt: str, title: str) -> list[str]:
    """The lines of the prompt's part under ``title`` (up to the next empty line)."""
    _, _, rest = prompt.partition(f"\n{title}\n")
    return rest.split("\n\n", 1)[0].splitlines()


def said(prompt: str) -> list[tuple[int, str, str]]:
    """The transcript's lines of known senders: (log id, label, text)."""
    out = []
    for line in section(prompt, "Messages:"):
        m = LINE.match(line)
        if m is not None:
            out.append((int(m[1]), m[3], m[4]))
    return out


def clean(text: str) -> str:
    return " ".join(MARK.sub(" ", text).split())


@dataclass
class Scribe:
    """The scripted model of the profile job's questions (see the module docstring)."""

    same: dict[str, str] = field(default_factory=dict)
    contradicts: dict[str, str] = field(default_factory=dict)
    stale: dict[str, str] = field(default_factory=dict)
    slow: float = 0.0
    asked: list[tuple[str, str]] = field(default_factory=list)  # (task, prompt)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, model: FakeModelServer) -> None:
        model.tasks.update({PROFILE: self.profile, SAME: self.decide, RELEVANT: self.relevant,
                            GAPS: self.gaps})  # fmt: skip

    def _seen(self, task: str, prompt: str) -> None:
        with self._lock:
            self.asked.append((task, prompt))

    def prompts(self, task: str) -> list[str]:
        with self._lock:
            return [p for t, p in self.asked if t == task]

    def profile(self, prompt: str) -> str:
        self._seen(PROFILE, prompt)
        if "%slow%" in prompt and self.slow:
            time.sleep(self.slow)
        facts = []
        for log_id, label, text in said(prompt):
            for kind, what in MARK.findall(text):
                if kind in ("gap", "slow"):
                    continue
                facts.append({"entity": label, "kind": kind, "text": what, "confidence": 0.8,
                              "evidence": [log_id]})  # fmt: skip
        return json.dumps({"facts": facts})

    def decide(self, prompt: str) -> str:
        self._seen(SAME, prompt)
        known = {m[4]: int(m[1]) for line in section(prompt, "Known facts:")
                 if (m := KNOWN_FACT.match(line))}  # fmt: skip
        out = []
        for line in section(prompt, "New facts:"):
            m = NEW_FACT.match(line)
            if m is None:
                continue
            text = m[4]
            same = known.get(self.same.get(text, ""))
            against = known.get(self.contradicts.get(text, ""))
            out.append({"new": int(m[1]), "same_as": same, "contradicts": against})
        return json.dumps({"decisions": out})

    def relevant(self, prompt: str) -> str:
        self._seen(RELEVANT, prompt)
        out = []
        for line in section(prompt, "Earlier facts:"):
            m = EARLIER.match(line)
            if m is not None and m[2] in self.stale:
                out.append({"id": int(m[1]), "why": self.stale[m[2]]})
        return json.dumps({"stale": out})

    def gaps(self, prompt: str) -> str:
        self._seen(GAPS, prompt)
        known = [KNOWN_GAP.match(line) for line in section(prompt, "Known gaps:")]
        lines = section(prompt, "Messages:")
        out = []
        for n, line in enumerate(lines):
            m = LINE.match(line)
            marks = dict(MARK.findall(m[4])) if m is not None else {}
            if m is None or "gap" not in marks:
                continue
            evidence = [int(m[1])]
            after = next((a for a in lines[n + 1 :] if ASSISTANT.match(a)), None)
            if after is not None and (found := ASSISTANT.match(after)) is not None:
                evidence.append(int(found[1]))
            same = next((int(g[1]) for g in known if g and g[2] == m[3] and g[4] == marks["gap"]),
                        None)  # fmt: skip
            out.append({"entity": m[3], "description": clean(m[4]), "needs": marks["gap"],
                        "evidence": evidence, "same_as": same})  # fmt: skip
        return json.dumps({"gaps": out})


@dataclass
class Rig:
    """A real Redis (a prefix of the test's own), our model server, the test's processes."""

    home: Path
    redis_url: str
    keys: Keys
    model: FakeModelServer
    procs: Procs
    r: redis.Redis
    scribe: Scribe

    def env(self, more: str = "") -> dict[str, str]:
        write_config(self.home, CONFIG + more)
        return relaybot_env(self.home, redis_url=self.redis_url, prefix=self.keys.prefix,
                            model_url=self.model.base_url,
                            RELAYBOT_TURNS_MODE="followup")  # fmt: skip

    @property
    def db(self) -> Path:
        return self.home / "memory.sqlite3"

    def rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return memory_rows(self.db, sql, *args)

    def say(self, conversation: str, sender: str, text: str, privacy: Privacy,
            **extra: Any) -> None:  # fmt: skip
        """A message of a contact as its gateway publishes it (the channel's inbound stream)."""
        channel = conversation.split(":", 1)[0]
        name = sender.split(":", maxsplit=1)[0].lstrip("@").title()
        msg = InboundMessage(
            channel=channel, session=conversation, conversation=conversation, sender=sender,
            sender_name=name, privacy=privacy, text=text,
            ts=time.time(), event_id=f"$e{time.monotonic_ns()}", extra=extra,
        )  # fmt: skip
        self.r.xadd(self.keys.inbound_of(channel), msg.to_fields())  # type: ignore[arg-type]

    def send(self, session: str, *texts: str) -> None:
        """The owner's terminal messages to ``cli:<session>``, in one transaction: the worker
        reads them at once, so one layer-1 range holds them all."""
        with self.r.pipeline(transaction=True) as pipe:
            for text in texts:
                msg = normalize(session, text, sender="tester")
                pipe.xadd(self.keys.inbound_of("cli"), msg.to_fields())  # type: ignore[arg-type]
            pipe.execute()

    def facts(self, *, every: bool = False) -> list[dict[str, Any]]:
        """The facts (current ones, or ``every`` one), each with its evidence ids."""
        where = "1" if every else "superseded_by IS NULL AND retired IS NULL AND erased IS NULL"
        found = self.rows(f"SELECT * FROM profile_facts WHERE {where} ORDER BY id")
        for f in found:
            ev = self.rows("SELECT log_id FROM profile_evidence WHERE fact = ? ORDER BY log_id",
                           f["id"])  # fmt: skip
            f["evidence"] = [e["log_id"] for e in ev]
        return found

    def fact(self, text: str, *, every: bool = False) -> dict[str, Any]:
        [found] = [f for f in self.facts(every=every) if f["text"] == text]
        return found

    def fact_of(self, fact_id: int) -> dict[str, Any]:
        return next(f for f in self.facts(every=True) if f["id"] == fact_id)

    def gap_of(self, gap_id: int) -> dict[str, Any]:
        return next(g for g in self.gaps() if g["id"] == gap_id)

    def runs(self) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM profile_runs ORDER BY id")

    def gaps(self) -> list[dict[str, Any]]:
        found = self.rows("SELECT * FROM capability_gaps ORDER BY id")
        for g in found:
            ev = self.rows("SELECT log_id FROM gap_evidence WHERE gap = ? ORDER BY log_id",
                           g["id"])  # fmt: skip
            g["evidence"] = [e["log_id"] for e in ev]
        return found

    def log_ids(self, conversation: str) -> list[int]:
        rows = self.rows("SELECT id FROM log WHERE conversation = ? ORDER BY id", conversation)
        return [r["id"] for r in rows]

    def settled(self, conversation: str, rows: int) -> bool:
        """The conversation holds ``rows`` log rows, every message to the assistant covered by
        a current summary (an answer may be left for the next range), and every current summary
        has its profile run."""
        if not self.db.exists() or len(self.log_ids(conversation)) < rows:
            return False
        current = self.rows(
            "SELECT s.id, s.first_id, s.last_id, (SELECT count(*) FROM profile_runs AS r "
            "WHERE r.summary = s.id) AS runs FROM summary AS s WHERE s.conversation = ? AND "
            "s.erased IS NULL AND NOT EXISTS (SELECT 1 FROM summary AS n WHERE n.supersedes = "
            "s.id)",
            conversation,
        )
        covered = {i for s in current for i in range(s["first_id"], s["last_id"] + 1)}
        live = self.rows(
            "SELECT id FROM log WHERE conversation = ? AND direction = 'in' AND extra NOT LIKE "
            "'{\"erased\":%'", conversation,
        )  # fmt: skip
        return all(r["id"] in covered for r in live) and all(s["runs"] for s in current)

    def wait_settled(self, conversation: str, rows: int, *, timeout: float = 30) -> None:
        wait_until(lambda: self.settled(conversation, rows), timeout=timeout,
                   message=lambda: f"{conversation}: {rows} rows summarised and derived; "
                   f"runs {self.runs()}\n{self.logs()}")  # fmt: skip

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.log_text()[-2500:]}" for p in self.procs.started)


def last_user(body: dict[str, Any]) -> str:
    said = [m for m in body["messages"] if m.get("role") == "user"]
    return str(said[-1].get("content", "")) if said else ""


def turn_sent(rig: Rig, marker: str) -> str:
    """Everything the model was sent in the turn whose message holds ``marker`` (each of its
    requests: the context, then with the tool results)."""
    found = [json.dumps(b, ensure_ascii=False) for b in list(rig.model.requests)
             if marker in last_user(b) and not last_user(b).startswith("TASK:")]  # fmt: skip
    assert found, f"no turn with {marker!r}"
    return "\n".join(found)


def profile_section(rig: Rig, marker: str) -> str:
    """The profile section of the context of the turn whose message holds ``marker``."""
    for body in list(rig.model.requests):
        system = str(body["messages"][0].get("content", ""))
        if (
            marker in str(body["messages"][-1].get("content", ""))
            and body["messages"][0]["role"] == "system"
        ):
            if SECTION not in system:
                return ""
            return system.split(SECTION, 1)[1].split("\n\n", 1)[0]
    raise AssertionError(f"no turn with {marker!r}")


def todo(rig: Rig) -> str:
    path = rig.home / "TODO.md"
    return path.read_text(encoding="utf-8") if path.exists() else ""
