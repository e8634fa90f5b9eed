"""Turns side by side (issue 12): the real worker process, a real Redis, our model server with a
delay. N sessions at once finish in about one model latency; one session stays in order; the
owner is not queued behind a flood of group messages; SIGTERM finishes the turns in flight."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from contract.bus import publish
from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Proc,
    Procs,
    memory_rows,
    pending,
    relaybot_env,
    send,
    wait_for_replies,
    write_config,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

DELAY = 1.0  # seconds the model takes to answer


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.fixture
def start_worker(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    real_redis: redis.Redis,
    keys: Keys,
) -> Callable[[str], tuple[dict[str, str], Proc]]:
    """A real worker with this config.toml against the test's Redis and model; its env."""

    def start(config: str) -> tuple[dict[str, str], Proc]:
        home = tmp_path / "home"
        write_config(home, config)
        env = relaybot_env(
            home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
        )
        return env, procs.worker(env, r=real_redis, keys=keys)

    return start


def _group(r: redis.Redis, keys: Keys, room: str, text: str) -> str:
    msg = InboundMessage(
        channel="matrix", session=f"matrix:{room}", conversation=f"matrix:{room}",
        sender="@bob:example.org", privacy=Privacy.GROUP, text=text, ts=time.time(),
        event_id=f"${room}-{text}",
    )  # fmt: skip
    return publish(r, keys, msg)


def test_sessions_at_once_finish_in_about_one_model_latency_in_order(
    start_worker: Callable[[str], tuple[dict[str, str], Proc]],
    model_server: FakeModelServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    start_worker('[model]\nconcurrency = 8\n[turns]\nmode = "followup"\n')
    started = time.monotonic()
    sent = {f"s{n}": send(real_redis, keys, f"s{n}", f"hi [[delay:{DELAY}]]") for n in range(6)}
    # and a second message in one session: answered after its first, by its own turn
    second = send(real_redis, keys, "s0", f"again [[delay:{DELAY}]]")
    for n in range(1, 6):
        got = wait_for_replies(real_redis, keys, f"cli:s{n}", 1, timeout=20)
        assert got[0].answers == sent[f"s{n}"]
    together = time.monotonic() - started
    in_order = wait_for_replies(real_redis, keys, "cli:s0", 2, timeout=20)
    assert [r.answers for r in in_order] == [sent["s0"], second]
    # one at a time this takes six model latencies; side by side about one
    assert together < 3 * DELAY, f"six sessions took {together:.1f} s with a {DELAY} s model"
    assert model_server.calls == 7
    assert pending(real_redis, keys) == 0


def test_the_owner_is_answered_while_a_flood_of_group_messages_waits(
    start_worker: Callable[[str], tuple[dict[str, str], Proc]],
    model_server: FakeModelServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    start_worker('[model]\nconcurrency = 2\n[turns]\nmode = "followup"\n')
    for n in range(12):  # twelve rooms, each turn a model latency: 12 s for the one slot
        _group(real_redis, keys, f"room{n}", f"flood {n} [[delay:{DELAY}]]")
    time.sleep(0.3)
    asked = time.monotonic()
    send(real_redis, keys, "me", f"owner here [[delay:{DELAY}]]")
    wait_for_replies(real_redis, keys, "cli:me", 1, timeout=20)
    waited = time.monotonic() - asked
    assert waited < 2.5 * DELAY, f"the owner waited {waited:.1f} s behind the group flood"
    for n in range(12):
        wait_for_replies(real_redis, keys, f"matrix:room{n}", 1, timeout=40)


def test_a_burst_in_one_session_is_answered_by_one_collected_turn(
    start_worker: Callable[[str], tuple[dict[str, str], Proc]],
    model_server: FakeModelServer,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    env, _ = start_worker("")  # collect: the default
    first = send(real_redis, keys, "b", f"first [[delay:{DELAY}]]")
    time.sleep(0.3)  # its turn runs; the rest piles up behind it
    burst = [send(real_redis, keys, "b", f"part {n}") for n in range(5)]
    got = wait_for_replies(real_redis, keys, "cli:b", 2, timeout=20)
    time.sleep(0.3)
    got = wait_for_replies(real_redis, keys, "cli:b", 2)
    assert [r.answers for r in got] == [first, burst[-1]]
    assert model_server.calls == 2
    last = model_server.requests[-1]["messages"]
    shown = "\n".join(str(m["content"]) for m in last)
    assert all(f"part {n}" in shown for n in range(5))
    rows = memory_rows(Path(env["RELAYBOT_HOME"]) / "memory.sqlite3")
    assert sum(1 for row in rows if row["direction"] == "in") == 6
    assert sum(1 for row in rows if row["direction"] == "out") == 2
    assert pending(real_redis, keys) == 0


def test_sigterm_finishes_the_turns_in_flight_and_exits_0(
    start_worker: Callable[[str], tuple[dict[str, str], Proc]],
    model_server: FakeModelServer,
    procs: Procs,
    real_redis: redis.Redis,
    keys: Keys,
) -> None:
    env, worker = start_worker('[model]\nconcurrency = 4\n[turns]\nmode = "followup"\n')
    sent = [send(real_redis, keys, f"t{n}", f"slow {n} [[delay:{DELAY}]]") for n in range(3)]
    waiting = send(real_redis, keys, "t0", "behind the first")
    deadline = time.monotonic() + 10
    while model_server.calls < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert model_server.calls == 3
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    for n in range(3):
        got = wait_for_replies(real_redis, keys, f"cli:t{n}", 1, timeout=5)
        assert got[0].answers == sent[n]
    assert pending(real_redis, keys) == 1  # the one not started waits for the next worker
    procs.worker(env, r=real_redis, keys=keys)
    got = wait_for_replies(real_redis, keys, "cli:t0", 2, timeout=10)
    assert got[1].answers == waiting
    assert model_server.calls == 4
