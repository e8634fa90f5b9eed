"""The e-mail gateway as its own process, against real servers started here on 127.0.0.1:
pymap (IMAP with IDLE), aiosmtpd (SMTP), Redis, and a real worker with the fake model."""

from __future__ import annotations

import email.utils
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from email.message import Message
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from contract.keys import Keys
from contract.messages import InboundMessage
from gateways.audience import audience_key
from tests.support.fakemodel import FakeModelServer
from tests.support.mailcorpus import corpus
from tests.support.mailservers import (
    ImapServer,
    SmtpServer,
    TlsProxy,
    make_message,
    self_signed_cert,
)
from tests.support.procs import (
    REPO,
    Proc,
    Procs,
    dead_letters,
    memory_rows,
    relaybot_env,
    wait_until,
    write_config,
)
from tests.support.servers import RedisServer, acl_redis_binary, free_port

pytestmark = pytest.mark.integration

OWNER = "owner@example.org"
BOT = "bot@example.org"
PEER = "peer@example.com"


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


def _env(
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    model: FakeModelServer,
    imap: ImapServer,
    smtp: SmtpServer,
    *,
    per_thread: int = 10,
    per_sender: int = 100,
    tls: str = "plain",
    more: str = "",
    auth: str = "trust_unauthenticated = true  # only the test's pymap delivers to this mailbox",
) -> dict[str, str]:
    home = tmp_path / "home"
    write_config(
        home,
        f"""
[owner]
aliases = [{{ address = "{OWNER}", channel = "email" }}]

[email]
imap_host = "127.0.0.1"
imap_port = {imap.port}
imap_tls = "{tls}"
imap_user = "{imap.user}"
imap_password = "{imap.password}"
smtp_host = "127.0.0.1"
smtp_port = {smtp.port}
smtp_tls = "{tls}"
addresses = ["{BOT}"]
allowlist = ["{PEER}"]
rate_per_thread = {per_thread}
rate_per_sender = {per_sender}
{auth}
{more}
""",
    )
    return relaybot_env(home, redis_url=redis_url, prefix=prefix, model_url=model.base_url)


@pytest.fixture
def env(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    imap: ImapServer,
    smtp: SmtpServer,
) -> dict[str, str]:
    return _env(tmp_path, redis_server.url, prefix, model_server, imap, smtp)


def start_gateway(procs: Procs, env: dict[str, str]) -> Proc:
    gw = procs.start("gateway-email", ["gateway", "email"], env)
    gw.wait_for_log("email.ready", timeout=20)
    return gw


def replies_to(smtp: SmtpServer, message_id: str) -> list[Message]:
    return [m for m in smtp.messages() if m["In-Reply-To"] == message_id]


def wait_reply(smtp: SmtpServer, message_id: str, timeout: float = 20) -> Message:
    return wait_until(
        lambda: next(iter(replies_to(smtp, message_id)), None),
        timeout=timeout,
        message=f"a reply to {message_id}",
    )


def inbound(r: redis.Redis, keys: Keys) -> list[InboundMessage]:
    """The mails on the stream (the gateway's reply_status reports aside)."""
    entries: Any = r.xrange(keys.inbound_of("email"))
    found = [InboundMessage.from_fields(fields) for _sid, fields in entries]
    return [m for m in found if m.kind != "derived"]


