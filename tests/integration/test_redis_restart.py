"""Processes ride out a Redis restart (issue 11, item 8), as real processes against a real Redis.

- The worker and the jobs process keep running through a Redis killed with SIGKILL and started
  again without its data (no persistence: the lease, the groups and the stream are gone); the
  worker logs ``redis.unreachable`` then ``redis.reconnected``, takes the lease again and answers
  the next message; the jobs process runs the next job.
- The worker, killed Redis mid-backlog (a persistent Redis, restarted with its data): every
  message is answered, none twice, nothing left pending.
- ``relaybot chat`` whose connection drops right after its XADD ran (a proxy throws Redis's answer
  away): the message is in the stream once, and chat prints its reply (exit 0), not "cannot
  reach Redis".
- ``relaybot chat`` waiting for a reply while Redis restarts: it waits too, and prints it.
- ``relaybot redis`` (the Procfile's line) starts its killed server again, and stops with it.
- A zero-config ``relaybot chat`` waits for the server the redis line is restarting (no second one).
- The worker whose commit finds the lease gone after a restart it did not see takes it again.
- The e-mail and the Matrix gateways whose publish ran but whose answer was lost: they wait Redis
  out, have not moved their platform cursor past the event, find it published on the second
  look; one entry, one reply.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from rq import Queue

from contract.keys import Keys
from tests.support.cutproxy import CutProxy
from tests.support.fakemodel import FakeModelServer
from tests.support.jobs import ping_job
from tests.support.mailservers import ImapServer, SmtpServer, email_config, make_message
from tests.support.matrix_world import World
from tests.support.procs import (
    REPO,
    Procs,
    chat,
    lease_holder,
    pending,
    relaybot_env,
    replies,
    send,
    wait_for_heartbeat,
    wait_until,
    write_config,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own: it is killed and started again."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def kill_and_restart(server: RedisServer) -> None:
    """SIGKILL, its files deleted (its data is gone, as on a host that lost its disk or a Redis
    run without persistence), then a new server on the same port."""
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait(10)
    for path in server.workdir.iterdir():
        if path.name != "redis.log":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    server.start()


def checked_xadds(role: str) -> int:
    """How many XADDs a gateway's start-up check queues in its discarded MULTI."""
    from contract.access import role_probes

    return sum(probe[0] == "XADD" for probe in role_probes(Keys(), role))


def test_worker_and_jobs_ride_out_a_redis_restart_that_lost_everything(
    tmp_path: Path, own_redis: RedisServer, procs: Procs, model_server: FakeModelServer
) -> None:
    keys = Keys("rs:")
    env = relaybot_env(
        tmp_path / "home", redis_url=own_redis.url, prefix="rs:", model_url=model_server.base_url
    )
    r = own_redis.client()
    worker = procs.worker(env, r=r, keys=keys)
    jobs = procs.jobs(env)
    wait_for_heartbeat(r, keys, "jobs", pid=jobs.pid)

    first = chat(env, "before the restart", session="rs")
    assert first.returncode == 0, first.stderr
    assert first.stdout.endswith(": before the restart\n")

    kill_and_restart(own_redis)

    worker.wait_for_log("redis.unreachable", timeout=20)
    worker.wait_for_log("redis.reconnected", timeout=30)
    worker.wait_for_log("worker.resumed", timeout=30)
    # the lease went with Redis's data: the worker holds it again, and beats again
    wait_until(
        lambda: (lease_holder(r, keys) or "").endswith(f":{worker.pid}"),
        timeout=30,
        message="the worker to hold the lease again",
    )
    wait_for_heartbeat(r, keys, "worker", pid=worker.pid, timeout=30)
    wait_for_heartbeat(r, keys, "jobs", pid=jobs.pid, timeout=30)

    second = chat(env, "after the restart", session="rs", deadline=60)
    assert second.returncode == 0, second.stderr
    assert second.stdout.endswith(": after the restart\n")
    assert "cannot reach Redis" not in second.stderr

    # the jobs process runs jobs again
    job = Queue(keys.jobs_queue, connection=r).enqueue(ping_job)
    wait_until(
        lambda: job.get_status(refresh=True) == "finished",
        timeout=60,
        message=lambda: f"the ping job to finish; jobs log:\n{jobs.log_text()[-3000:]}",
    )
    assert job.return_value() == "pong"

    assert worker.returncode is None, worker.log_text()[-3000:]
    assert jobs.returncode is None, jobs.log_text()[-3000:]
    assert not worker.events("worker.lease_lost")
    assert worker.stop() == 0
    assert jobs.stop() == 0
    r.close()


