"""The README, walked through (issue 13): every command of its ``sh`` blocks, in order, verbatim,
in a fresh directory laid out as a clone, as a new user with a fresh home directory.

Commands written ``relaybot …`` run as the README says they do, with the clone's venv on PATH
(activated); commands written ``.venv/bin/…`` run with a PATH that lacks it (nothing activated).
``honcho start`` runs in the background (terminal 1) until the walk ends; the interactive
``relaybot chat`` is fed a line and Ctrl-D. Every command must exit 0 without a traceback;
redis-cli (which exits 0 on an error reply) must answer no error.

What cannot run here is listed below, each with its reason: a command the README gains that is
neither run nor listed fails this test, so a new recipe is either shown to work or said why not.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent  # the venv the tests run in

# parts of a `&&` chain that the fixture provides instead of running them
PROVIDED = {
    "python3 -m venv .venv": "the clone's .venv is the venv these tests run in (linked): "
    "creating and installing one takes minutes; .ci/run does exactly this on every CI run",
    ".venv/bin/pip install -q -c constraints.txt -e .": "as above: installed already",
}
# whole commands that are not run here, and why
BY_DESIGN = {
    ".venv/bin/python -m pytest": "the test suite itself, this test included; .ci/run runs "
    "this line verbatim",
    ".venv/bin/ruff check .": "the repository's own checks, run on the repository by "
    "tests/unit/test_quality.py (ruff, mypy) and tests/unit/test_architecture.py (lint-imports)",
}
REDIS_ERROR = re.compile(r"^(\(error\) )?(ERR|NOGROUP|WRONGTYPE|NOPERM|NOAUTH|NOSCRIPT)\b", re.M)
NO_MODEL = "No model is configured"
# the squidbot history.jsonl the README's import example reads (a reader has their own)
HISTORY = (
    '{"role": "user", "content": "book the dentist", "timestamp": "2025-03-01T10:00:00+00:00", '
    '"channel": "telegram", "sender_id": "12345"}\n'
    '{"role": "assistant", "content": "booked", "timestamp": "2025-03-01T10:00:05+00:00", '
    '"channel": "telegram", "sender_id": "12345"}\n'
)


@dataclass(frozen=True)
class Command:
    line: int  # in README.md
    text: str


def readme_commands(readme: str) -> list[Command]:
    """The commands of the README's ``sh`` blocks (a line ending in ``\\`` goes on)."""
    commands: list[Command] = []
    fence: str | None = None
    pending, start = "", 0
    for number, raw in enumerate(readme.splitlines(), 1):
        line = raw.strip()
        if fence is None:
            if line.startswith("```"):
                fence = line[3:].strip()
            continue
        if line.startswith("```"):
            fence = None
            continue
        if fence != "sh" or (not line and not pending):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        commands.append(Command(start, pending + line))
        pending = ""
    return commands


def without_comment(command: str) -> str:
    return re.sub(r"\s+#.*$", "", command).strip()


