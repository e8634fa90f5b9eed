"""A config.toml that cannot be read or does not load (issue 26), against a real Redis, a real
worker, jobs process and gateway: every running process keeps its last good configuration and
says why in one log line naming the file and the fix; a new command says it in one line and
exits 2; doctor reports it as a failed check with the fix; the summary jobs run with the last
good configuration instead of failing into rq's failed registry.

Root reads any file: the "root-owned after a sudo edit" case runs the command with the
capabilities that let root ignore file permissions dropped (``setpriv``), so the kernel really
refuses the read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.registry import FailedJobRegistry

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    heartbeat,
    memory_rows,
    relaybot_env,
    run_relaybot,
    send,
    wait_for_replies,
    wait_until,
    write_config,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

BASE = '[owner]\nname = "Ada"\n'
DERIVE = "\n[derive]\njudge_after = 0.5\nquiet = 60\ncheck_every = 0.2\nmin_rows = 2\n"


def one_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def test_a_config_that_turns_into_a_directory_stops_nothing(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    procs: Procs,
    model_server: FakeModelServer,
) -> None:
    home = tmp_path / "home"
    path = write_config(home, BASE)
    env = relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )
    keys = Keys(prefix)
    worker = procs.worker(env, r=real_redis, keys=keys)
    jobs = procs.jobs(env)
    gateway = procs.start("gateway", ["gateway", "email"], env)  # idle: not configured
    gateway.wait_for_log("email.not_configured")
    wait_until(lambda: heartbeat(real_redis, keys, "jobs"), message=lambda: "the jobs' beat")
    digest = heartbeat(real_redis, keys, "worker")["config"]  # type: ignore[index]

    path.unlink()
    path.mkdir()  # an editor, a bad copy, a volume mounted in the wrong place
    fix = f"{path} is a directory, not a file: move it away (mv {path} {path}.d)"
    for proc in (worker, jobs, gateway):
        said = proc.wait_for_log("config.unreadable")
        assert said["error"].startswith(fix), said
    send(real_redis, keys, "still", "are you still there?")
    [reply] = wait_for_replies(real_redis, keys, "cli:still", 1)
    assert "are you still there?" in reply.text
    assert worker.returncode is None and jobs.returncode is None and gateway.returncode is None
    beat = wait_until(
        lambda: b if "config_error" in (b := heartbeat(real_redis, keys, "worker") or {}) else None,
        message=lambda: "the worker's beat to carry the reason",
    )
    assert beat["config"] == digest  # still the bytes it runs with
    assert beat["config_error"].startswith(fix)

    # a new command: one line, exit 2; doctor: a failed check with the fix
    for args in (["chat", "-m", "hello"], ["status"], ["memory", "search", "x"]):
        result = run_relaybot(args, env)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert one_line(result.stderr).startswith(f"relaybot: configuration error: {fix}")
    doctor = run_relaybot(["doctor", "--json", "--timeout", "2"], env)
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr
    checks = {c["id"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["config.file"]["verdict"] == "fail"
    assert checks["config.file"]["summary"] == f"{path} is a directory, not a file"
    assert f"mv {path} {path}.d" in checks["config.file"]["hint"]
    # the processes: running with their last good config, not "restart it" (that would fail)
    worker_check = checks["processes.worker"]
    assert worker_check["verdict"] == "warn", worker_check
    assert (
        f"config {digest} (its last good config; config.toml does not load: "
        in (worker_check["summary"])
    )
    assert "refuse to start" in worker_check["hint"]

    # put back: taken again by the processes, which never stopped
    path.rmdir()
    write_config(home, BASE.replace("Ada", "Grace"))
    worker.wait_for_log("config.reloaded", keys=["owner.name"])
    assert run_relaybot(["status"], env).returncode == 0


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None, reason="needs setpriv as root"
)
def test_a_config_root_took_over_is_refused_in_one_line_with_the_fix(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = write_config(home, BASE)
    path.chmod(0)  # what `sudo cp` / a root editor leaves for a user who cannot read it
    env = relaybot_env(home)
    # as root, drop what lets root read any file: the kernel refuses the read as for a user
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if os.geteuid() != 0:
        prefix = []
    for args in (["chat", "-m", "hello"], ["worker"], ["doctor", "--timeout", "1"]):
        result = subprocess.run(
            [*prefix, sys.executable, "-m", "relaybot", *args],
            env=env, capture_output=True, text=True, timeout=60, check=False,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
        if args[0] == "doctor":
            assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
            assert f"FAIL  config.file       {path} cannot be read by" in result.stdout
            assert "permission denied; it is owned by" in result.stdout
            assert "sudo chown" in result.stdout
            continue
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        line = one_line(result.stderr)
        assert line.startswith(f"relaybot: configuration error: {path} cannot be read by "), line
        assert "(permission denied; it is owned by " in line and "mode 0000)" in line
        assert f"&& sudo chmod 600 {path}" in line
    assert not (home / "redis").exists()  # nothing was started


def test_summary_jobs_run_with_the_last_good_config_when_the_file_goes_bad(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    procs: Procs,
    model_server: FakeModelServer,
) -> None:
    home = tmp_path / "home"
    path = write_config(home, BASE + DERIVE)
    env = relaybot_env(home, redis_url=redis_server.url, prefix=prefix,
                       model_url=model_server.base_url, RELAYBOT_TURNS_MODE="followup")  # fmt: skip
    keys = Keys(prefix)
    worker = procs.worker(env, r=real_redis, keys=keys)
    jobs = procs.jobs(env)
    wait_until(lambda: heartbeat(real_redis, keys, "jobs"), message=lambda: "the jobs' beat")
    # a bad edit while they run: each keeps what it has; each job used to fail on it
    path.write_text(BASE + DERIVE + "\n[worker]\nbatchh = 5\n", encoding="utf-8")
    jobs.wait_for_log("config.rejected")
    worker.wait_for_log("config.rejected")
    send(real_redis, keys, "sum", "the boat leaves at nine")
    send(real_redis, keys, "sum", "bring the blue tent")
    wait_for_replies(real_redis, keys, "cli:sum", 2)
    db = home / "memory.sqlite3"
    made = wait_until(
        lambda: memory_rows(db, "SELECT * FROM summary"),
        timeout=30,
        message=lambda: f"a summary; jobs:\n{jobs.log_text()[-3000:]}",
    )
    assert made[0]["method"] == "model"
    assert "the boat leaves at nine" in made[0]["text"]
    used = jobs.wait_for_log("summary.last_good_config")
    assert "unknown key 'batchh' in [worker]: did you mean 'batch'?" in used["error"]
    failed = FailedJobRegistry(queue=Queue(keys.jobs_queue, connection=real_redis))
    assert failed.get_job_ids() == []


def test_an_unknown_key_is_one_line_naming_key_section_and_file_from_every_command(
    tmp_path: Path,
) -> None:
    """What ``relaybot chat`` said was pydantic's "worker.batchh: Extra inputs are not
    permitted"; every command that loads the configuration says the same one line, and doctor
    reports the key as a failed check (nothing is started: the config is read first)."""
    home = tmp_path / "home"
    path = write_config(home, BASE + "\n[worker]\nbatchh = 5\n\n[delivery]\nzzz = 1\n")
    env = relaybot_env(home)
    said = (
        f"relaybot: configuration error: {path}: unknown key 'batchh' in [worker]: did you "
        "mean 'batch'? (fix or remove it); unknown key 'zzz' in [delivery]: the keys of "
        "[delivery] are max_age, retry_min, retry_max (fix or remove it)"
    )
    for args in (
        ["chat", "-m", "hello"],
        ["chat"],
        ["worker"],
        ["jobs"],
        ["gateway", "email"],
        ["status"],
        ["memory", "search", "boat"],
        ["memory", "status"],
        ["entities", "list"],
    ):
        result = run_relaybot(args, env, stdin="")
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert one_line(result.stderr) == said, args
    doctor = run_relaybot(["doctor", "--json", "--timeout", "1"], env)
    checks = {c["id"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["config.keys"]["verdict"] == "fail"
    assert "worker.batchh (did you mean worker.batch?)" in checks["config.keys"]["summary"]
    assert not (home / "redis").exists()