def test_worker_answers_a_backlog_once_across_a_restart_with_its_data(
    tmp_path: Path, procs: Procs, model_server: FakeModelServer
) -> None:
    """A persistent Redis (append-only, fsync always) killed while the worker drains a backlog:
    every message answered exactly once, nothing pending."""
    server = PersistentRedis(tmp_path / "predis").start()
    try:
        keys = Keys("bk:")
        env = relaybot_env(
            tmp_path / "home", redis_url=server.url, prefix="bk:", model_url=model_server.base_url,
            RELAYBOT_TURNS_MODE="followup",  # a turn per message, so the kill lands mid-backlog
        )  # fmt: skip
        r = server.client()
        # each turn slow enough that the kill lands mid-backlog
        sent = [send(r, keys, "bk", f"[[delay:0.05]] backlog {i}") for i in range(40)]
        worker = procs.worker(env, r=r, keys=keys)
        wait_until(lambda: model_server.calls >= 5, timeout=30, message="some turns")
        server.kill()
        worker.wait_for_log("redis.unreachable", timeout=30)  # it noticed, mid-backlog
        server.start()
        worker.wait_for_log("redis.reconnected", timeout=30)
        r = server.client()
        wait_until(
            lambda: pending(r, keys) == 0 and len(replies(r, keys, "cli:bk")) >= len(sent),
            timeout=60,
            message=lambda: f"all answered; worker log:\n{worker.log_text()[-3000:]}",
        )
        answers = [reply.answers for reply in replies(r, keys, "cli:bk")]
        assert sorted(answers) == sorted(sent), "each message answered exactly once"
        assert worker.returncode is None
        assert worker.stop() == 0
    finally:
        server.stop()


class PersistentRedis(RedisServer):
    """A RedisServer that keeps its data (append-only, fsync on every write) across a kill."""

    def start(self) -> PersistentRedis:
        from deploy.embedded import redis_binary

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--save", "", "--appendonly", "yes",
                "--appendfsync", "always", "--logfile", str(self.workdir / "redis.log"),
            ],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        client = self.client()
        wait_until(_pings(client), timeout=10, message="redis-server to answer")
        client.close()
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


def _pings(client: redis.Redis):  # type: ignore[no-untyped-def]
    def ping() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    return ping


def test_chat_prints_the_reply_when_the_connection_drops_after_its_xadd(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    real_redis: redis.Redis,
    procs: Procs,
    model_server: FakeModelServer,
) -> None:
    keys = Keys(prefix)
    home = tmp_path / "home"
    worker_env = relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )
    procs.worker(worker_env, r=real_redis, keys=keys)
    with CutProxy(redis_server.port, command=b"XADD") as proxy:
        chat_env = {**worker_env, "REDIS_URL": proxy.url}
        result = chat(chat_env, "accepted, then cut", session="cut", timeout=30, deadline=60)
        assert proxy.cuts == 1  # the XADD ran and its answer was thrown away
    assert result.returncode == 0, result.stderr
    assert "cannot reach Redis" not in result.stderr
    assert result.stdout.endswith(": accepted, then cut\n"), result.stdout
    assert result.stdout.count("accepted, then cut") == 1
    entries = real_redis.xrange(keys.inbound_of("cli"))
    assert len(entries) == 1, "the message was XADDed once"  # type: ignore[arg-type]
    assert model_server.calls == 1


