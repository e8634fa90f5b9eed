"""One gateway per channel account (gateways/lease.py): the lease a gateway waits for, holds,
takes again when Redis lost it, and gives up when another gateway took it; with fakeredis."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import structlog
from structlog.testing import capture_logs

import gateways.lease
import gateways.runner
from contract.config import Config
from contract.keys import Keys, digest
from contract.liveness import heartbeats
from gateways.lease import GatewayLease, LeaseLost, _pid_namespace, account_of, died_here, identity
from gateways.runner import Delivery, Runtime, run_gateway
from tests.unit.test_runner import A, FakeChannel, push

# these tests drive a channel named "fake": it is registered as a package would be
pytestmark = pytest.mark.usefixtures("fake_channel")


@pytest.fixture(autouse=True)
def fresh_loggers(monkeypatch: pytest.MonkeyPatch) -> None:
    """capture_logs cannot see a module logger that an earlier test's logging setup cached
    (``cache_logger_on_first_use``): give the modules under test fresh ones."""
    structlog.reset_defaults()
    for module in (gateways.lease, gateways.runner):
        monkeypatch.setattr(module, "log", structlog.get_logger(module.__name__))


@pytest.fixture
def r() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return Config.model_validate(
        {
            "home": tmp_path,
            "worker": {"lease_seconds": 1},
            "email": {"imap_host": "IMAP.example.org", "imap_user": "Bot", "addresses": ["b@x"]},
            "matrix": {"homeserver": "https://hs.example.org", "user_id": "@bot:example.org"},
        }
    )


def events(logs: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


def test_the_account_names_the_platform_account_and_the_key_digests_it(cfg: Config) -> None:
    assert account_of(cfg, "matrix") == "@bot:example.org"
    assert account_of(cfg, "email") == "bot@imap.example.org"
    no_user = cfg.model_copy(update={"email": cfg.email.model_copy(update={"imap_user": None})})
    assert account_of(no_user, "email") == "b@x@imap.example.org"
    assert account_of(cfg, "fake") == "fake"
    key = Keys("p:").gateway_lease("matrix", "@bot:example.org")
    assert key == f"p:lease:gateway:matrix:{digest('@bot:example.org')}"


def test_a_second_gateway_waits_says_so_once_and_takes_over_when_the_first_lets_go(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    async def main() -> tuple[GatewayLease, GatewayLease, dict[str, Any]]:
        first = GatewayLease(Runtime("fake", r, cfg.keys), r, cfg)
        second = GatewayLease(Runtime("fake", r, cfg.keys), r, cfg)
        assert await first.acquire()
        assert first.acting()
        waiting = asyncio.create_task(second.acquire())
        await asyncio.sleep(1.0)  # several polls
        assert not waiting.done() and not second.acting()
        beats = heartbeats(r, cfg.keys)
        await first.release()
        assert await asyncio.wait_for(waiting, 2)
        return first, second, beats

    with capture_logs() as logs:
        first, second, beats = asyncio.run(main())
    (said,) = events(logs, "gateway.waiting_for_lease")
    assert said["holder"] == first.lease.token and said["channel"] == "fake"
    assert beats["gateway:fake:standby"]["state"] == "standby"
    assert beats["gateway:fake:standby"]["holder"] == first.lease.token
    assert len(events(logs, "gateway.lease_acquired")) == 2
    assert second.acting() and not first.acting()
    assert "gateway:fake:standby" not in heartbeats(r, cfg.keys)
    second.lease.release()


def test_a_standby_that_is_stopped_returns_false(r: fakeredis.FakeRedis, cfg: Config) -> None:
    async def main() -> bool:
        first = GatewayLease(Runtime("fake", r, cfg.keys), r, cfg)
        rt = Runtime("fake", r, cfg.keys)
        assert await first.acquire()
        asyncio.get_running_loop().call_later(0.3, rt.stopping.set)
        try:
            return await GatewayLease(rt, r, cfg).acquire()
        finally:
            first.lease.release()

    assert asyncio.run(main()) is False


def watch_until(lease: GatewayLease, meddle: Any, seconds: float = 3.0) -> BaseException | None:
    """Hold the lease, let ``meddle(r, key)`` run, watch for ``seconds``; what watch raised."""

    async def main() -> BaseException | None:
        assert await lease.acquire()
        task = asyncio.create_task(lease.watch())
        meddle(lease.r, lease.key)
        await asyncio.sleep(seconds)
        lease.rt.stopping.set()
        try:
            await task
        except LeaseLost as exc:
            return exc
        finally:
            await lease.release()
        return None

    return asyncio.run(main())


def test_a_lease_that_vanished_with_redis_data_is_taken_again(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    lease = GatewayLease(Runtime("fake", r, cfg.keys), r, cfg)
    with capture_logs() as logs:
        assert watch_until(lease, lambda r, key: r.delete(key), seconds=1.5) is None
    assert events(logs, "gateway.lease_regained")
    assert lease.lease.epoch == 2  # a new holding


def test_a_lease_another_gateway_took_stops_this_one(r: fakeredis.FakeRedis, cfg: Config) -> None:
    lease = GatewayLease(Runtime("fake", r, cfg.keys), r, cfg)
    with capture_logs() as logs:
        lost = watch_until(lease, lambda r, key: r.set(key, "gateway:fake@elsewhere:1", px=5000))
    assert isinstance(lost, LeaseLost)
    assert events(logs, "gateway.lease_lost")[0]["holder"] == "gateway:fake@elsewhere:1"
    assert not lease.acting()
    assert r.get(lease.key) == b"gateway:fake@elsewhere:1"  # not released: not its own


def test_a_lease_not_renewed_lately_stops_acting_before_another_could_take_it(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    lease = GatewayLease(Runtime("fake", r, cfg.keys), r, cfg)
    assert asyncio.run(lease.acquire())
    assert lease.acting()
    lease.lease.renewed -= 0.8 * lease.ttl  # paused, or cut off from Redis, that long
    assert not lease.acting()
    lease.lease.release()


def test_delivery_sends_nothing_while_the_gateway_may_not_act(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    channel = FakeChannel()
    push(r, cfg, A, "a1")

    async def main(acting: bool) -> None:
        rt = Runtime(channel.name, r, cfg.keys)
        rt.acting = lambda: acting
        Delivery(rt, channel, r, cfg).deliver([A], asyncio.get_running_loop())

    asyncio.run(main(False))
    assert channel.sent == [] and r.llen(cfg.keys.reply(A)) == 1
    assert r.llen(cfg.keys.inflight(A)) == 0

    async def then_deliver() -> None:  # the send runs on the loop: deliver from a thread
        rt = Runtime(channel.name, r, cfg.keys)
        await asyncio.to_thread(
            Delivery(rt, channel, r, cfg).deliver, [A], asyncio.get_running_loop()
        )

    asyncio.run(then_deliver())
    assert channel.sent == ["a1"]


def test_a_gateway_whose_lease_another_took_exits_4(r: fakeredis.FakeRedis, cfg: Config) -> None:
    channel = FakeChannel()
    key = cfg.keys.gateway_lease("fake", "fake")

    def take_over() -> None:
        deadline = time.monotonic() + 5
        while r.get(key) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        r.set(key, "gateway:fake@elsewhere:2", px=5000)

    thief = threading.Thread(target=take_over)
    with capture_logs() as logs:
        thief.start()
        code = run_gateway("fake", cfg, r, configured=True, hint="", make=lambda _rt: channel)
        thief.join()
    assert code == 4
    assert events(logs, "gateway.lease_lost")
    assert events(logs, "fake.stopped")[0]["code"] == 4
    assert channel.closed
    assert heartbeats(r, cfg.keys) == {}


def test_a_gateway_that_stops_lets_its_lease_go(r: redis.Redis, cfg: Config) -> None:
    async def main() -> None:
        lease = GatewayLease(Runtime("fake", r, cfg.keys), r, cfg)
        assert await lease.acquire()
        assert r.get(lease.key) == lease.lease.token.encode()
        await lease.release()
        assert r.get(lease.key) is None

    asyncio.run(main())


def test_a_holder_is_known_dead_only_on_this_host_in_this_pid_namespace() -> None:
    mine = identity("email")
    host = socket.gethostname()
    assert mine == f"gateway:email@{host}:{os.getpid()}#{_pid_namespace()}"
    assert not died_here(mine)  # alive
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = f"gateway:email@{host}:{gone.pid}#{_pid_namespace()}"
    assert died_here(dead)
    assert not died_here(dead.replace(f"@{host}:", "@another-host:"))
    assert not died_here(f"gateway:email@{host}:{gone.pid}#1")  # another container's PID
    assert not died_here("worker@somewhere:12")
    assert not died_here("garbage")


def test_a_standby_frees_the_lease_of_a_dead_holder_of_this_host_at_once(
    r: fakeredis.FakeRedis, cfg: Config
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lease = GatewayLease(Runtime("fake", r, cfg.keys), r, cfg)
    dead = f"gateway:fake@{socket.gethostname()}:{gone.pid}#{_pid_namespace()}"
    r.set(lease.key, dead, px=60_000)
    with capture_logs() as logs:
        assert asyncio.run(asyncio.wait_for(lease.acquire(), 2))
    assert events(logs, "gateway.lease_freed")[0]["holder"] == dead
    assert not events(logs, "gateway.waiting_for_lease")
    lease.lease.release()