def test_mail_reaches_the_worker_through_idle_and_the_reply_is_threaded(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    procs.worker(env, r=real_redis, keys=keys)
    gw = start_gateway(procs, env)
    uid = imap.append(make_message(message_id="<root.1@example.org>", subject="Lunch?"))
    reply = wait_reply(smtp, "<root.1@example.org>")
    assert reply["Subject"] == "Re: Lunch?"
    assert reply["References"] == "<root.1@example.org>"
    assert reply["Auto-Submitted"] == "auto-replied"
    assert reply["From"] == BOT and reply["To"] == OWNER
    assert reply["Message-ID"].startswith("<relaybot.") and reply["Date"]
    assert reply.get_content_type() == "multipart/alternative"
    assert "hi there" in str(reply.get_body(("plain",)).get_content())  # type: ignore[attr-defined]
    wait_until(lambda: "\\Seen" in imap.flags(uid), message="\\Seen on the answered message")

    first_reply_id = reply["Message-ID"]
    imap.append(
        make_message(
            message_id="<follow.2@example.org>",
            subject="Re: Lunch?",
            body="and dessert",
            in_reply_to=first_reply_id,
            references=f"<root.1@example.org> {first_reply_id}",
        )
    )
    second = wait_reply(smtp, "<follow.2@example.org>")
    assert second["Subject"] == "Re: Lunch?"
    assert second["References"] == f"<root.1@example.org> {first_reply_id} <follow.2@example.org>"
    sessions = {m.session for m in inbound(real_redis, keys)}
    assert sessions == {f"email:root.1@example.org/{audience_key([OWNER])}"}
    assert all(m.privacy == "owner" for m in inbound(real_redis, keys))
    assert gw.returncode is None
    assert gw.stop() == 0


def test_a_reply_is_its_new_text_and_the_quoted_thread_is_kept_aside(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
    model_server: FakeModelServer,
) -> None:
    """Issue 13: a reply carried the whole quoted thread to the model as if it were new text.
    The owner answers relaybot's reply the way mail clients do (new text on top, the reply
    quoted under an "On ... wrote:" line): the model gets the new text, memory keeps the quote
    in the row's extra. A reply quoting a mail relaybot never received shows the quote, marked."""
    procs.worker(env, r=real_redis, keys=keys)
    gw = start_gateway(procs, env)
    imap.append(make_message(message_id="<q.1@example.org>", subject="Lunch?", body="pizza?"))
    first = wait_reply(smtp, "<q.1@example.org>")
    quoted_text = str(first.get_body(("plain",)).get_content()).strip()  # type: ignore[attr-defined]
    when = email.utils.format_datetime(email.utils.parsedate_to_datetime(first["Date"]))
    quote = "\n".join(f"> {line}" for line in quoted_text.splitlines())
    body = f"Yes, at noon.\n\nOn {when}, relaybot <{BOT}> wrote:\n{quote}\n"
    imap.append(
        make_message(
            message_id="<q.2@example.org>", subject="Re: Lunch?", body=body,
            in_reply_to=first["Message-ID"],
            references=f"<q.1@example.org> {first['Message-ID']}",
        )
    )  # fmt: skip
    wait_reply(smtp, "<q.2@example.org>")
    asked = " ".join(model_server.requests[-1]["messages"][-1]["content"].split())
    assert asked.endswith("Subject: Re: Lunch? Yes, at noon."), asked
    assert "wrote:" not in asked and "pizza?" not in asked
    db = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    (row,) = memory_rows(db, "SELECT * FROM log WHERE event_id = ?", "<q.2@example.org>")
    assert row["text"] == "Subject: Re: Lunch?\n\nYes, at noon."
    extra = json.loads(row["extra"])
    assert extra["quoted"].startswith(f"On {when}, relaybot <{BOT}> wrote:")
    assert "pizza?" in extra["quoted"]
    assert "quote_shown" not in extra

    # copied into a thread late: the quoted mail never reached relaybot, so it is shown, marked
    imap.append(
        make_message(
            message_id="<q.3@example.org>", subject="Re: budget", in_reply_to="<b.1@x.org>",
            references="<b.1@x.org>",
            body="What do you think?\n\nOn Sun, Bob <bob@x.org> wrote:\n> The budget is 5k.\n",
        )
    )  # fmt: skip
    wait_reply(smtp, "<q.3@example.org>")
    asked = " ".join(model_server.requests[-1]["messages"][-1]["content"].split())
    assert "What do you think? [quoted from an earlier mail that relaybot did not receive]" in (
        asked
    )
    assert "only the sender's claim, unverified" in asked, asked
    assert "| On Sun, Bob <bob@x.org> wrote: | > The budget is 5k. [end of the quote" in asked
    assert gw.stop() == 0


def test_a_sender_not_on_the_allowlist_is_recorded_but_not_answered(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    procs.worker(env, r=real_redis, keys=keys)
    gw = start_gateway(procs, env)
    stranger = imap.append(
        make_message(sender="stranger@elsewhere.example", message_id="<who.1@elsewhere.example>")
    )
    gw.wait_for_log("email.recorded_only", sender="stranger@elsewhere.example")
    db = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    wait_until(
        lambda: memory_rows(
            db, "SELECT * FROM log WHERE event_id = ?", "<who.1@elsewhere.example>"
        ),
        message="the stranger's mail recorded in memory",
    )
    (row,) = memory_rows(db, "SELECT * FROM log WHERE event_id = ?", "<who.1@elsewhere.example>")
    assert row["direction"] == "in" and "no_reply" in row["extra"]
    imap.append(make_message(message_id="<after.2@example.org>"))  # an allowed one after it
    wait_reply(smtp, "<after.2@example.org>")
    assert replies_to(smtp, "<who.1@elsewhere.example>") == []  # never answered
    assert "\\Seen" not in imap.flags(stranger)  # left unread for the owner
    assert memory_rows(db, "SELECT * FROM log WHERE direction = 'out' AND stream_id = ?",
                       row["stream_id"]) == []  # fmt: skip
    assert gw.stop() == 0


def test_gateway_killed_mid_stream_answers_each_message_exactly_once(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    procs.worker(env, r=real_redis, keys=keys)
    gw = start_gateway(procs, env)
    ids = [f"<kill.{i}@example.org>" for i in range(6)]
    imap.append(make_message(message_id=ids[0]))
    wait_reply(smtp, ids[0])
    for mid in ids[1:3]:
        # a slow turn, so that their replies are queued while the gateway is down (a kill in the
        # middle of an SMTP send is tests/integration/test_email_delivery.py's)
        imap.append(make_message(message_id=mid, body="[[delay:0.5]] hi"))
    time.sleep(0.05)
    gw.signal(signal.SIGKILL)  # mid-stream: some of these may be published, some not
    gw.wait()
    for mid in ids[3:]:
        imap.append(make_message(message_id=mid))  # arrives while the gateway is down
    start_gateway(procs, env)
    for mid in ids:
        wait_reply(smtp, mid, timeout=30)
    time.sleep(1.0)  # anything sent twice would arrive meanwhile
    for mid in ids:
        assert len(replies_to(smtp, mid)) == 1, mid
    assert sorted(m.event_id for m in inbound(real_redis, keys)) == sorted(ids)


class AutoResponder:
    """A test peer that answers every mail it gets from relaybot, as auto-responders do."""

    def __init__(self, imap: ImapServer, smtp: SmtpServer, *, root: str, flag: bool) -> None:
        self.imap, self.smtp, self.root, self.flag = imap, smtp, root, flag
        self.answered: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            for msg in self.smtp.messages():
                mid = str(msg["Message-ID"])
                if mid in self.answered or self.root not in str(msg["References"]):
                    continue
                self.answered.add(mid)
                headers = {"Auto-Submitted": "auto-replied"} if self.flag else {}
                self.imap.append(
                    make_message(
                        sender=PEER,
                        subject=f"Out of office: {msg['Subject']}",
                        body="I am away.",
                        message_id=email.utils.make_msgid(domain="example.com"),
                        in_reply_to=mid,
                        references=f"{msg['References']} {mid}",
                        headers=headers,
                    )
                )

    def __enter__(self) -> AutoResponder:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def test_loop_guard_stops_an_auto_responder_and_ignores_every_header_case(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    env = _env(tmp_path, redis_server.url, prefix, model_server, imap, smtp, per_thread=3)
    procs.worker(env, r=real_redis, keys=keys)
    gw = start_gateway(procs, env)
    ignored = [
        make_message(message_id="<g1@x>", headers={"Auto-Submitted": "auto-generated"}),
        make_message(message_id="<g2@x>", headers={"Precedence": "bulk"}),
        make_message(message_id="<g3@x>", headers={"Precedence": "list"}),
        make_message(message_id="<g4@x>", headers={"Precedence": "junk"}),
        make_message(message_id="<g5@x>", headers={"List-Id": "<l.example.org>"}),
        make_message(message_id="<g6@x>", sender="MAILER-DAEMON@example.org"),
        make_message(message_id="<g7@x>", sender="postmaster@example.org"),
        make_message(message_id="<g8@x>", sender=BOT),
        make_message(message_id="<relaybot.deadbeef@example.org>"),
    ]
    for msg in ignored:
        imap.append(msg)
    # a well-behaved auto-responder (Auto-Submitted) in one thread, a naive one in another
    with AutoResponder(imap, smtp, root="<peer.1@example.com>", flag=True):
        imap.append(make_message(sender=PEER, message_id="<peer.1@example.com>"))
        wait_reply(smtp, "<peer.1@example.com>")
        gw.wait_for_log("email.ignored", reason="Auto-Submitted: auto-replied")
    # one that sets none of the headers: its answer comes within [email] reply_window of our
    # reply, so it is recorded, not answered (issue 11: "at most one reply per storm")
    with AutoResponder(imap, smtp, root="<peer.2@example.com>", flag=False) as naive_peer:
        imap.append(make_message(sender=PEER, message_id="<peer.2@example.com>"))
        gw.wait_for_log("email.reply_window", sender=PEER, timeout=30)
        gw.wait_for_log("email.recorded_only", sender=PEER, timeout=30)
    time.sleep(1.0)  # a second reply to the storm would be sent meanwhile
    to_peer = [m for m in smtp.messages() if PEER in str(m["To"])]
    flagged = [m for m in to_peer if "<peer.1@example.com>" in str(m["References"])]
    assert len(flagged) == 1  # the auto-reply to it was not answered
    naive = [m for m in to_peer if "<peer.2@example.com>" in str(m["References"])]
    assert len(naive) == 1 and len(naive_peer.answered) == 1  # one reply per storm
    assert not gw.events("email.rate_capped")  # stopped by the window, not by the cap
    assert not [m for m in smtp.messages() if OWNER in str(m["To"])]  # every header case
    reasons = {r["message_id"] for r in gw.events("email.ignored")}
    assert {str(m["Message-ID"]) for m in ignored} <= reasons
    assert gw.returncode is None
    t0 = time.monotonic()
    assert gw.stop() == 0
    assert time.monotonic() - t0 < 3, gw.log_text()[-3000:]


def test_malformed_corpus_through_the_running_gateway(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    procs.worker(env, r=real_redis, keys=keys)
    gw = start_gateway(procs, env)
    messages = corpus("run")
    for data in messages.values():
        imap.append(data)
    imap.append(b"X-Nothing: at all\r\n\r\nno From header, no Message-ID\r\n")
    imap.append(make_message(message_id="<after.corpus@example.org>"))
    wait_reply(smtp, "<after.corpus@example.org>", timeout=60)
    wait_until(lambda: len(smtp.messages()) >= len(messages) + 1, timeout=60)
    for name in messages:
        assert replies_to(smtp, f"<{name}.run@corpus.example.org>"), name
    dead = dead_letters(real_redis, keys)
    assert any(b"no From address" in fields["reason"] for _sid, fields in dead)
    assert gw.returncode is None


def test_imap_restart_with_a_new_uidvalidity_loses_and_repeats_nothing(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    procs.worker(env, r=real_redis, keys=keys)
    gw = start_gateway(procs, env)
    old = make_message(message_id="<before.restart@example.org>")
    imap.append(old)
    wait_reply(smtp, "<before.restart@example.org>")
    imap.stop()  # pymap's in-memory backend comes back empty, with a new UIDVALIDITY
    imap.start()
    imap.append(old)  # the same mail again, under new UIDs
    imap.append(make_message(message_id="<after.restart@example.org>"))
    gw.wait_for_log("email.uidvalidity_changed", timeout=30)
    wait_reply(smtp, "<after.restart@example.org>", timeout=30)
    time.sleep(0.5)
    assert len(replies_to(smtp, "<before.restart@example.org>")) == 1
    gw.wait_for_log("email.duplicate", message_id="<before.restart@example.org>")
    assert gw.returncode is None


def test_polling_fallback_without_idle(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    more = "idle = false\npoll_interval = 0.2"
    env = _env(tmp_path, redis_server.url, prefix, model_server, imap, smtp, more=more)
    procs.worker(env, r=real_redis, keys=keys)
    gw = start_gateway(procs, env)
    assert gw.events("email.ready")[0]["idle"] is False
    imap.append(make_message(message_id="<polled@example.org>"))
    wait_reply(smtp, "<polled@example.org>")


def test_idle_is_renewed_and_mail_after_a_renewal_arrives(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    env = _env(
        tmp_path, redis_server.url, prefix, model_server, imap, smtp, more="idle_renew = 0.2"
    )
    procs.worker(env, r=real_redis, keys=keys)
    gw = start_gateway(procs, env)
    time.sleep(1.0)  # several IDLE commands ended by the client and issued again
    imap.append(make_message(message_id="<renewed@example.org>"))
    wait_reply(smtp, "<renewed@example.org>")
    assert not gw.events("email.imap_error")
    assert len(gw.events("email.idle_renewed")) >= 2


def test_starttls_for_imap_and_smtp_checks_certificates(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    cert, key = self_signed_cert(tmp_path / "tls")
    imap = ImapServer(tmp_path / "imap-tls", tls=(cert, key)).start()
    smtp = SmtpServer(tls=(cert, key)).start()
    try:
        refused_then_answered(
            lambda **kw: _env(
                tmp_path, redis_server.url, prefix, model_server, imap, smtp, tls="starttls", **kw
            ),
            cert,
            procs,
            real_redis,
            keys,
            deliver=imap.append,
            smtp=smtp,
            message_id="<tls@example.org>",
        )
    finally:
        imap.stop()
        smtp.stop()


def refused_then_answered(
    env_for: Callable[..., dict[str, str]],
    cert: Path,
    procs: Procs,
    r: redis.Redis,
    keys: Keys,
    *,
    deliver: Callable[[Any], object],
    smtp: SmtpServer,
    message_id: str,
) -> None:
    """Without the CA the self-signed certificate is refused and nothing is fetched; with
    ``ca_file`` set, a mail is fetched and answered over TLS."""
    gw = procs.start("gateway-email", ["gateway", "email"], env_for())
    record = gw.wait_for_log("email.imap_error", timeout=20)
    assert "CERTIFICATE_VERIFY_FAILED" in record["error"]
    assert gw.stop() == 0

    env = env_for(more=f'ca_file = "{cert}"')
    procs.worker(env, r=r, keys=keys)
    start_gateway(procs, env)
    deliver(make_message(message_id=message_id))
    reply = wait_reply(smtp, message_id)
    assert reply["Subject"] == "Re: hello"


def test_implicit_tls_for_imap_and_smtp_checks_certificates(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    """imap_tls / smtp_tls = "tls": TLS from the first byte (IMAPS 993, SMTPS 465 style)."""
    cert, key = self_signed_cert(tmp_path / "tls")
    imap = ImapServer(tmp_path / "imap-plain").start()
    proxy = TlsProxy(imap.port, cert, key).start()
    smtp = SmtpServer(tls=(cert, key), implicit_tls=True).start()
    imaps = SimpleNamespace(port=proxy.port, user=imap.user, password=imap.password)
    try:
        refused_then_answered(
            lambda **kw: _env(
                tmp_path, redis_server.url, prefix, model_server, imaps, smtp, tls="tls", **kw
            ),
            cert,
            procs,
            real_redis,
            keys,
            deliver=imap.append,
            smtp=smtp,
            message_id="<imaps@example.org>",
        )
    finally:
        proxy.stop()
        imap.stop()
        smtp.stop()


def test_a_refused_login_stops_the_gateway_with_a_clear_message(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
) -> None:
    imap.password = "wrong"
    env = _env(tmp_path, redis_server.url, prefix, model_server, imap, smtp)
    gw = procs.start("gateway-email", ["gateway", "email"], env)
    assert gw.wait(20) == 2
    assert "IMAP login refused" in gw.events("email.fatal")[0]["error"]


def test_through_the_deploy_acl_users(
    tmp_path: Path,
    model_server: FakeModelServer,
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
) -> None:
    """The gateway needs nothing beyond what deploy/redis/users.acl grants relaybot-email."""
    acl = (REPO / "deploy" / "redis" / "users.acl").read_text()
    acl = acl.replace(">CHANGE-ME-email", ">e-secret").replace(">CHANGE-ME-worker", ">w-secret")
    (tmp_path / "users.acl").write_text(acl)
    port = free_port()
    server = subprocess.Popen(
        [acl_redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--dir", str(tmp_path), "--aclfile", str(tmp_path / "users.acl")],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        admin = redis.Redis(port=port, username="relaybot-worker", password="w-secret")
        wait_until(lambda: _pings(admin), message="the ACL redis-server")
        url = f"redis://relaybot-{{}}:{{}}@127.0.0.1:{port}/0"
        env = _env(tmp_path, url.format("email", "e-secret"), "relaybot:", model_server, imap, smtp)
        worker_env = {**env, "REDIS_URL": url.format("worker", "w-secret")}
        gateway_env = env
        procs.worker(worker_env, r=admin, keys=Keys("relaybot:"))
        start_gateway(procs, gateway_env)
        imap.append(make_message(message_id="<acl@example.org>"))
        wait_reply(smtp, "<acl@example.org>")
    finally:
        server.terminate()
        server.wait(10)


def _pings(r: redis.Redis) -> bool:
    try:
        return bool(r.ping())
    except redis.ConnectionError:
        return False


def test_unconfigured_gateway_idles_and_stops_cleanly(
    tmp_path: Path, redis_server: RedisServer, prefix: str, procs: Procs
) -> None:
    env = relaybot_env(tmp_path / "bare", redis_url=redis_server.url, prefix=prefix)
    gw = procs.start("gateway-email", ["gateway", "email"], env)
    gw.wait_for_log("email.not_configured")
    time.sleep(0.3)
    assert gw.returncode is None
    assert gw.stop() == 0
