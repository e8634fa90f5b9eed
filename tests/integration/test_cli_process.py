"""The ``relaybot`` command as a process (issue 13): ``--version``; a pipe closed early ends a
command quietly; ``.env`` in the current directory is read the way honcho reads it; what it creates
under RELAYBOT_HOME is private (0600/0700); the README's ``redis-cli --scan`` recipe."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from gateways.cli.gateway import normalize
from memory.store import MemoryStore
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import REPO, relaybot_env, run_relaybot
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


def test_version(home: Path) -> None:
    done = run_relaybot(["--version"], relaybot_env(home))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("relaybot ") and done.stdout.split()[1][0].isdigit()


def fill_memory(home: Path, rows: int) -> None:
    """A memory database with ``rows`` messages, written as the worker would."""
    home.mkdir(parents=True, exist_ok=True)
    with MemoryStore(home / "memory.sqlite3") as store:
        with store.transaction():
            for n in range(rows):
                msg = normalize("pipe", f"the blue door number {n} " + "x" * 4000)
                store.append_inbound(msg, f"cli:{n + 1}-0", is_owner=True)
        store.sync_index()


@pytest.mark.parametrize(
    "args",
    [
        ["memory", "export"],
        ["memory", "search", "blue", "door", "--limit", "50"],
        ["memory", "search", "door", "--json", "--limit", "50"],
    ],
)
def test_a_pipe_closed_early_ends_the_command_quietly(home: Path, args: list[str]) -> None:
    """``relaybot memory export | head -1``: no traceback, no "Broken pipe", the exit status
    of a command that SIGPIPE ended (141), as ``cat`` would."""
    fill_memory(home, 3000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaybot", *args],
        env=relaybot_env(home),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    assert first, proc.stderr.read()
    proc.stdout.close()  # head has what it wanted
    err = proc.stderr.read().decode(errors="replace")
    code = proc.wait(timeout=60)
    # 141 when the command was still writing; a bounded output (a text search) may fit in the
    # pipe's buffer and be written whole before the reader closes it: then 0, as cat's would
    assert code == 141 or (code == 0 and args[1] == "search"), (code, err)
    assert "Traceback" not in err and "Broken pipe" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize(
    "args", [["--help"], ["--version"], ["memory", "--help"], ["memory", "search", "--help"]]
)
def test_help_and_version_into_a_closed_pipe_end_quietly(home: Path, args: list[str]) -> None:
    """``relaybot --help | (exec 0<&-; true)``: the reader is gone before a word is written;
    no "Exception ignored ... BrokenPipeError", status 141 as for every other command."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "relaybot", *args],
            env=relaybot_env(home), cwd=REPO, stdin=subprocess.DEVNULL, stdout=writer,
            stderr=subprocess.PIPE, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(writer)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 141, err
    assert err == "", err


