"""The shared gateway runner: backoff, the delivery loop and the process lifecycle, with an
in-process fake channel against fakeredis."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from structlog.testing import capture_logs

from contract.config import Config
from contract.liveness import heartbeats
from contract.messages import InboundMessage, Reply
from gateways import runner
from gateways.deliver import Undeliverable
from gateways.runner import (
    Backoff,
    Delivery,
    FatalGatewayError,
    NotSent,
    Runtime,
    TypingHook,
    run_gateway,
)

# these tests drive a channel named "fake": it is registered as a package would be
pytestmark = pytest.mark.usefixtures("fake_channel")


A, B = "fake:a", "fake:b"


class FakeChannel:
    """A platform that records what it was sent, and fails when told to."""

    name = "fake"
    tick = 0.01

    def __init__(self, *, idempotent: bool = False, typing: bool = False) -> None:
        self.idempotent_sink = idempotent
        self.show_typing: TypingHook | None = self._typing if typing else None
        self.session_list = [A, B]
        self.failures: dict[str, list[BaseException]] = {}  # session -> raised by its sends
        self.session_errors: list[BaseException] = []  # raised by sessions()
        self.loops: dict[str, Coroutine[Any, Any, None]] = {}
        self.sent: list[str] = []
        self.busy_seen: list[frozenset[str]] = []
        self.closed = False

    async def start(self) -> None:
        pass

    def inbound(self) -> dict[str, Coroutine[Any, Any, None]]:
        return self.loops

    async def sessions(self) -> list[str]:
        if self.session_errors:
            raise self.session_errors.pop(0)
        return list(self.session_list)

    async def send(self, reply: Reply) -> None:
        if self.failures.get(reply.session):
            raise self.failures[reply.session].pop(0)
        self.sent.append(reply.reply_id)

    async def _typing(self, busy: frozenset[str]) -> None:
        self.busy_seen.append(busy)

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def r() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return Config.model_validate(
        {"home": tmp_path, "delivery": {"retry_min": 0.2, "retry_max": 0.4}}
    )


def push(r: redis.Redis, cfg: Config, session: str, reply_id: str) -> None:
    rep = Reply(
        reply_id=reply_id, answers="1-0", channel="fake", session=session,
        conversation=session, text=f"text of {reply_id}", created=time.time(),
    )  # fmt: skip
    r.rpush(cfg.keys.reply(session), rep.to_json())


def deliver_until(
    r: redis.Redis, cfg: Config, channel: FakeChannel, done: Callable[[], bool]
) -> None:
    """Run the delivery loop until ``done()`` (or 5 s), then stop it as SIGTERM would."""

    async def main() -> None:
        rt = Runtime(channel.name, r, cfg.keys)
        task = asyncio.create_task(Delivery(rt, channel, r, cfg).run())
        deadline = time.monotonic() + 5
        while not done() and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        rt.stopping.set()
        await task

    asyncio.run(main())


def events(logs: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


def test_backoff_doubles_up_to_a_cap_and_resets() -> None:
    b = Backoff()
    assert [b.next() for _ in range(8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    b.reset()
    assert b.next() == 1.0


def test_not_sent_unmarks_the_reply_and_retries_that_session(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    channel = FakeChannel(idempotent=False)
    channel.failures[A] = [NotSent("the server is down")]
    push(r, cfg, A, "a1")
    with capture_logs() as logs:
        t0 = time.monotonic()
        deliver_until(r, cfg, channel, lambda: "a1" in channel.sent)
    # a marked reply is never sent again through a sink that is not idempotent: it was unmarked
    assert channel.sent == ["a1"]
    assert time.monotonic() - t0 >= 0.2
    (failed,) = events(logs, "fake.send_failed")
    assert failed["session"] == A and failed["error"] == "the server is down"
    assert failed["retry_in"] == 0.2
    assert not events(logs, "reply.maybe_delivered")
    assert r.llen(cfg.keys.inflight(A)) == 0
    assert r.zscore(cfg.keys.delivered(A), "a1") is not None


@pytest.mark.parametrize("idempotent", [True, False])
def test_another_send_error_retries_that_session_without_holding_up_the_others(
    r: fakeredis.FakeRedis, cfg: Config, idempotent: bool
) -> None:
    channel = FakeChannel(idempotent=idempotent)
    channel.failures[A] = [TimeoutError("no answer")]
    push(r, cfg, A, "a1")
    push(r, cfg, B, "b1")
    with capture_logs() as logs:
        deliver_until(
            r, cfg, channel, lambda: not r.exists(cfg.keys.inflight(A), cfg.keys.reply(A))
        )
    (failed,) = events(logs, "fake.send_failed")
    assert failed["session"] == A and "TimeoutError" in failed["error"]
    assert not events(logs, "fake.delivery_failed")  # the loop itself did not back off
    if idempotent:  # resent after the delay; the platform drops a duplicate
        assert channel.sent == ["b1", "a1"]
    else:  # it may have gone out: it stayed in flight, marked, and is not sent again
        assert channel.sent == ["b1"]
        assert events(logs, "reply.maybe_delivered")[0]["reply_id"] == "a1"


def statuses(r: redis.Redis, cfg: Config) -> list[dict[str, Any]]:
    """The reply_status entries the gateway put on its own stream for the worker."""
    entries: Any = r.xrange(cfg.keys.inbound_of("fake"))
    return [InboundMessage.from_fields(fields).extra for _sid, fields in entries]


def test_a_session_that_keeps_failing_waits_longer_each_time_then_delivers(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    channel = FakeChannel(idempotent=True)
    channel.failures[A] = [NotSent("451 greylisted")] * 3
    push(r, cfg, A, "a1")
    with capture_logs() as logs:
        deliver_until(r, cfg, channel, lambda: "a1" in channel.sent)
    assert channel.sent == ["a1"]  # retried, not dropped; once
    assert [e["retry_in"] for e in events(logs, "fake.send_failed")] == [0.2, 0.4, 0.4]


def test_a_reply_retried_until_max_age_is_expired_with_the_last_error(
    r: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    cfg = Config.model_validate(
        {"home": tmp_path, "delivery": {"max_age": 0.5, "retry_min": 0.1, "retry_max": 0.1}}
    )
    channel = FakeChannel(idempotent=True)
    channel.failures[A] = [NotSent("451 greylisted")] * 100
    push(r, cfg, A, "a1")
    with capture_logs() as logs:
        deliver_until(r, cfg, channel, lambda: len(statuses(r, cfg)) == 1)
    assert channel.sent == []
    [status] = statuses(r, cfg)
    assert (status["reply_id"], status["status"]) == ("a1", "expired")
    assert status["detail"] == (
        "not delivered: older than 0.5 s; the last attempt failed: 451 greylisted"
    )
    assert len(events(logs, "fake.send_failed")) >= 2  # retried until then
    assert not r.exists(cfg.keys.inflight(A), cfg.keys.reply(A))


def test_a_refusal_for_good_is_reported_failed_and_the_session_goes_on(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    channel = FakeChannel(idempotent=True)
    channel.failures[A] = [Undeliverable("550 no such user")]
    push(r, cfg, A, "a1")
    push(r, cfg, A, "a2")
    with capture_logs() as logs:
        deliver_until(r, cfg, channel, lambda: "a2" in channel.sent)
    assert channel.sent == ["a2"]
    assert not events(logs, "fake.send_failed")  # not retried
    assert events(logs, "reply.failed")[0]["reply_id"] == "a1"
    [status] = statuses(r, cfg)
    assert status["status"] == "failed" and status["reply_id"] == "a1"
    assert status["detail"] == "550 no such user"
    assert r.llen(cfg.keys.inflight(A)) == 0


def test_a_channel_that_asks_has_every_delivery_reported(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    channel = FakeChannel(idempotent=True)
    channel.report_delivered = True  # type: ignore[attr-defined]
    push(r, cfg, A, "a1")
    deliver_until(r, cfg, channel, lambda: len(statuses(r, cfg)) == 1)
    [status] = statuses(r, cfg)
    assert (status["reply_id"], status["status"]) == ("a1", "delivered")
    assert r.llen(cfg.keys.inflight(A)) == 0


def test_a_redis_error_backs_the_whole_loop_off(
    r: fakeredis.FakeRedis, cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "BACKOFF_START", 0.05)
    channel = FakeChannel()
    channel.session_errors = [redis.ConnectionError("down"), redis.ConnectionError("down")]
    push(r, cfg, B, "b1")
    with capture_logs() as logs:
        deliver_until(r, cfg, channel, lambda: "b1" in channel.sent)
    assert [e["retry_in"] for e in events(logs, "fake.delivery_failed")] == [0.05, 0.1]
    assert channel.sent == ["b1"]


def test_the_typing_hook_gets_the_busy_sessions(r: fakeredis.FakeRedis, cfg: Config) -> None:
    channel = FakeChannel(typing=True)
    r.set(cfg.keys.busy(A), "1")
    deliver_until(r, cfg, channel, lambda: len(channel.busy_seen) >= 2)
    assert channel.busy_seen[-1] == frozenset({A})
    r.delete(cfg.keys.busy(A))
    channel.busy_seen.clear()
    deliver_until(r, cfg, channel, lambda: len(channel.busy_seen) >= 1)
    assert channel.busy_seen[-1] == frozenset()


def gateway(r: redis.Redis, cfg: Config, channel: FakeChannel, *, configured: bool = True) -> int:
    return run_gateway(
        channel.name, cfg, r, configured=configured, hint="set [fake]", make=lambda _rt: channel
    )


def test_a_fatal_send_error_stops_the_gateway_with_exit_2(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    channel = FakeChannel()
    channel.failures[A] = [FatalGatewayError("log in again")]
    push(r, cfg, A, "a1")
    with capture_logs() as logs:
        assert gateway(r, cfg, channel) == 2
    assert events(logs, "fake.fatal")[0]["error"] == "log in again"
    assert events(logs, "fake.stopped")[0]["code"] == 2
    assert channel.closed
    assert heartbeats(r, cfg.keys) == {}
    # nothing was handed over: unmarked, so that it is sent once the problem is fixed
    assert r.llen(cfg.keys.inflight(A)) == 1
    assert r.zscore(cfg.keys.delivered(A), "a1") is None


def test_a_crashed_loop_exits_1(r: fakeredis.FakeRedis, cfg: Config) -> None:
    async def broken() -> None:
        raise ValueError("a bug")

    channel = FakeChannel()
    channel.loops = {"inbound": broken()}
    with capture_logs() as logs:
        assert gateway(r, cfg, channel) == 1
    (crashed,) = events(logs, "fake.crashed")
    assert crashed["task"] == "fake-inbound" and "a bug" in crashed["error"]
    assert heartbeats(r, cfg.keys) == {}


def test_not_configured_idles_beating_until_sigterm_and_removes_its_heartbeat(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    seen: dict[str, Any] = {}

    def watch_then_terminate() -> None:
        deadline = time.monotonic() + 5
        while "gateway:fake" not in seen and time.monotonic() < deadline:
            seen.update(heartbeats(r, cfg.keys))
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # handled by the gateway's event loop

    watcher = threading.Thread(target=watch_then_terminate)
    with capture_logs() as logs:
        watcher.start()
        code = gateway(r, cfg, FakeChannel(), configured=False)
        watcher.join()
    assert code == 0
    assert seen["gateway:fake"]["state"] == "not configured"
    assert heartbeats(r, cfg.keys) == {}
    assert events(logs, "fake.not_configured")[0]["detail"] == "set [fake]"
    assert events(logs, "fake.stopped")[0]["code"] == 0


@pytest.mark.parametrize("name", ["matrix", "email"])
def test_an_idle_gateway_takes_what_it_would_reload_and_asks_a_restart_for_the_rest(
    r: fakeredis.FakeRedis, tmp_path: Path, name: str
) -> None:
    """Not configured, a gateway said "RESTART NEEDED to apply: owner.aliases" although a
    running one reloads owner.aliases: an idle one needs no restart for it either."""
    from contract.config import load_config

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[owner]\naliases = ["a@example.org"]\n')
    cfg = load_config(home, env={})
    rt = Runtime(name, r, cfg.keys)
    watch = runner.watcher(rt, cfg, None)
    (home / "config.toml").write_text('[owner]\naliases = ["b@example.org", "@b:hs"]\n')
    for _ in range(3):  # the file is read once its size and time stopped changing
        watch.check()
    assert watch.fields()["restart_needed"] is False, watch.fields()
    assert watch.config.owner.aliases == ["b@example.org", "@b:hs"]
    section = (
        '[matrix]\nhomeserver = "http://h"\nuser_id = "@bot:h"\n'
        if name == "matrix"
        else '[email]\nimap_host = "imap.example.org"\n'
    )
    (home / "config.toml").write_text('[owner]\naliases = ["b@example.org"]\n' + section)
    for _ in range(3):
        watch.check()
    assert watch.fields()["restart_needed"] is True  # configured meanwhile: start it anew


def test_redis_refusing_the_account_in_delivery_stops_the_gateway_not_retried(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    """Issue 26: a NOPERM (an ACL changed under a running gateway) is a configuration error:
    the delivery loop does not back off and retry it for ever; it reaches `relaybot`, which
    says it in one line and exits 2."""
    channel = FakeChannel()
    refusal = redis.exceptions.NoPermissionError("this user has no permissions to run 'lmove'")
    channel.session_errors = [refusal, refusal]  # what a real ACL would keep answering

    async def until_retried() -> None:  # ends the gateway (exit 0) once the refusal was retried
        while len(channel.session_errors) > 0:
            await asyncio.sleep(0.01)

    channel.loops = {"inbound": until_retried()}
    with capture_logs() as logs, pytest.raises(redis.exceptions.NoPermissionError):
        gateway(r, cfg, channel)
    assert not events(logs, "fake.delivery_failed")
    assert channel.closed
    assert heartbeats(r, cfg.keys) == {}
