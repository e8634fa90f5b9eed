"""relaybot's processes as real subprocesses, for integration tests.

Every process is ``[sys.executable, "-m", "relaybot", ...]`` with an environment built from
scratch by :func:`relaybot_env` (nothing of the developer's own ``RELAYBOT_*`` / ``OPENAI_*`` /
``REDIS_URL`` leaks in). Long-running ones (worker, jobs) are :class:`Proc` objects whose stderr
goes to a log file that the test can read as JSON records; a :class:`Procs` set stops whatever is
still running at the end of a test (SIGTERM, then SIGKILL).

Waiting is always on a condition with a deadline (:func:`wait_until`), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import redis

from contract.bus import publish
from contract.keys import Keys
from contract.messages import CHANNELS, Reply
from gateways.cli.gateway import normalize

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DEADLINE = 10.0
_INHERITED = ("PATH", "LANG", "LC_ALL", "USER", "LOGNAME", "SYSTEMROOT", "PYTHONPATH")


class WaitTimeout(AssertionError):
    pass


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float = DEFAULT_DEADLINE,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy and return it; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {text}")
        time.sleep(interval)


# -- environment -------------------------------------------------------------------------------


def relaybot_env(
    home: Path,
    *,
    redis_url: str | None = None,
    prefix: str | None = None,
    model_url: str | None = None,
    model: str | None = "fake-model",
    user_home: Path | None = None,
    **extra: str,
) -> dict[str, str]:
    """A clean environment for a relaybot process.

    ``redis_url`` None means the embedded Redis (zero-config); ``model_url`` None means no model.
    ``user_home`` becomes ``HOME`` (default: a ``userhome`` directory next to ``home``) so that
    nothing can be written to the real home directory by accident.
    """
    env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
    env.setdefault("USER", "tester")
    env.setdefault("LOGNAME", env["USER"])
    if user_home is None:
        user_home = home.parent / "userhome"
        user_home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(user_home)
    env["RELAYBOT_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["RELAYBOT_DOTENV"] = ""  # never the developer's .env of the clone (cwd is the repo)
    # the times the model sees are in the system's zone ([owner] timezone unset): the tests'
    # is UTC, wherever they run (contract/timezone.py reads TZ first)
    env["TZ"] = "UTC"
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    if prefix is not None:
        env["RELAYBOT_REDIS_PREFIX"] = prefix
    if model_url is not None:
        env["OPENAI_BASE_URL"] = model_url
        if model is not None:
            env["RELAYBOT_MODEL"] = model
    env.update(extra)
    return env


def write_config(home: Path, text: str) -> Path:
    """config.toml as relaybot itself writes it (the owner's alone: 0600 in a 0700 home; a
    looser one is tightened, with a warning, by the next relaybot command)."""
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    path = home / "config.toml"
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)
    return path


# -- one-shot commands -------------------------------------------------------------------------


def run_relaybot(
    args: list[str],
    env: Mapping[str, str],
    *,
    timeout: float = 30.0,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``relaybot ARGS`` to completion (stdout/stderr captured as text)."""
    return subprocess.run(
        [sys.executable, "-m", "relaybot", *args],
        env=dict(env),
        cwd=cwd or REPO,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def chat(
    env: Mapping[str, str],
    message: str,
    *,
    session: str | None = None,
    timeout: float | None = None,
    verbose: bool = False,
    cwd: Path | None = None,
    deadline: float = 30.0,
) -> subprocess.CompletedProcess[str]:
    """``relaybot chat -m MESSAGE [--session S] [--timeout T]``."""
    args = ["-v"] if verbose else []
    args += ["chat", "-m", message]
    if session is not None:
        args += ["--session", session]
    if timeout is not None:
        args += ["--timeout", str(timeout)]
    return run_relaybot(args, env, timeout=deadline, cwd=cwd)


# ``relaybot ARGS`` as its console script runs it, and the modules it held when it exited
_MODULES_AT_EXIT = """
import atexit, json, os, sys
def _dump():
    with open(os.environ["RELAYBOT_TEST_MODULES"], "w") as out:
        json.dump(sorted(name for name, mod in sys.modules.items() if mod is not None), out)
atexit.register(_dump)
from relaybot.cli import main
sys.argv[0] = "relaybot"
sys.exit(main())
"""


def modules_at_exit(
    args: list[str], env: Mapping[str, str], *, timeout: float = 60.0
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``relaybot ARGS`` (as ``relaybot`` runs, ``cli.main()`` with the process's own
    arguments) and return it with the modules it had imported when it exited: what it
    imported, not what it tried to (a library's optional import that failed is not there)."""
    fd, path = tempfile.mkstemp(prefix="modules-", suffix=".json")
    os.close(fd)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _MODULES_AT_EXIT, *args],
            env={**env, "RELAYBOT_TEST_MODULES": path},
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        text = Path(path).read_text()
        return done, json.loads(text) if text else []
    finally:
        os.unlink(path)


def among(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are one of ``packages`` or inside one."""
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


def json_lines(text: str) -> list[dict[str, Any]]:
    """Each line of a log as a JSON record; a line that is not JSON becomes ``{"_raw": line}``."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        out.append(record if isinstance(record, dict) else {"_raw": line})
    return out


# -- long-running processes --------------------------------------------------------------------


class Proc:
    """A relaybot process running in the background; stderr (its log) goes to ``log_path``."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: Mapping[str, str],
        log_dir: Path,
        wrap: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.args = args
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.stderr.log"
        self.out_path = log_dir / f"{name}.stdout.log"
        with self.log_path.open("ab") as err, self.out_path.open("ab") as out:
            self.popen = subprocess.Popen(
                [*wrap, sys.executable, "-m", "relaybot", *args],  # wrap: ip netns exec NAME
                env=dict(env),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # a terminal's Ctrl-C does not reach it; we signal it
            )

    def __repr__(self) -> str:
        return f"<Proc {self.name} pid={self.pid} rc={self.popen.poll()}>"

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def records(self) -> list[dict[str, Any]]:
        return json_lines(self.log_text())

    def events(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [
            r
            for r in self.records()
            if r.get("event") == event and all(r.get(k) == v for k, v in match.items())
        ]

    def wait_for_log(
        self, event: str, *, timeout: float = DEFAULT_DEADLINE, **match: Any
    ) -> dict[str, Any]:
        """The first log record with this event (and these field values); fails if the process
        exits without writing it."""

        def found() -> dict[str, Any] | None:
            hits = self.events(event, **match)
            if hits:
                return hits[0]
            if self.popen.poll() is not None:
                hits = self.events(event, **match)
                if hits:
                    return hits[0]
                raise AssertionError(
                    f"{self.name} exited with {self.popen.returncode} before logging {event!r}:\n"
                    + self.log_text()[-4000:]
                )
            return None

        return wait_until(
            found,
            timeout=timeout,
            message=lambda: f"{self.name} to log {event!r}; its log:\n{self.log_text()[-4000:]}",
        )

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def wait(self, timeout: float = DEFAULT_DEADLINE) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} (pid {self.pid}) did not exit within {timeout:g} s; its log:\n"
                + self.log_text()[-4000:]
            ) from None

    def stop(self, timeout: float = DEFAULT_DEADLINE) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return int(self.popen.returncode)


class Procs:
    """The processes a test started; whatever is still running at the end is stopped."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Proc] = []
        self._names: dict[str, int] = {}

    def __enter__(self) -> Procs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            with contextlib.suppress(Exception):
                proc.stop(timeout=5)

    def start(
        self, name: str, args: list[str], env: Mapping[str, str], wrap: Sequence[str] = ()
    ) -> Proc:
        n = self._names.get(name, 0) + 1
        self._names[name] = n
        proc = Proc(f"{name}-{n}", args, env, self.log_dir, wrap)
        self.started.append(proc)
        return proc

    def worker(
        self,
        env: Mapping[str, str],
        *,
        r: redis.Redis | None = None,
        keys: Keys | None = None,
        no_wait: bool = False,
        wait_for_lease: bool = True,
        timeout: float = DEFAULT_DEADLINE,
        verbose: bool = False,
    ) -> Proc:
        """Start ``relaybot worker`` (``-v``: at debug level); with ``r`` and ``keys``, wait until
        it holds the lease and has beaten once (so it is reading the stream and its signal
        handlers are installed)."""
        args = [*(["-v"] if verbose else []), "worker", *(["--no-wait"] if no_wait else [])]
        proc = self.start("worker", args, env)
        if wait_for_lease and r is not None and keys is not None:
            wait_for_worker(r, keys, proc, timeout=timeout)
        return proc

    def jobs(self, env: Mapping[str, str]) -> Proc:
        return self.start("jobs", ["jobs"], env)


# -- Redis-side observations -------------------------------------------------------------------


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def lease_holder(r: redis.Redis, keys: Keys) -> str | None:
    value = r.get(keys.lease)
    return None if value is None else _s(value)


def heartbeat(r: redis.Redis, keys: Keys, name: str) -> dict[str, Any] | None:
    raw = r.hget(keys.heartbeats, name)
    return None if raw is None else json.loads(raw)


def wait_for_heartbeat(
    r: redis.Redis,
    keys: Keys,
    name: str,
    *,
    pid: int | None = None,
    newer_than: float = 0.0,
    timeout: float = DEFAULT_DEADLINE,
) -> dict[str, Any]:
    """The heartbeat ``name`` once it exists (from ``pid``, with ``ts`` > ``newer_than``)."""

    def beat() -> dict[str, Any] | None:
        hb = heartbeat(r, keys, name)
        if hb is None or (pid is not None and hb.get("pid") != pid):
            return None
        return hb if float(hb["ts"]) > newer_than else None

    return wait_until(beat, timeout=timeout, message=f"heartbeat {name!r} in {keys.heartbeats}")


def wait_for_worker(
    r: redis.Redis, keys: Keys, proc: Proc, *, timeout: float = DEFAULT_DEADLINE
) -> str:
    """Wait until ``proc`` holds the worker lease and has beaten; returns the lease holder."""

    def held() -> str | None:
        if proc.returncode is not None:
            raise AssertionError(
                f"{proc.name} exited with {proc.returncode}:\n{proc.log_text()[-4000:]}"
            )
        holder = lease_holder(r, keys)
        return holder if holder is not None and holder.endswith(f":{proc.pid}") else None

    holder = wait_until(held, timeout=timeout, message=f"{proc.name} to hold {keys.lease}")
    wait_for_heartbeat(r, keys, "worker", pid=proc.pid, timeout=timeout)
    return holder


def inbound_streams(keys: Keys) -> list[str]:
    """Every inbound stream the worker reads: one per channel, and the one without a channel."""
    return [keys.inbound, *(keys.inbound_of(c) for c in CHANNELS)]


def consumers(r: redis.Redis, keys: Keys) -> list[str]:
    found: list[str] = []
    for stream in inbound_streams(keys):
        try:
            infos: Any = r.xinfo_consumers(stream, Keys.GROUP)
        except redis.ResponseError:  # no stream or no group yet
            continue
        found += [name for info in infos if (name := _s(info["name"])) not in found]
    return found


def pending(r: redis.Redis, keys: Keys) -> int:
    total = 0
    for stream in inbound_streams(keys):
        try:
            summary: Any = r.xpending(stream, Keys.GROUP)
        except redis.ResponseError:
            continue
        total += int(summary["pending"])
    return total


def replies(r: redis.Redis, keys: Keys, session: str) -> list[Reply]:
    """The replies queued (not yet delivered) for ``session``, oldest first."""
    raw: Any = r.lrange(keys.reply(session), 0, -1)
    return [Reply.from_json(item) for item in raw]


def wait_for_replies(
    r: redis.Redis, keys: Keys, session: str, count: int, *, timeout: float = DEFAULT_DEADLINE
) -> list[Reply]:
    return wait_until(
        lambda: found if len(found := replies(r, keys, session)) >= count else None,
        timeout=timeout,
        message=lambda: (
            f"{count} replies on {keys.reply(session)} (have {len(replies(r, keys, session))})"
        ),
    )


def send(r: redis.Redis, keys: Keys, session: str, text: str) -> str:
    """XADD a terminal message for ``cli:<session>`` the way the CLI gateway does; its stream id."""
    return publish(r, keys, normalize(session, text, sender="tester"))


def dead_letters(r: redis.Redis, keys: Keys) -> list[tuple[str, dict[str, bytes]]]:
    entries: Any = r.xrange(keys.dead, "-", "+")
    return [(_s(sid), {_s(k): v for k, v in fields.items()}) for sid, fields in entries]


# -- memory ------------------------------------------------------------------------------------


def memory_rows(db: Path, sql: str = "SELECT * FROM log ORDER BY id", *args: Any) -> list[dict]:
    """Rows of the memory database, read through a read-only connection."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute(sql, args)]
    finally:
        conn.close()


# -- the process table ---------------------------------------------------------------------------


def pid_running(pid: int) -> bool:
    """Is ``pid`` a live (not zombie) process?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line or environment contains ``text`` (Linux /proc)."""
    needle = text.encode()
    found: list[tuple[int, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if (needle in cmdline or needle in environ) and pid_running(int(entry.name)):
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@contextlib.contextmanager
def timer() -> Iterator[Callable[[], float]]:
    started = time.monotonic()
    yield lambda: time.monotonic() - started


@contextlib.contextmanager
def short_tmpdir(prefix: str = "rb-") -> Iterator[Path]:
    """A temporary directory with a short path (the embedded Redis's unix socket lives in it, and
    socket paths are limited to ~100 bytes); removed afterwards."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp" if Path("/tmp").is_dir() else None))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