def test_zero_config_chat_under_a_home_with_url_characters(tmp_path: Path) -> None:
    """A RELAYBOT_HOME with %, ? and # in its name: the embedded Redis's socket is found (its
    unix:// URL is percent-encoded), the chat answers."""
    home = tmp_path / "h%41?x=1#y"
    with FakeModelServer() as model:
        env = relaybot_env(home, model_url=model.base_url)
        done = run_relaybot(["chat", "-m", "hello", "--session", "odd"], env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "echo: " in done.stdout and "hello" in done.stdout
    assert (home / "memory.sqlite3").exists()


def test_the_whole_output_through_a_pipe_is_unchanged(home: Path) -> None:
    fill_memory(home, 50)
    done = run_relaybot(["memory", "search", "door", "--limit", "50"], relaybot_env(home))
    assert done.returncode == 0, done.stderr
    assert "\n50. [cli / owner]" in done.stdout and done.stdout.endswith("\n")


def test_dotenv_in_the_current_directory_is_read_and_wins_as_for_honcho(
    tmp_path: Path, home: Path, redis_server: RedisServer, real_redis: redis.Redis, prefix: str
) -> None:
    """``relaybot status`` in a directory whose .env names a Redis and a prefix (as for
    ``honcho start``) reports that Redis; the file wins over a variable the shell has, as it
    does for honcho's processes (and says so)."""
    app = tmp_path / "app"
    app.mkdir()
    (app / ".env").write_text(
        f"RELAYBOT_HOME={home}\nREDIS_URL={redis_server.url}\nRELAYBOT_REDIS_PREFIX={prefix}\n",
        encoding="utf-8",
    )
    real_redis.xadd(Keys(prefix).inbound_of("cli"), {"v": "1"})
    env = relaybot_env(tmp_path / "elsewhere")  # the shell: its own home, no Redis
    del env["RELAYBOT_HOME"], env["RELAYBOT_DOTENV"]  # a user's shell: reads ./.env
    done = run_relaybot(["status"], env, cwd=app)
    assert done.returncode == 0, done.stderr
    assert f"{prefix}inbound:cli: 1" in done.stdout, done.stdout
    assert not (tmp_path / "userhome" / ".relaybot").exists()  # no zero-config home of its own

    other = f"{prefix}other:"
    real_redis.xadd(Keys(other).inbound_of("cli"), {"v": "1"})
    real_redis.xadd(Keys(other).inbound_of("cli"), {"v": "1"})
    done = run_relaybot(["status"], {**env, "RELAYBOT_REDIS_PREFIX": other}, cwd=app)
    assert done.returncode == 0, done.stderr
    assert f"{prefix}inbound:cli: 1" in done.stdout, done.stdout  # honcho's processes' prefix
    assert "sets RELAYBOT_REDIS_PREFIX, over the value this shell has" in done.stderr


def modes(root: Path) -> dict[str, int]:
    found = {}
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and not stat.S_ISSOCK(st.st_mode):
            found[str(path.relative_to(root))] = stat.S_IMODE(st.st_mode)
    return found


def test_what_relaybot_creates_under_its_home_is_the_owners_alone(home: Path) -> None:
    """A zero-config chat (embedded Redis, worker, memory, logs) under a umask of 022: every
    file 0600, every directory 0700; then the README's ``redis-cli --scan`` recipe, with
    nothing running (the embedded Redis is started for it and stopped)."""
    os.chmod(home, 0o755)
    old = os.umask(0o022)  # a usual shell's
    try:
        with FakeModelServer() as model:
            env = relaybot_env(home, model_url=model.base_url)
            done = run_relaybot(["chat", "-m", "hello", "--session", "perm"], env, timeout=60)
        assert done.returncode == 0, done.stderr
        found = modes(home)
        assert "memory.sqlite3" in found and "redis" in found and "logs/worker.log" in found
        assert any(name.startswith("redis/appendonly") for name in found), found
        loose = {name: f"{m:04o}" for name, m in found.items() if m & 0o077}
        assert loose == {}, loose
        for name, m in found.items():
            is_dir = (home / name).is_dir() if name != "." else True
            assert m == (0o700 if is_dir else 0o600), (name, f"{m:04o}")

        push = run_relaybot(["redis-cli", "RPUSH", "relaybot:reply:cli:waiting", "{}"], env)
        assert push.returncode == 0, push.stderr
        scan = run_relaybot(["redis-cli", "--scan", "--pattern", "relaybot:reply:*"], env)
        assert scan.returncode == 0, scan.stderr
        assert scan.stdout.split() == ["relaybot:reply:cli:waiting"], scan.stdout
        xlen = run_relaybot(["redis-cli", "XLEN", "relaybot:inbound:cli"], env)
        assert (xlen.returncode, xlen.stdout.strip()) == (0, "1"), xlen.stderr
        assert not (home / "redis" / "redis.sock").exists()  # stopped again
    finally:
        os.umask(old)