def test_email_gateway_publishes_once_when_the_connection_drops_after_its_xadd(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    real_redis: redis.Redis,
    procs: Procs,
    model_server: FakeModelServer,
    imap: ImapServer,
    smtp: SmtpServer,
) -> None:
    """The gateway's publish (XADD and its seen mark, one MULTI) ran but its answer was lost:
    the gateway waits Redis out (``redis.unreachable``, ``redis.reconnected``), has not moved
    its UID cursor past the mail, fetches it again, finds it published, and the mail is in the
    stream once and answered once."""
    keys = Keys(prefix)
    home = tmp_path / "home"
    write_config(home, email_config(imap, smtp, bot="bot@example.org", owner="owner@example.org"))
    env = relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )
    procs.worker(env, r=real_redis, keys=keys)
    # skipped: the XADDs the gateway's start-up check of its account queues (and discards)
    with CutProxy(redis_server.port, command=b"XADD", skip=checked_xadds("email")) as proxy:
        gw = procs.start("gateway-email", ["gateway", "email"], {**env, "REDIS_URL": proxy.url})
        gw.wait_for_log("email.ready", timeout=20)
        uid = imap.append(make_message(message_id="<cut.1@example.org>", subject="cut"))
        wait_until(
            lambda: [m for m in smtp.messages() if m["In-Reply-To"] == "<cut.1@example.org>"],
            timeout=30,
            message=lambda: f"the reply; gateway log:\n{gw.log_text()[-3000:]}",
        )
        assert proxy.cuts == 1
        gw.wait_for_log("redis.unreachable")
        gw.wait_for_log("redis.reconnected", timeout=20)
        wait_until(lambda: "\\Seen" in imap.flags(uid), message="\\Seen on the answered mail")
        entries = real_redis.xrange(keys.inbound_of("email"))  # type: ignore[arg-type]
        messages = [f for _, f in entries if f[b"kind"] == b"message"]  # not the reply reports
        assert len(messages) == 1
        assert gw.events("email.duplicate")  # found published on the second look
        assert len([m for m in smtp.messages() if m["In-Reply-To"] == "<cut.1@example.org>"]) == 1
        assert gw.returncode is None
        assert gw.stop() == 0


