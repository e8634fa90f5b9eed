"""``honcho start`` exactly as the README writes it (issue 13): ``.venv/bin/honcho start`` in a
clone, nothing activated (PATH without the venv), settings in ``.env``; then, in a "second
terminal" of the same directory with the same bare environment, ``.venv/bin/relaybot status``
and ``.venv/bin/relaybot chat -m`` find honcho's home, Redis and worker through ``.env``.

Before: every Procfile line failed with ``exec: relaybot: not found``, and the chat started a
Redis and a worker of its own under ``~/.relaybot``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakemodel import FakeModelServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent  # the venv the tests run in (not resolved: a venv)


def bare_env(user_home: Path) -> dict[str, str]:
    """A new user's shell: no venv on PATH, none of the developer's settings."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(user_home),
        "USER": os.environ.get("USER", "tester"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }


def make_clone(root: Path, dotenv: dict[str, str]) -> Path:
    """What a clone set up by the README's quickstart has for this: its Procfile, its .venv (the
    test's own venv, linked: installing one takes a minute) and the .env the user wrote."""
    clone = root / "clone"
    clone.mkdir()
    shutil.copy(REPO / "Procfile", clone / "Procfile")
    (clone / ".venv").symlink_to(VENV, target_is_directory=True)
    (clone / ".env").write_text("".join(f"{k}={v}\n" for k, v in dotenv.items()), "utf-8")
    return clone


def run(clone: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [".venv/bin/relaybot", *args],
        cwd=clone, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def wait_for_beats(
    clone: Path, env: dict[str, str], honcho: subprocess.Popen[bytes], out: Path
) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    status: Any = None
    while time.monotonic() < deadline:
        assert honcho.poll() is None, f"honcho exited:\n{out.read_text(errors='replace')}"
        done = run(clone, env, "status", "--json")
        if done.returncode == 0:
            status = json.loads(done.stdout)
            beats = status["heartbeats"]
            if all(n in beats and not beats[n]["stale"] for n in ("worker", "jobs")):
                return dict(status)
        time.sleep(0.3)
    raise AssertionError(f"no heartbeats: {status}\n{out.read_text(errors='replace')}")


def test_honcho_start_as_the_readme_writes_it(tmp_path: Path) -> None:
    home, user_home = tmp_path / "relaybot-home", tmp_path / "userhome"
    user_home.mkdir()
    env = bare_env(user_home)
    assert shutil.which("relaybot", path=env["PATH"]) is None  # nothing activated
    with FakeModelServer() as model:
        clone = make_clone(
            tmp_path,
            {
                "RELAYBOT_HOME": str(home),
                "OPENAI_BASE_URL": model.base_url,
                "RELAYBOT_MODEL": "fake-model",
            },
        )
        out = tmp_path / "honcho.out"
        with out.open("wb") as sink:
            honcho = subprocess.Popen(
                [".venv/bin/honcho", "start"],  # terminal 1, verbatim
                cwd=clone, env=env, stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            status = wait_for_beats(clone, env, honcho, out)
            assert status["worker_lease"] is not None

            done = run(clone, env, "chat", "-m", "hello there", "--session", "readme")  # terminal 2
            assert done.returncode == 0, done.stderr + out.read_text(errors="replace")
            assert re.fullmatch(r"echo: \[cli / owner\] .*: hello there\n", done.stdout)
            assert model.calls == 1
        finally:
            os.killpg(honcho.pid, signal.SIGTERM)
            try:
                honcho.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(honcho.pid, signal.SIGKILL)
                honcho.wait()
    log = out.read_text(errors="replace")
    assert "not found" not in log, log
    for line in ("redis", "worker", "jobs", "matrix", "email"):
        assert re.search(rf"^\S+ {line}\.1 +\| ", log, re.M), log  # each line ran and spoke
    # the chat used honcho's home, Redis and worker: it started none of its own
    assert (home / "memory.sqlite3").exists()
    assert not (home / "logs" / "worker.log").exists()
    assert not (user_home / ".relaybot").exists()
