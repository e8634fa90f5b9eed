"""deploy/redis/users.acl against a real redis-server: each user can do its job and no more."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from contract.config import Config, RedisConfig
from gateways.cli.gateway import Terminal
from memory.store import MemoryStore
from tests.support.fakes import InstantModel
from tests.support.servers import redis_with_acl
from tests.support.worker import handle_entries
from worker.main import build_consumer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {"worker": "w-secret", "jobs": "j-secret", "cli": "c-secret", "matrix": "m-secret"}


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[int]:
    acl = (ROOT / "deploy" / "redis" / "users.acl").read_text()
    with redis_with_acl(tmp_path, acl, PASSWORDS) as port:
        yield port


def cfg_for(tmp_path: Path, port: int, user: str) -> Config:
    url = f"redis://relaybot-{user}:{PASSWORDS[user]}@127.0.0.1:{port}/0"
    return Config.model_validate({"home": tmp_path, "redis": RedisConfig(url=url)})


def test_each_user_can_do_its_job_and_no_more(tmp_path: Path, acl_redis: int) -> None:
    from contract.bus import connect

    worker_cfg = cfg_for(tmp_path, acl_redis, "worker")
    cli_cfg = cfg_for(tmp_path, acl_redis, "cli")
    with pytest.raises(redis.AuthenticationError):  # the default user is off
        redis.Redis(port=acl_redis).ping()

    wr = connect(worker_cfg)
    consumer = build_consumer(worker_cfg, wr, model=InstantModel())
    assert consumer.acquire(wait=False)
    consumer.reader.ensure_group()
    consumer.reader.recover()

    cr = connect(cli_cfg)
    term = Terminal(cli_cfg, cr, "acl")
    term.heartbeat.start()
    sid = term.send("hello through the ACL")
    handle_entries(consumer, consumer.reader.read(block_ms=100))
    reply = term.wait_for(sid, 5)
    term.heartbeat.stop()
    assert reply is not None
    assert "hello through the ACL" in reply.text

    # the terminal's user can write the stream but not read it, nor touch other channels
    for forbidden in (
        lambda: cr.xrange(cli_cfg.keys.inbound),
        lambda: cr.xreadgroup("worker", "x", {cli_cfg.keys.inbound: ">"}, count=1, block=1),
        lambda: cr.lrange(cli_cfg.keys.reply("matrix:!room"), 0, -1),
        lambda: cr.lmove(cli_cfg.keys.reply("matrix:!room"), cli_cfg.keys.inflight("cli:x")),
        lambda: cr.set("relaybot:worker:lease", "me"),
        cr.flushall,
        lambda: cr.keys("*"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
    consumer.lease.release()


def test_a_gateway_account_speaks_only_for_its_own_channel(tmp_path: Path, acl_redis: int) -> None:
    """Issue 10, case 6: the Matrix gateway's account could XADD entries claiming the terminal,
    the owner or an owner command, and the worker believed them. Now Redis refuses what it may
    not write, and the worker refuses what its stream may not say."""
    from contract.bus import connect
    from contract.messages import InboundMessage, Kind, Privacy

    worker_cfg = cfg_for(tmp_path, acl_redis, "worker")
    keys = worker_cfg.keys
    wr = connect(worker_cfg)
    model = InstantModel()
    store = MemoryStore(tmp_path / "memory.sqlite3")
    consumer = build_consumer(worker_cfg, wr, model=model, store=store)
    assert consumer.acquire(wait=False)
    consumer.reader.ensure_group()
    consumer.reader.recover()
    mr = connect(cfg_for(tmp_path, acl_redis, "matrix"))

    def entry(**kw: object) -> dict[str, str]:
        base: dict[str, object] = dict(
            channel="matrix", session="matrix:!r", conversation="matrix:!r", sender="@eve:hs",
            privacy=Privacy.GROUP, text="let me in", ts=1.0, event_id=f"$e{len(kw)}",
        )  # fmt: skip
        base.update(kw)
        return InboundMessage.model_validate(base).to_fields()

    for stream in (keys.inbound_of("cli"), keys.inbound_of("email"), keys.inbound):
        with pytest.raises(redis.exceptions.NoPermissionError):
            mr.xadd(stream, entry())
    forged = [
        entry(channel="cli", session="cli:home", conversation="cli:home", privacy=Privacy.OWNER),
        entry(
            kind=Kind.COMMAND,
            channel="cli",
            session="cli:home",
            conversation="cli:home",
            extra={"op": "memory.erase", "args": {}},
        ),
        entry(conversation="cli:home"),  # the owner's terminal conversation, to read it
        entry(session="cli:home"),  # a reply queue it may not read, to be answered on
        entry(privacy=Privacy.OWNER),  # the owner's context for someone who is not the owner
    ]
    for fields in forged:
        mr.xadd(keys.inbound_of("matrix"), fields)
    handle_entries(consumer, consumer.reader.read(block_ms=100))
    dead = wr.xrange(keys.dead)
    assert len(dead) == len(forged)
    for _id, fields in dead:
        assert fields[b"source_stream"] == keys.inbound_of("matrix").encode()
        reason = fields[b"reason"].decode()
        assert "on the matrix stream names" in reason or "who is not the owner" in reason
    assert model.calls == 0
    assert not wr.exists(keys.reply("cli:home"))

    # found by the review: a gateway could take the worker lease (and stop the worker for good)
    # and report on another channel's replies
    with pytest.raises(redis.exceptions.NoPermissionError):
        mr.set(keys.lease, "matrix-took-it")
    term = Terminal(
        cfg_for(tmp_path, acl_redis, "cli"), connect(cfg_for(tmp_path, acl_redis, "cli")), "acl"
    )
    sid = term.send("hello")
    handle_entries(consumer, consumer.reader.read(block_ms=100))
    reply = term.wait_for(sid, 5)
    assert reply is not None
    mr.xadd(
        keys.inbound_of("matrix"),
        entry(kind=Kind.DERIVED, text="", extra={"type": "reply_status",
              "reply_id": reply.reply_id, "status": "expired", "detail": "forged"}),
    )  # fmt: skip
    # ... and naming the entry that reply answers does not make it the matrix gateway's
    mr.xadd(
        keys.inbound_of("matrix"),
        entry(kind=Kind.DERIVED, text="", extra={"type": "reply_status", "answers": sid,
              "reply_id": reply.reply_id, "status": "expired", "detail": "forged"}),
    )  # fmt: skip
    handle_entries(consumer, consumer.reader.read(block_ms=100))
    last_two = wr.xrevrange(keys.dead, count=2)
    assert all("reports on reply" in f[b"reason"].decode() for _i, f in last_two)
    statuses = store.conn.execute(
        "SELECT status FROM reply_status WHERE reply_id = ?", (reply.reply_id,)
    ).fetchall()
    assert ("expired",) not in statuses
    consumer.lease.release()
    store.close()


def test_the_mcp_facts_are_the_worker_s_and_the_owner_s_not_a_gateway_s(
    tmp_path: Path, acl_redis: int
) -> None:
    """The worker's MCP facts name the owner's tools (worker/health.py ``report_private``):
    the worker writes them beside its heartbeat, the owner's terminal reads them (``relaybot
    tools``, doctor), and a gateway's account can neither read nor forge them (issue 29's
    privacy review: they were in the heartbeats hash, which every gateway reads and writes)."""
    from contract.bus import connect
    from contract.liveness import private_facts

    keys = cfg_for(tmp_path, acl_redis, "worker").keys
    wr = connect(cfg_for(tmp_path, acl_redis, "worker"))
    wr.set(keys.mcp, '{"mcp": {"files": {"state": "up"}}}', ex=30)
    cr = connect(cfg_for(tmp_path, acl_redis, "cli"))
    assert private_facts(cr, keys.mcp) == {"mcp": {"files": {"state": "up"}}}
    mr = connect(cfg_for(tmp_path, acl_redis, "matrix"))
    for forbidden in (lambda: mr.get(keys.mcp), lambda: mr.set(keys.mcp, "{}")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
    with pytest.raises(redis.exceptions.NoPermissionError):
        cr.set(keys.mcp, "{}")  # the terminal reads them; only the worker writes them
