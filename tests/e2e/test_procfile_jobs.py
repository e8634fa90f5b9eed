"""End to end, under ``honcho start``: the ``jobs`` line stops as honcho asks (issue 26).

- Ctrl-C on ``honcho start`` (SIGINT to its process group: honcho, and the ``redis`` line stopping
  at the same time): jobs, busy or idle, stops at once without waiting for Redis, exit 0, quiet
  (no rq "could not connect" line, no SIGKILL from honcho); a job it was running is abandoned (its
  work-horse killed, no orphan) and the next ``honcho start`` runs it again.
- A password set on an external Redis under ``honcho start jobs`` (connections dropped): one line,
  exit 2, no orphaned work-horse, and honcho ends without SIGKILLs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
import redis
from rq import Queue

from contract.keys import Keys
from tests.e2e.test_procfile import BIN, REPO, App, base_env
from tests.support.jobs import slow_job
from tests.support.procs import wait_until
from tests.support.servers import RedisServer

pytestmark = pytest.mark.e2e


class Lines(App):
    """honcho running some of the Procfile's lines."""

    def start_lines(self, *names: str) -> None:
        with self.output.open("wb") as out:
            self.honcho = subprocess.Popen(
                [BIN / "honcho", "start", "-f", REPO / "Procfile", "-d", self.dir, *names],
                cwd=self.dir,
                env=base_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_for(self, pattern: str, timeout: float = 60) -> None:
        assert self.honcho is not None
        wait_until(
            lambda: re.search(pattern, self.log(), re.M),
            timeout=timeout,
            message=lambda: f"{pattern!r} in honcho's output:\n{self.log()}",
        )

    def ended(self, timeout: float = 30) -> int:
        """honcho's exit code once it ends by itself (a generous deadline: it gives 5 s)."""
        assert self.honcho is not None
        try:
            return self.honcho.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.honcho.pid, signal.SIGKILL)
            self.honcho.wait()
            raise AssertionError(f"honcho did not end:\n{self.log()}") from None


def horse(marker: Path) -> psutil.Process:
    """The work-horse running the slow job (its pid, written by the job)."""
    wait_until(marker.exists, timeout=60, message="the slow job to start")  # tests/ importable:
    # PYTHONPATH in .env
    return psutil.Process(int(marker.read_text(encoding="utf-8")))


def assert_quiet_stop(log: str, rc: int, *, allowed: str = r"\bheartbeat\.failed\b") -> None:
    """Stopped with ``rc``, by itself, with no rq line and no error line. The heartbeat's own
    thread (contract/liveness.py) may have said once that its beat failed: Redis stopped first."""
    assert "SIGKILL" not in log, log
    assert re.search(rf"^\S+ system\s+\| jobs\.1 stopped \(rc={rc}\)", log, re.M), log
    assert "could not connect" not in log, log
    assert "Traceback" not in log and "unhandled exception" not in log, log
    jobs_lines = [line for line in log.splitlines() if re.match(r"^\S+ jobs\.1 ", line)]
    loud = [line for line in jobs_lines if re.search(r"\[(error|warning)", line)]
    assert not [line for line in loud if not re.search(allowed, line)], log


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "idle"])
def test_ctrl_c_on_honcho_stops_jobs_at_once_and_its_job_runs_again(
    tmp_path: Path, busy: bool
) -> None:
    home = tmp_path / "home"
    app = Lines(tmp_path, {"RELAYBOT_HOME": str(home), "PYTHONPATH": str(REPO)})
    marker = tmp_path / "slow"
    app.start_lines("redis", "jobs")
    try:
        app.wait_for(r"^\S+ jobs\.1 +\| \[info\s*\] jobs\.started\b")
        r = redis.Redis(unix_socket_path=str(home / "redis" / "redis.sock"))
        job = None
        children: list[psutil.Process] = []
        if busy:
            job = Queue(Keys().jobs_queue, connection=r).enqueue(
                slow_job, str(marker), job_timeout=900
            )
            children = [horse(marker)]
        children += app.processes()
        assert app.honcho is not None
        os.killpg(app.honcho.pid, signal.SIGINT)  # Ctrl-C in honcho's terminal
        app.ended()  # honcho's own exit code says little: the processes' are below
        _gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, (alive, app.log())  # no orphaned work-horse, no process left
        assert_quiet_stop(app.log(), 0)
        r.close()
        if not busy:
            return
        # the next start puts the interrupted job back, and runs it
        app.start_lines("redis", "jobs")
        wait_until(
            (tmp_path / "slow.done").exists,
            timeout=60,
            message=lambda: f"the interrupted job to run again:\n{app.log()}",
        )
        assert "jobs.requeued_abandoned" in app.log(), app.log()
        assert job is not None
        r = redis.Redis(unix_socket_path=str(home / "redis" / "redis.sock"))
        assert Queue(Keys().jobs_queue, connection=r).fetch_job(job.id) is not None
        r.close()
        app.stop()
    finally:
        app.stop()


def test_a_password_set_under_honcho_ends_jobs_in_one_line_with_no_orphan(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    root = server.client()
    app = Lines(
        tmp_path,
        {"RELAYBOT_HOME": str(tmp_path / "home"), "REDIS_URL": server.url, "PYTHONPATH": str(REPO)},
    )
    marker = tmp_path / "slow"
    app.start_lines("jobs")
    try:
        app.wait_for(r"^\S+ jobs\.1 +\| \[info\s*\] jobs\.started\b")
        Queue(Keys().jobs_queue, connection=root).enqueue(slow_job, str(marker), job_timeout=900)
        work_horse = horse(marker)
        children = [work_horse, *app.processes()]
        root.config_set("requirepass", "rotated")
        for kind in ("normal", "pubsub"):  # every connection logs in again
            root.execute_command("CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes")
        app.ended()
        _gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, (alive, app.log())
        log = app.log()
        assert_quiet_stop(log, 2)
        said = [line for line in log.splitlines() if re.match(r"^\S+ jobs\.1 +\| relaybot: ", line)]
        assert len(said) == 1, log
    finally:
        app.stop()
        root.close()
        server.stop()
