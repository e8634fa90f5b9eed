"""A zero-config chat's worker, started as soon as the chat has read its arguments (start-up).

A zero-config ``relaybot chat`` starts its worker (relaybot/runtime.py), and that worker then
starts Python, imports, reads the configuration and starts the embedded Redis: about as long as
the chat itself took to get there, and the chat waits for it. When the signs are plain, the
chat starts that worker before its own imports instead, and the two start side by side (two
cores); the chat's :class:`~relaybot.runtime.Runtime` then takes it (:func:`take`) as the worker
it would have started. The signs, read without importing anything heavy: no Redis URL in the
environment (``REDIS_URL``, ``RELAYBOT_REDIS_URL``, ``RELAYBOT_REDIS__URL``: ``.env`` is read
by then) nor in config.toml (which must parse), and nothing of an embedded Redis for this home
yet (its socket, the pid file of a ``relaybot redis`` line). Otherwise nothing is started early
and the chat goes on as before.

A worker started early whose chat then does not use it (a bad configuration, a bad session name)
sees its chat end and stops, as one whose chat was killed while it started (relaybot/zeroconf.py).
The process token (:func:`token`) that tells the worker which chat started it lives here, so
that this module imports nothing but the standard library.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

ZEROCONF = "RELAYBOT_ZEROCONF"  # set for the worker a zero-config chat starts: that chat's token
# contract/config.py's overrides of [redis] url, and contract/config_env.py's one rule
REDIS_URL_VARS = ("REDIS_URL", "RELAYBOT_REDIS_URL", "RELAYBOT_REDIS__URL")

_started: dict[Path, subprocess.Popen[bytes]] = {}  # home -> the worker started for it


def token(pid: int | None = None) -> str:
    """A process as ``pid:start`` (its start time since boot, from /proc, so that a pid used
    again by another process is not the same token); ``pid`` alone without /proc."""
    pid = os.getpid() if pid is None else pid
    start = start_time(pid)
    return f"{pid}:{start}" if start else str(pid)


def start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""  # field 22 of stat, counted after the name


def home_of(env: Mapping[str, str]) -> Path:
    """RELAYBOT_HOME as contract.config.default_home reads it."""
    return Path(env.get("RELAYBOT_HOME") or "~/.relaybot").expanduser().resolve()


def plainly_zero_config(home: Path, env: Mapping[str, str]) -> bool:
    """No Redis URL anywhere and no embedded Redis for ``home`` yet (see the module docstring);
    False whenever that is not certain."""
    if any(env.get(var) for var in REDIS_URL_VARS):
        return False
    try:
        config = tomllib.loads((home / "config.toml").read_text(encoding="utf-8"))
    except FileNotFoundError:
        config = {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False  # the chat says what is wrong with it
    section = config.get("redis", {})
    if not isinstance(section, dict) or section.get("url"):
        return False
    redis_dir = home / "redis"  # contract.config.Config.redis_dir
    return not any((redis_dir / name).exists() for name in ("redis.sock", "supervisor.pid"))


def spawn_worker(home: Path) -> subprocess.Popen[bytes]:
    """``relaybot worker`` as the zero-config worker of this chat, logging to
    ``home/logs/worker.log``."""
    log_dir = home / "logs"  # contract.config.Config.log_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, RELAYBOT_HOME=str(home))
    env[ZEROCONF] = token()
    with (log_dir / "worker.log").open("ab") as logfile:
        return subprocess.Popen(
            [sys.executable, "-m", "relaybot", "worker"],
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def start(env: Mapping[str, str] | None = None) -> None:
    """Start the worker now when the signs are plain (``relaybot chat``, its arguments read)."""
    env = os.environ if env is None else env
    home = home_of(env)
    if home not in _started and plainly_zero_config(home, env):
        _started[home] = spawn_worker(home)


def take(home: Path) -> subprocess.Popen[bytes] | None:
    """The worker :func:`start` started for ``home``, once (None: it started none)."""
    return _started.pop(home.resolve(), None)