def test_matrix_gateway_publishes_once_when_the_connection_drops_after_its_xadd(
    world: World, redis_server: RedisServer
) -> None:
    """As for e-mail: the sync token is saved only after the batch was published, so the batch
    is synced again after Redis answers; the event, already in the seen set, is not published
    again. One entry, one reply."""
    # skipped: the XADDs the gateway's start-up check of its account queues (and discards)
    with CutProxy(redis_server.port, command=b"XADD", skip=checked_xadds("matrix")) as proxy:
        gw = world.procs.start(
            "gateway-matrix", ["gateway", "matrix"], {**world.env, "REDIS_URL": proxy.url}
        )
        gw.wait_for_log("matrix.backlog_skipped", timeout=20)
        room = world.hs.create_room(world.owner, [world.bot.user_id], direct=True)
        wait_until(lambda: world.joined(room), timeout=15, message="the bot to join the DM")
        asked = world.hs.send_text(world.owner, room, "cut after publishing")
        reply = world.wait_bot_messages(world.owner, room, 1)[0]
        assert reply["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == asked
        assert proxy.cuts == 1
        gw.wait_for_log("redis.unreachable")
        gw.wait_for_log("redis.reconnected", timeout=20)
        gw.wait_for_log("matrix.already_published", event_id=asked)
        entries = world.r.xrange(world.keys.inbound_of("matrix"))
        assert len(entries) == 1  # type: ignore[arg-type]
        assert len(world.bot_messages(world.owner, room)) == 1
        assert gw.returncode is None
        assert gw.stop() == 0


CHAT_ARGS = ("--session", "cw", "--timeout", "60")


def test_chat_waiting_for_its_reply_rides_out_a_redis_restart(
    tmp_path: Path, procs: Procs, model_server: FakeModelServer
) -> None:
    """Redis (persistent) is killed while the worker is on the turn and chat waits for the
    reply; it comes back: chat prints the reply and exits 0."""
    server = PersistentRedis(tmp_path / "predis").start()
    try:
        keys = Keys("cw:")
        env = relaybot_env(
            tmp_path / "home", redis_url=server.url, prefix="cw:", model_url=model_server.base_url
        )
        r = server.client()
        worker = procs.worker(env, r=r, keys=keys)
        waiting = subprocess.Popen(
            [sys.executable, "-m", "relaybot", "chat", "-m", "[[delay:2]] slow one", *CHAT_ARGS],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: model_server.calls >= 1, timeout=30, message="the turn to start")
        server.kill()
        worker.wait_for_log("redis.unreachable", timeout=30)
        server.start()
        out, err = waiting.communicate(timeout=90)
        assert waiting.returncode == 0, err
        assert out.endswith(": [[delay:2]] slow one\n"), out
        assert "cannot reach Redis" not in err
        assert model_server.calls == 1
        assert worker.returncode is None
    finally:
        server.stop()


def test_relaybot_redis_restarts_its_server_and_stops_with_it(tmp_path: Path, procs: Procs) -> None:
    """The Procfile's redis line: a killed redis-server is started again (1 s, then 2 s), with
    the data of its append-only file; SIGTERM stops the line and its server, cleanly."""
    home = tmp_path / "home"
    env = relaybot_env(home)
    line = procs.start("redis", ["redis"], env)
    sock = home / "redis" / "redis.sock"
    client = redis.Redis(unix_socket_path=str(sock))

    def server_pid() -> int | None:
        try:
            return int(client.info("server")["process_id"])
        except (redis.RedisError, FileNotFoundError):
            return None

    first = wait_until(server_pid, timeout=20, message="the embedded Redis to answer")
    client.set("kept", "yes")
    # Redis writes its append-only file before it answers: a kill -9 (not a power cut) keeps it
    seen = [first]
    for delay in (1.0, 2.0):
        psutil.Process(seen[-1]).kill()
        line.wait_for_log("redis.embedded_died", restart_in=delay, timeout=20)
        seen.append(
            wait_until(
                lambda: pid if (pid := server_pid()) not in (None, *seen) else None,
                timeout=30,
                message="a new redis-server",
            )
        )
    assert client.get("kept") == b"yes"
    assert line.returncode is None
    line.signal(signal.SIGTERM)
    assert line.wait(timeout=20) == 0
    assert not psutil.pid_exists(seen[-1]) or psutil.Process(seen[-1]).status() == "zombie"
    assert line.events("redis.embedded_stopped", requested=True)
    assert not sock.exists()
    assert not (home / "redis" / "supervisor.pid").exists()


def test_worker_mid_turn_survives_a_restart_it_did_not_see(
    tmp_path: Path, own_redis: RedisServer, procs: Procs, model_server: FakeModelServer
) -> None:
    """Redis restarts (without its data) while the worker waits for the model, so no command
    of the worker fails: its commit, on a fresh connection, finds the lease gone. The worker
    takes the lease again and goes on (it used to exit 4, and honcho with it)."""
    keys = Keys("mt:")
    env = relaybot_env(
        tmp_path / "home", redis_url=own_redis.url, prefix="mt:", model_url=model_server.base_url
    )
    r = own_redis.client()
    worker = procs.worker(env, r=r, keys=keys)
    send(r, keys, "mt", "[[delay:3]] slow turn")
    wait_until(lambda: model_server.calls >= 1, timeout=30, message="the turn to start")
    kill_and_restart(own_redis)
    worker.wait_for_log("worker.resumed", timeout=30)
    after = chat(env, "after the restart", session="mt", deadline=60)
    assert after.returncode == 0, after.stderr
    assert after.stdout.endswith(": after the restart\n")
    assert worker.returncode is None, worker.log_text()[-3000:]
    assert not worker.events("worker.lease_lost")
    assert worker.stop() == 0
    r.close()


def test_zero_config_chat_waits_for_the_embedded_redis_the_redis_line_restarts(
    tmp_path: Path, procs: Procs, model_server: FakeModelServer
) -> None:
    """While ``relaybot redis`` restarts its server, ``relaybot chat`` waits for it rather than
    start a second server on the same files; then it is answered, and the line's server runs on."""
    home = tmp_path / "home"
    env = relaybot_env(home, model_url=model_server.base_url)
    (home / "redis").mkdir(parents=True)
    stand_in = subprocess.Popen(["sleep", "120"])  # a redis line whose server is restarting
    try:
        (home / "redis" / "supervisor.pid").write_text(f"{stand_in.pid}\n")
        err_path = tmp_path / "chat.err"
        with err_path.open("wb") as err:
            waiting = subprocess.Popen(
                [sys.executable, "-m", "relaybot", "chat", "-m", "hello", "--session", "zc"],
                env=env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        wait_until(
            lambda: "redis.waiting" in err_path.read_text(errors="replace"),
            timeout=30,
            message=lambda: f"chat to wait for the embedded Redis: {err_path.read_text()}",
        )
        line = procs.start("redis", ["redis"], env)
        out, _ = waiting.communicate(timeout=90)
        assert waiting.returncode == 0, err_path.read_text()
        assert out.endswith(": hello\n")
        assert line.returncode is None  # the line's server was not taken over, nor stopped
        client = redis.Redis(unix_socket_path=str(home / "redis" / "redis.sock"))
        assert client.ping()
        client.close()
        assert line.stop() == 0
    finally:
        stand_in.kill()
        stand_in.wait()
