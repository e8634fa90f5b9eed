"""One gateway per channel account (issue 12), with real processes: two ``relaybot gateway email``
for the same mailbox and Redis prefix, against a real Redis, pymap (IMAP), aiosmtpd (SMTP) and a
real worker with the fake model. The second waits as a standby and answers nothing; it takes
over when the first is killed (at once: same host) or paused past its lease (when the lease ran
out); the paused holder, resumed, stops acting and exits 4."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.mailservers import (
    ImapServer,
    SmtpServer,
    _Collect,
    email_config,
    make_message,
)
from tests.support.matrix_world import World
from tests.support.procs import Proc, Procs, heartbeat, relaybot_env, wait_until, write_config
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

OWNER = "owner@example.org"
BOT = "bot@example.org"
LEASE = 2.0  # [worker] lease_seconds: the gateways' lease too
SMTP_TAKES = 1.0  # seconds the slow SMTP server takes to accept a mail


class _SlowCollect(_Collect):
    """Takes its time over DATA: a reply stays in flight that long, and a second gateway
    delivering the same reply queues (before issue 12) found it there and sent it again."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        await asyncio.sleep(SMTP_TAKES)
        return await super().handle_DATA(server, session, envelope)


@pytest.fixture
def slow_smtp(smtp: SmtpServer) -> SmtpServer:
    """The test's SMTP server, slowed down (the handler is swapped on the running server)."""
    smtp.controller.handler = _SlowCollect(smtp)  # each connection gets the controller's
    return smtp


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.fixture
def env(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    imap: ImapServer,
    smtp: SmtpServer,
) -> dict[str, str]:
    home = tmp_path / "home"
    config = email_config(imap, smtp, bot=BOT, owner=OWNER)
    write_config(home, f"{config}\n[worker]\nlease_seconds = {LEASE}\n")
    return relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )


def gateway(procs: Procs, env: dict[str, str]) -> Proc:
    return procs.start("gateway-email", ["gateway", "email"], env)


def running(gw: Proc) -> str | None:
    """What a started gateway settled into: reading the mailbox, or waiting for the lease."""
    for event in ("email.ready", "gateway.waiting_for_lease"):
        if gw.events(event):
            return event
    assert gw.returncode is None, gw.log_text()[-4000:]
    return None


def answers(smtp: SmtpServer, message_id: str) -> int:
    return sum(1 for m in smtp.messages() if m["In-Reply-To"] == message_id)


def answered_once(smtp: SmtpServer, message_id: str) -> None:
    """One reply arrives, and no second one follows it."""
    wait_until(
        lambda: answers(smtp, message_id) > 0, timeout=20, message=f"a reply to {message_id}"
    )
    time.sleep(2 * SMTP_TAKES)  # a second gateway's duplicate would be sent by now
    assert answers(smtp, message_id) == 1


