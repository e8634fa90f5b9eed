"""E-mail delivery is retried, not dropped (issue 11), against real servers started here:
pymap (IMAP), an aiosmtpd SMTP server that greylists, refuses, is down or hangs mid-send as each
test tells it, Redis, and a real worker with the fake model. Every reply's final status
(delivered, failed) ends up in memory."""

from __future__ import annotations

import asyncio
import email
import email.policy
import signal
import threading
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import redis
from aiosmtpd.controller import Controller

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.mailservers import ImapServer, make_message
from tests.support.procs import Proc, Procs, memory_rows, relaybot_env, wait_until, write_config
from tests.support.servers import RedisServer, free_port

pytestmark = pytest.mark.integration

OWNER = "owner@example.org"
BOT = "bot@example.org"


class Smtp:
    """aiosmtpd on a fixed port whose answers the test scripts: ``rcpt`` replies are used up
    one per RCPT TO (then 250); ``hang`` makes DATA wait until released, keeping nothing.
    ``received`` holds the mails the server accepted (250 after DATA)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.rcpt: list[str] = []
        self.rcpt_seen = 0
        self.received: list[Message] = []
        self.hang = False
        self.hung = threading.Event()  # a DATA is being held
        self.hung_id = ""  # the Message-ID of the held mail
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.controller: Controller | None = None

    async def handle_RCPT(
        self, _server: Any, _session: Any, envelope: Any, address: str, _options: Any
    ) -> str:
        with self.lock:
            self.rcpt_seen += 1
            answer = self.rcpt.pop(0) if self.rcpt else "250 OK"
        if answer.startswith("250"):
            envelope.rcpt_tos.append(address)
        return answer

    async def handle_DATA(self, _server: Any, _session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        if self.hang:
            self.hung_id = str(msg["Message-ID"])
            self.hung.set()
            while not self.release.is_set():  # the client is killed meanwhile
                await asyncio.sleep(0.05)
            return "451 4.3.0 the transaction did not complete"
        with self.lock:
            self.received.append(msg)
        return "250 OK"

    def start(self) -> Smtp:
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    def replies_to(self, message_id: str) -> list[Message]:
        with self.lock:
            return [m for m in self.received if m["In-Reply-To"] == message_id]


@pytest.fixture
def smtp_port() -> int:
    return free_port()


@pytest.fixture
def server(smtp_port: int) -> Iterator[Smtp]:
    s = Smtp(smtp_port)
    yield s
    s.release.set()
    s.stop()


@pytest.fixture
def env(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    imap: ImapServer,
    smtp_port: int,
) -> dict[str, str]:
    home = tmp_path / "home"
    write_config(
        home,
        f"""
[owner]
aliases = [{{ address = "{OWNER}", channel = "email" }}]

[delivery]
retry_min = 0.2
retry_max = 1.0

[email]
imap_host = "127.0.0.1"
imap_port = {imap.port}
imap_tls = "plain"
imap_user = "{imap.user}"
imap_password = "{imap.password}"
smtp_host = "127.0.0.1"
smtp_port = {smtp_port}
smtp_tls = "plain"
addresses = ["{BOT}"]
trust_unauthenticated = true
""",
    )
    return relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )


def start(procs: Procs, env: dict[str, str], r: redis.Redis, keys: Keys) -> Proc:
    procs.worker(env, r=r, keys=keys)
    return start_gateway(procs, env)


def start_gateway(procs: Procs, env: dict[str, str]) -> Proc:
    gw = procs.start("gateway-email", ["gateway", "email"], env)
    gw.wait_for_log("email.ready", timeout=20)
    return gw


def db(env: dict[str, str]) -> Path:
    return Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"


def reply_id_of(message_id: str) -> str:
    """relaybot's Message-ID is <relaybot.<reply id>@<domain>> (gateways/email/compose.py)."""
    return message_id.strip("<>").split("@", 1)[0].removeprefix("relaybot.")


def statuses(env: dict[str, str], reply_id: str) -> list[str]:
    rows = memory_rows(db(env), "SELECT status FROM reply_status WHERE reply_id = ?", reply_id)
    return [row["status"] for row in rows]


def out_reply_id(env: dict[str, str], answered: str) -> str:
    """The id of the reply memory recorded to the mail ``answered`` (a Message-ID)."""

    def find() -> str | None:
        rows = memory_rows(
            db(env),
            "SELECT o.reply_id FROM log o JOIN log i ON o.stream_id = i.stream_id "
            "WHERE i.direction = 'in' AND o.direction = 'out' AND i.event_id = ?",
            answered,
        )
        return str(rows[0]["reply_id"]) if rows else None

    return wait_until(find, timeout=20, message=f"the reply to {answered} in memory")


