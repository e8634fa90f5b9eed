"""MCP tools in the running worker's rig (worker/main.py ``assemble``: the real writer, its pool of
turn threads, fakeredis, the real memory store): a call never runs on the writer, a hanging
tool holds only its own turn while other sessions are answered, the heartbeat carries the hub's
state, and a reloaded ``[mcp]`` reaches the hub and the next call of a turn already running."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract.config import Config, ModelConfig, RedisConfig, load_config
from contract.config_watch import WORKER_RELOADS, WORKER_USES, ConfigWatcher
from contract.messages import InboundMessage, Privacy, Reply
from memory.store import MemoryStore
from tests.unit.test_mcp_tools import FakeHub, servers
from worker.main import TurnTools, assemble, tool_names
from worker.mcp_tools import McpOffers
from worker.model import Completion, ToolCall
from worker.turn import Turns


class Model:
    """Calls ``pub_echo`` once in a turn whose message says ``call``, then answers."""

    name = "m"

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        last = messages[-1]
        if last["role"] == "tool":
            return Completion(content=f"got: {last['content']}", finish_reason="stop")
        if "call" in str(last["content"]):
            call = ToolCall(id="c1", name="pub_echo", arguments={"text": str(last["content"])})
            return Completion(content="", tool_calls=[call], finish_reason="tool_calls")
        return Completion(content="plain answer", finish_reason="stop")

    def close(self) -> None:
        pass


class Rig:
    def __init__(self, tmp_path: Path, cfg: Config | None = None, **kw: Any) -> None:
        self.cfg = cfg or Config(home=tmp_path, redis=RedisConfig(prefix="rb:"),
                                 model=ModelConfig(concurrency=4))  # fmt: skip
        self.r = fakeredis.FakeRedis()
        self.keys = self.cfg.keys
        self.store = MemoryStore(tmp_path / "memory.sqlite3")
        self.hub = FakeHub(servers())
        self.gate = threading.Event()
        self.writer_thread = threading.get_ident()  # the test's thread drives the writer

        def answer(server: str, tool: str, arguments: dict[str, Any]) -> str:
            if "hang" in str(arguments.get("text")):
                assert self.gate.wait(10), "the test never let the hanging call go"
            return f"echo {arguments.get('text')}"

        self.hub.answer = answer
        turns = Turns(self.cfg, self.store, Model(), TurnTools())
        turns.mcp = McpOffers(self.hub, tool_names(turns))
        self.c = assemble(self.cfg, self.r, turns, hub=self.hub, **kw)
        assert self.c.acquire(wait=False)
        self.c.reader.ensure_group()
        self.c.reader.recover()
        self.c.writer.pool.start()

    def add(self, text: str, session: str, privacy: Privacy = Privacy.OWNER) -> str:
        m = InboundMessage(channel="cli", session=session, conversation=session, sender="ada",
                           privacy=privacy, text=text, ts=1.0, event_id=f"ev-{text}")  # fmt: skip
        raw = self.r.xadd(self.keys.inbound_of("cli"), m.to_fields()).decode()  # type: ignore[union-attr]
        return f"cli/{raw}"

    def step(self) -> None:
        self.c.writer.take(self.c.reader.read(block_ms=0))
        self.c.writer.advance()

    def until(self, cond: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 5
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.c.writer.pool.wait(0.02)
            self.step()

    def replies(self, session: str) -> list[Reply]:
        return [Reply.from_json(x) for x in self.r.lrange(self.keys.reply(session), 0, -1)]

    def close(self) -> None:
        self.gate.set()
        self.c.writer.pool.close()
        self.c.lease.release()
        self.store.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    made.close()


def test_a_hanging_tool_holds_only_its_own_turn_never_the_writer(rig: Rig) -> None:
    slow = rig.add("call hang", "cli:a")
    rig.until(lambda: len(rig.hub.heard) == 1, "the hanging call")
    rig.add("hello", "cli:b")
    rig.until(lambda: bool(rig.replies("cli:b")), "the other session's reply")
    rig.add("call quick", "cli:c")  # another MCP call while the first still hangs
    rig.until(lambda: bool(rig.replies("cli:c")), "the quick call's reply")
    assert rig.replies("cli:a") == []
    rig.gate.set()
    rig.until(lambda: bool(rig.replies("cli:a")), "the hanging turn's reply")
    text = rig.replies("cli:a")[0].text
    assert text.startswith("got: output of pub_echo") and text.endswith("call hang")
    assert rig.writer_thread not in rig.hub.threads  # no call ever ran on the writer
    names = {t.ident: t.name for t in threading.enumerate()}
    assert all(names.get(t, "").startswith("turn-") for t in rig.hub.threads)
    rows = rig.store.conn.execute(
        "SELECT stream_id FROM log WHERE kind = 'tool' ORDER BY id"
    ).fetchall()
    assert f"{slow}/tool/1" in [r[0] for r in rows] and len(rows) == 2
    assert rig.c.writer.in_hand() == 0


def test_the_hubs_state_goes_beside_the_heartbeat_never_into_it(rig: Rig) -> None:
    """The MCP facts name the owner's tools: they go to ``Keys.mcp`` (the worker's and the
    owner's terminal's: deploy/redis/users.acl), not into the heartbeats hash, which every
    gateway reads and writes; they go with the worker when it stops."""
    rig.c.health.beat()
    hb = rig.c.health.heartbeat
    facts = {"files": {"state": "up"}, "pub": {"state": "up"}}
    assert "mcp" not in hb.info and hb.private == {"mcp": facts}
    hb.start()
    deadline = time.monotonic() + 5
    while rig.r.get(rig.keys.mcp) is None or rig.r.hget(rig.keys.heartbeats, "worker") is None:
        assert time.monotonic() < deadline, "the heartbeat never beat"
        time.sleep(0.01)
    hb.stop()
    assert "mcp" not in json.loads(rig.r.hget(rig.keys.heartbeats, "worker") or "{}")
    assert rig.r.get(rig.keys.mcp) is None  # gone with the worker


def test_the_hubs_facts_expire_with_the_beats(rig: Rig) -> None:
    rig.c.health.beat()
    hb = rig.c.health.heartbeat.start()
    deadline = time.monotonic() + 5
    while rig.r.get(rig.keys.mcp) is None:
        assert time.monotonic() < deadline, "the heartbeat never beat"
        time.sleep(0.01)
    assert json.loads(rig.r.get(rig.keys.mcp) or "{}")["mcp"]["pub"] == {"state": "up"}
    assert 0 < rig.r.ttl(rig.keys.mcp) <= 30  # a worker killed -9 leaves no facts forever
    hb.stop(remove=False)


def write(home: Path, text: str) -> None:
    path = home / "config.toml"
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(before + 10**9, before + 10**9))


MCP = """[redis]
prefix = "rb:"