class Walk:
    def __init__(self, root: Path) -> None:
        self.clone = root / "clone"
        self.clone.mkdir()
        for name in ("README.md", "Procfile", "constraints.txt", "pyproject.toml"):
            shutil.copy(REPO / name, self.clone / name)
        (self.clone / ".venv").symlink_to(VENV, target_is_directory=True)
        self.user_home = root / "userhome"
        self.user_home.mkdir()
        self.bare = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.user_home),
            "USER": "ada",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        self.activated = {
            **self.bare,
            "PATH": f"{self.clone / '.venv' / 'bin'}:{self.bare['PATH']}",
            "VIRTUAL_ENV": str(self.clone / ".venv"),
        }
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.started: list[str] = []
        self.done: list[str] = []

    def env_for(self, command: str) -> dict[str, str]:
        return self.activated if command.startswith("relaybot ") else self.bare

    def run(self, command: str, *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            cwd=self.clone, env=self.env_for(command), input=stdin or "",
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, f"{command}\n{done.stderr}"
        self.done.append(command)
        return done

    def start(self, command: str) -> None:
        """A long-running command (``honcho start``, terminal 1): up until the walk ends."""
        out = self.clone.parent / f"background-{len(self.done)}.out"
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", f"exec {command}"],
                cwd=self.clone, env=self.env_for(command), stdin=subprocess.DEVNULL,
                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.background.append((proc, out))
        self.started.append(command)
        self.wait_for_worker(proc, out)
        self.done.append(command)

    def wait_for_worker(self, proc: subprocess.Popen[bytes], out: Path) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, out.read_text(errors="replace")
            status = subprocess.run(
                [".venv/bin/relaybot", "status"],
                cwd=self.clone, env=self.bare, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if status.returncode == 0 and re.search(
                r"^  worker: [\d.]+ s ago", status.stdout, re.M
            ):
                return
            time.sleep(0.3)
        raise AssertionError(f"no worker within 60 s:\n{out.read_text(errors='replace')}")

    def settle(self, session: str) -> None:
        """Wait, as a person typing the next command would, until the worker has answered an
        entry XADDed by hand (its reply waits on the session's queue)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = subprocess.run(
                [".venv/bin/relaybot", "redis-cli", "LLEN", f"relaybot:reply:{session}"],
                cwd=self.clone, env=self.bare, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode == 0 and done.stdout.strip() not in ("", "0"):
                return
            time.sleep(0.2)
        raise AssertionError(f"no reply for {session} within 30 s")

    def pause(self) -> list[str]:
        """Stop the long-running commands (Ctrl-C on them); returns them, to start again."""
        commands = list(self.started)
        self.stop()
        self.background.clear()
        self.started.clear()
        return commands

    def stop(self) -> None:
        for proc, out in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            log = out.read_text(errors="replace")
            assert "Traceback" not in log and "not found" not in log, log


def step(walk: Walk, command: Command, skipped: dict[str, str]) -> None:
    """Run one README command as its kind asks, or say why not (in ``skipped``)."""
    text = without_comment(command.text)
    reason = next((why for key, why in BY_DESIGN.items() if key in text), None)
    if reason is not None:
        skipped[text] = reason
        return
    parts = [p.strip() for p in text.split(" && ")]
    kept = [p for p in parts if p not in PROVIDED]
    skipped.update({p: PROVIDED[p] for p in parts if p in PROVIDED})
    if not kept:
        return
    # verbatim, comment and all, unless the fixture provided a part of it
    run = " && ".join(kept) if kept != parts else command.text
    bare = without_comment(run)
    if bare.endswith("honcho start"):  # terminal 1
        walk.start(run)
    elif bare.endswith("relaybot chat"):  # interactive: a line, then Ctrl-D
        done = walk.run(run, stdin="hello\n")
        assert NO_MODEL in done.stdout, done.stdout  # zero-config, and no model yet
    elif "relaybot chat" in bare and "prints both replies" in command.text:
        done = walk.run(run)
        assert done.stdout.count(NO_MODEL) == 2, done.stdout
    elif bare.startswith("relaybot restore "):  # the README: once the worker is stopped
        refused = subprocess.run(
            ["/bin/sh", "-c", run], cwd=walk.clone, env=walk.env_for(run),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert refused.returncode != 0 and "holds the worker lease" in refused.stderr, refused
        started = walk.pause()  # Ctrl-C on honcho start
        done = walk.run(run)
        assert "restored " in done.stdout, done.stdout
        for again in started:
            walk.start(again)
    elif "memory import history.jsonl" in bare:  # the reader's own squidbot history
        (walk.clone / "history.jsonl").write_text(HISTORY, encoding="utf-8")
        done = walk.run(run)
        assert "telegram / 12345 -> owner (by --map)" in done.stdout + done.stderr, done
    else:
        done = walk.run(run)
        if bare.startswith("relaybot redis-cli "):
            assert not REDIS_ERROR.search(done.stdout), f"{run}\n{done.stdout}"
            if "--scan" in bare:
                keys = done.stdout.split()
                assert all(k.startswith(("relaybot:reply:", "relaybot:inflight:")) for k in keys)
            if " XADD " in bare and (session := re.search(r" session (\S+)", bare)):
                walk.settle(session.group(1))


def test_every_readme_command_works_verbatim(tmp_path: Path) -> None:
    commands = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert any("honcho start" in c.text for c in commands)  # the walk covers the quickstart
    walk = Walk(tmp_path)
    skipped: dict[str, str] = {}
    try:
        for command in commands:
            step(walk, command, skipped)
    finally:
        walk.stop()
    # every reason given is for a command the README has, and everything else ran
    assert set(BY_DESIGN) <= {k for s in skipped for k in BY_DESIGN if k in s}, skipped
    assert set(PROVIDED) <= set(skipped), skipped
    assert any("relaybot redis-cli --scan --pattern" in c for c in walk.done), walk.done
    assert len(walk.done) + len(skipped) >= len(commands)
    assert not (walk.user_home / ".relaybot" / "redis" / "redis.sock").exists()