def test_greylisting_at_rcpt_to_is_retried_and_delivered_once(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    server: Smtp,
    real_redis: redis.Redis,
    prefix: str,
) -> None:
    server.rcpt = ["451 4.7.1 greylisted, try again later"] * 3
    server.start()
    gw = start(procs, env, real_redis, Keys(prefix))
    imap.append(make_message(message_id="<grey.1@example.org>"))
    [reply] = wait_until(
        lambda: server.replies_to("<grey.1@example.org>"), timeout=30, message="the reply"
    )
    assert server.rcpt_seen == 4  # three refusals for now, then accepted
    retries = gw.events("email.send_failed")
    assert len(retries) == 3 and all("451" in e["error"] for e in retries)
    reply_id = reply_id_of(str(reply["Message-ID"]))
    wait_until(lambda: statuses(env, reply_id) == ["delivered"], message="'delivered' in memory")
    assert len(server.replies_to("<grey.1@example.org>")) == 1
    assert gw.stop() == 0


def test_an_smtp_server_down_then_up_gets_the_reply_once(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    server: Smtp,
    real_redis: redis.Redis,
    prefix: str,
) -> None:
    gw = start(procs, env, real_redis, Keys(prefix))  # no SMTP server listens yet
    imap.append(make_message(message_id="<down.1@example.org>"))
    reply_id = out_reply_id(env, "<down.1@example.org>")
    wait_until(lambda: len(gw.events("email.send_failed")) >= 2, timeout=20, message="retries")
    server.start()
    [reply] = wait_until(
        lambda: server.replies_to("<down.1@example.org>"), timeout=20, message="the reply"
    )
    assert reply_id_of(str(reply["Message-ID"])) == reply_id
    wait_until(lambda: statuses(env, reply_id) == ["delivered"], message="'delivered' in memory")
    assert len(server.replies_to("<down.1@example.org>")) == 1
    assert gw.stop() == 0


def test_a_gateway_killed_mid_send_resends_with_the_same_message_id_once(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    server: Smtp,
    real_redis: redis.Redis,
    prefix: str,
) -> None:
    server.hang = True  # DATA is held: the reply is marked, SMTP has not completed
    server.start()
    gw = start(procs, env, real_redis, Keys(prefix))
    imap.append(make_message(message_id="<kill.1@example.org>"))
    assert server.hung.wait(30), gw.log_text()[-3000:]
    gw.signal(signal.SIGKILL)
    gw.wait()
    server.hang = False
    server.release.set()  # that transaction never completes: nothing was accepted
    assert server.replies_to("<kill.1@example.org>") == []
    gw2 = start_gateway(procs, env)
    [reply] = wait_until(
        lambda: server.replies_to("<kill.1@example.org>"), timeout=30, message="the resend"
    )
    assert str(reply["Message-ID"]) == server.hung_id  # the same mail, recognisably
    reply_id = reply_id_of(server.hung_id)
    wait_until(lambda: statuses(env, reply_id) == ["delivered"], message="'delivered' in memory")
    assert len(server.replies_to("<kill.1@example.org>")) == 1
    assert gw2.stop() == 0


def test_a_permanent_refusal_is_recorded_as_failed_not_retried(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    server: Smtp,
    real_redis: redis.Redis,
    prefix: str,
) -> None:
    server.rcpt = ["550 5.1.1 no such user"]
    server.start()
    gw = start(procs, env, real_redis, Keys(prefix))
    imap.append(make_message(message_id="<bad.1@example.org>"))
    reply_id = out_reply_id(env, "<bad.1@example.org>")
    wait_until(lambda: statuses(env, reply_id) == ["failed"], timeout=20, message="'failed'")
    [row] = memory_rows(db(env), "SELECT detail FROM reply_status WHERE reply_id = ?", reply_id)
    assert "550" in row["detail"]
    assert gw.events("reply.failed")[0]["reply_id"] == reply_id
    assert not gw.events("email.send_failed")  # not retried
    assert server.rcpt_seen == 1 and server.received == []
    # the next mail is answered as usual
    imap.append(make_message(message_id="<bad.2@example.org>"))
    wait_until(lambda: server.replies_to("<bad.2@example.org>"), timeout=20, message="next")
    assert gw.stop() == 0