[mcp.servers.pub]
url = "http://127.0.0.1:9/mcp"
audiences = [{audiences}]
"""


def test_a_reloaded_mcp_section_reaches_the_hub_and_nothing_else_does(tmp_path: Path) -> None:
    write(tmp_path, MCP.format(audiences='"owner", "group"'))
    cfg = load_config(tmp_path, env={})
    now = [0.0]
    watch = ConfigWatcher(cfg, process="worker", uses=WORKER_USES, reloadable=WORKER_RELOADS,
                          env={}, every=1.0, clock=lambda: now[0])  # fmt: skip
    rig = Rig(tmp_path, cfg, watch=watch)
    try:

        def tick() -> None:
            for _ in range(2):
                now[0] += 5
                rig.c.reloader.maybe_reload()

        tick()
        assert rig.hub.configured == []  # nothing changed
        write(tmp_path, MCP.format(audiences='"owner"'))
        tick()
        [servers_now] = rig.hub.configured
        assert servers_now["pub"].audiences == [Privacy.OWNER]
        assert "mcp.servers" not in watch.fields().get("restart_keys", [])
        # the hub's snapshot now says owner only: a group turn's next call is refused
        group = rig.c.turns.mcp.for_turn(Privacy.GROUP)  # type: ignore[union-attr]
        assert "pub_echo" not in group
        # a result's budget applies from the next call on, no restart
        assert rig.c.turns.mcp.budget == 12_000  # type: ignore[union-attr]
        budgeted = "[mcp]\nresult_chars = 900\n\n[mcp.servers.pub]"
        write(tmp_path, MCP.format(audiences='"owner"').replace("[mcp.servers.pub]", budgeted))
        tick()
        assert rig.c.turns.mcp.budget == 900  # type: ignore[union-attr]
        assert len(rig.hub.configured) == 2  # [mcp] changed: the hub was told (no server did)
    finally:
        rig.close()