def test_a_second_gateway_of_the_same_account_waits_then_takes_over_a_killed_one(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    slow_smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    procs.worker(env, r=real_redis, keys=keys)
    first = gateway(procs, env)
    first.wait_for_log("email.ready", timeout=20)
    second = gateway(procs, env)
    assert wait_until(lambda: running(second), timeout=20, message="the second gateway to settle")

    imap.append(make_message(message_id="<one@example.org>", subject="One"))
    answered_once(slow_smtp, "<one@example.org>")

    waiting = second.events("gateway.waiting_for_lease")
    assert len(waiting) == 1, second.log_text()[-4000:]  # said once, not every poll
    assert f"@{socket.gethostname()}:{first.pid}#" in waiting[0]["holder"]
    assert not second.events("email.ready") and not second.events("email.published")
    standby = heartbeat(real_redis, keys, "gateway:email:standby")
    assert standby is not None and standby["state"] == "standby"
    assert standby["pid"] == second.pid
    assert heartbeat(real_redis, keys, "gateway:email")["pid"] == first.pid  # type: ignore[index]

    first.signal(signal.SIGKILL)
    first.wait(5)
    killed = time.monotonic()
    second.wait_for_log("gateway.lease_acquired", timeout=LEASE + 5)
    # on the same host, a holder whose process is gone is freed at its next poll; from another
    # host, the lease runs out first (the paused holder's test below)
    assert time.monotonic() - killed < LEASE + 1  # (no need to wait the lease out)
    assert second.events("gateway.lease_freed")[0]["holder"] == waiting[0]["holder"]
    second.wait_for_log("email.ready", timeout=20)
    imap.append(make_message(message_id="<two@example.org>", subject="Two"))
    answered_once(slow_smtp, "<two@example.org>")
    assert answers(slow_smtp, "<one@example.org>") == 1
    assert second.stop() == 0
    assert heartbeat(real_redis, keys, "gateway:email:standby") is None


def test_a_standby_stopped_while_waiting_exits_cleanly_and_leaves_the_holder_alone(
    env: dict[str, str], procs: Procs, real_redis: redis.Redis, keys: Keys
) -> None:
    first = gateway(procs, env)
    first.wait_for_log("email.ready", timeout=20)
    second = gateway(procs, env)
    second.wait_for_log("gateway.waiting_for_lease", timeout=20)
    assert second.stop() == 0
    assert second.events("email.stopped", code=0)
    time.sleep(1.2)  # the holder beats on
    assert heartbeat(real_redis, keys, "gateway:email")["pid"] == first.pid  # type: ignore[index]
    assert first.returncode is None
    assert first.stop() == 0


def test_a_paused_holder_that_lost_its_lease_stops_acting_and_exits_4(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    procs.worker(env, r=real_redis, keys=keys)
    first = gateway(procs, env)
    first.wait_for_log("email.ready", timeout=20)
    second = gateway(procs, env)
    second.wait_for_log("gateway.waiting_for_lease", timeout=20)

    first.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        second.wait_for_log("gateway.lease_acquired", timeout=LEASE + 5)
        assert time.monotonic() - stopped > LEASE * 0.5  # it waited for the lease to run out
        assert not second.events("gateway.lease_freed")  # the holder is alive: not freed
        second.wait_for_log("email.ready", timeout=20)
        imap.append(make_message(message_id="<paused@example.org>", subject="Paused"))
        wait_until(lambda: answers(smtp, "<paused@example.org>") > 0, timeout=20, message="reply")
    finally:
        first.signal(signal.SIGCONT)
    assert first.wait(10) == 4
    assert first.events("gateway.lease_lost")
    assert not first.events("email.sent")
    assert not first.events("email.published")
    time.sleep(1)
    assert answers(smtp, "<paused@example.org>") == 1
    assert second.returncode is None
    assert second.stop() == 0


def test_a_lease_that_vanished_with_redis_data_is_taken_again(
    env: dict[str, str],
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    """Redis came back without its data (the lease key went with it): the holder takes its
    lease again and goes on answering."""
    procs.worker(env, r=real_redis, keys=keys)
    gw = gateway(procs, env)
    gw.wait_for_log("email.ready", timeout=20)
    lease = keys.gateway_lease("email", f"{imap.user}@127.0.0.1".lower())  # IMAP user at host
    assert real_redis.get(lease) is not None
    real_redis.delete(lease)
    gw.wait_for_log("gateway.lease_regained", timeout=LEASE + 5)
    imap.append(make_message(message_id="<again@example.org>", subject="Again"))
    answered_once(smtp, "<again@example.org>")
    assert gw.returncode is None
    assert gw.stop() == 0


def test_a_second_matrix_gateway_of_the_same_bot_waits_and_takes_over_when_it_stops(
    world: World,
) -> None:
    hs, owner = world.hs, world.owner
    first = world.gateway()
    first.wait_for_log("matrix.backlog_skipped")
    second = world.procs.start("gateway-matrix", ["gateway", "matrix"], world.env)
    said = second.wait_for_log("gateway.waiting_for_lease", timeout=20)
    assert f":{first.pid}#" in said["holder"]
    room = hs.create_room(owner, [world.bot.user_id], direct=True)
    wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")
    hs.send_text(owner, room, "one")
    world.wait_bot_messages(owner, room, 1)
    time.sleep(1.5)  # a second gateway's answer would be there by now
    assert len(world.bot_messages(owner, room)) == 1
    assert not second.events("matrix.logged_in")  # it left the account alone

    assert first.stop() == 0  # lets its lease go: the standby takes over at once
    second.wait_for_log("gateway.lease_acquired", timeout=5)
    second.wait_for_log("matrix.logged_in", timeout=20)
    hs.send_text(owner, room, "two")
    world.wait_bot_messages(owner, room, 2)
    time.sleep(1.5)
    assert len(world.bot_messages(owner, room)) == 2
    assert second.stop() == 0
