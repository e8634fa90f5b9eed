"""Running processes notice a changed config.toml (issue 13).

Every process (worker, gateways, jobs) holds a :class:`ConfigWatcher`. Polled every few seconds
where the process can apply a reload safely (the worker on its writer thread between rounds, a
gateway on its event loop between events, the jobs process on a thread of its own), it looks at
the file's size and modification time, and when they changed, reads the bytes and hashes them:
the same bytes (a ``touch``) change nothing. New bytes are parsed and validated as at start
(:func:`contract.config.parse_config`):

- a file is read once its size and time stopped changing (two looks in a row), so a file being
  written is not read half-way; a file that is gone is not taken for an empty one
  (``config.missing``, warning): the process goes on with what it has;
- an invalid file is **rejected**: ``config.rejected`` (error, once per content) with the reason,
  and the process keeps the configuration it runs with;
- a file that cannot be read (a directory in its place, a file this user may not read after a
  ``sudo`` edit, a symbolic link to nothing) is **unreadable**: ``config.unreadable`` (error, once
  per reason) names the file and the fix (contract/config_errors.py), and the process keeps the
  configuration it runs with, as for an invalid one (issue 26: it used to crash the worker);
- each changed key (``section.key``) the process uses is either **reloaded** (it is in the
  process's ``reloadable`` set: ``config.reloaded``, info) or needs a **restart**: it keeps its
  old value, and ``config.restart_needed`` (warning, once per change) names the keys. A key the
  process does not use (one gateway's, another channel's section) is ignored by it.

The process runs with :attr:`ConfigWatcher.config`: the configuration it started with, with the
reloadable keys of the newest valid file. Its heartbeat carries :meth:`ConfigWatcher.fields`:
``config`` (the first 12 hex digits of the SHA-256 of the config.toml bytes it last applied,
:func:`contract.config.config_digest`), ``restart_needed`` and ``restart_keys`` (the keys whose
new values wait for a restart); ``relaybot status`` and ``relaybot doctor`` show them.

No new dependency (``watchfiles`` would add a Rust extension and a thread per process for one
small file): a ``stat`` every couple of seconds costs nothing and works on every filesystem
(bind mounts, NFS, an editor's rename-over), where inotify does not.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import BaseModel, SecretStr

from contract import channels as registry
from contract.config import (
    Config,
    ConfigError,
    ConfigUnreadable,
    config_digest,
    parse_config,
    read_config_bytes,
)
from contract.logs import mask_text

log = structlog.get_logger(__name__)

_UNSET = object()
POLL_EVERY = 2.0  # seconds between two looks at the file
REHASH_EVERY = 15  # every so many looks the bytes are hashed even if size and time are the same

# What each kind of process uses (a key elsewhere is ignored by it) and what it reloads. A key is
# ``section.key``, or a whole ``section``. Every process uses [redis]. A gateway's are in its
# channel's spec (contract/channels.py); the worker adds what the channels' specs say it uses of
# their sections (the owner's addresses).
CORE_WORKER_USES = (
    "owner",
    "model",
    "worker",
    "turns",
    "delivery",
    "memory",
    "roles",
    "redis",
    "schedule",
    "profiles",
    "mcp",
)
CORE_WORKER_RELOADS = (
    "owner",
    "model.base_url",
    "model.api_key",
    "model.model",
    "model.timeout",
    "model.retries",
    "model.backoff",
    "model.max_tool_rounds",
    "model.temperature",
    "model.concurrency",
    "turns",
    "roles",
    "worker.system_prompt",
    "worker.context_tokens",
    "worker.assistant_name",
    "schedule",
    "profiles",
    "mcp",
)
JOBS_USES = ("redis",)


def worker_uses() -> tuple[str, ...]:
    """What the worker uses: the core sections and what each channel's spec names for it."""
    return CORE_WORKER_USES + tuple(k for ch in registry.channels() for k in ch.worker_uses)


def worker_reloads() -> tuple[str, ...]:
    """What the worker reloads: the channels' keys it uses are reloaded too."""
    return CORE_WORKER_RELOADS + tuple(k for ch in registry.channels() for k in ch.worker_uses)


def gateway_uses(channel: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A channel's gateway's (uses, reloads); :class:`UnknownChannel` for a channel no package
    declares (it used to be ignored, as if it used [redis] and [delivery] only)."""
    spec = registry.channel(channel)
    return spec.uses, spec.reloads


def __getattr__(name: str) -> Any:
    """``WORKER_USES`` and ``WORKER_RELOADS``, read from the registry (worker/main.py)."""
    if name == "WORKER_USES":
        return worker_uses()
    if name == "WORKER_RELOADS":
        return worker_reloads()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def flatten(cfg: Config) -> dict[str, Any]:
    """``section.key -> value`` of every key (secrets compared by value, never logged)."""
    out: dict[str, Any] = {}
    for section, value in cfg:
        if isinstance(value, BaseModel):
            for key, inner in value:
                out[f"{section}.{key}"] = _plain(inner)
        else:
            out[section] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return ("secret", value.get_secret_value())
    if isinstance(value, BaseModel):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _covered(key: str, patterns: Collection[str]) -> bool:
    section = key.split(".", 1)[0]
    return key in patterns or section in patterns


def changed_keys(old: Config, new: Config) -> list[str]:
    """The keys (``section.key``) whose values differ, sorted."""
    a, b = flatten(old), flatten(new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def with_keys(base: Config, source: Config, keys: Collection[str]) -> Config:
    """``base`` with the values of ``keys`` (``section.key`` or ``section``) from ``source``."""
    sections: dict[str, Any] = {}
    for key in keys:
        section, _, name = key.partition(".")
        if not name:
            sections[section] = getattr(source, section)
            continue
        current = sections.get(section, getattr(base, section))
        sections[section] = current.model_copy(
            update={name: getattr(getattr(source, section), name)}
        )
    return base.model_copy(update=sections)


@dataclass(frozen=True)
class Reload:
    """A new valid config.toml: what the process now runs with, and what changed."""

    config: Config  # the process's configuration from now on (restart keys kept as they were)
    reloaded: tuple[str, ...]  # keys it took
    restart: tuple[str, ...]  # keys whose new values wait for a restart (all of them, not new)


_MCP_SERVER = re.compile(r"\bmcp\.servers\.[^.:\s]+")


def public_error(error: str) -> str:
    """A rejected config.toml's error as the heartbeat carries it: every process's Redis account
    reads the heartbeats, so secrets are masked (contract/logs.py) and an MCP server's name,
    which says what tools the owner has, is not shown (the process's own log has it whole)."""
    return mask_text(_MCP_SERVER.sub("mcp.servers.<name>", error))


class ConfigWatcher:
    """Watches ``config.toml`` for one process (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        *,
        process: str,
        uses: Collection[str],
        reloadable: Collection[str] = (),
        env: Mapping[str, str] | None = None,
        every: float = POLL_EVERY,
        clock: Callable[[], float] = time.monotonic,
        logger: Any = None,
    ) -> None:
        """``logger``: where its lines go (a terminal chat's are debug lines: relaybot/chat.py
        keeps its terminal for the conversation; its heartbeat says the same)."""
        self._log = log if logger is None else logger
        self.process = process
        self.path = cfg.config_file
        self._home = cfg.home
        self._env = env
        self._uses, self._reloadable = tuple(uses), tuple(reloadable)
        self._every, self._clock = every, clock
        self.started = cfg  # the restart keys keep these values
        self.config = cfg
        self.latest = cfg  # the newest valid configuration, whole (the jobs run with it)
        self.error = ""  # why the newest file was rejected or unreadable ("" when it was not)
        try:
            raw = read_config_bytes(cfg.home)
        except ConfigUnreadable as exc:  # unreadable since the process loaded it
            raw, self.error = None, str(exc)
        self.digest = config_digest(raw)  # of the bytes last applied
        self._seen = self.digest  # of the bytes last looked at (applied or rejected)
        self._stat = self._stat_now()
        self._settling: tuple[int, int, int] | None = None  # a new size and time seen once
        self._checks = 0
        self._next = clock() + every
        self.restart_keys: tuple[str, ...] = ()
        self._warned: dict[str, Any] = {}  # restart keys said, with the values they were said for

    def _stat_now(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        # the change time too: a chmod or chown (a file made unreadable, or readable again)
        # changes neither the size nor the modification time
        return st.st_mtime_ns, st.st_size, st.st_ctime_ns

    def fields(self) -> dict[str, Any]:
        """The heartbeat's fields: ``config``, ``restart_needed``, ``restart_keys`` (and
        ``config_error`` while the newest file is rejected)."""
        out: dict[str, Any] = {
            "config": self.digest,
            "restart_needed": bool(self.restart_keys),
            "restart_keys": list(self.restart_keys),
        }
        if self.error:
            out["config_error"] = public_error(self.error)
        return out

    def poll(self) -> Reload | None:
        """:meth:`check`, at most every ``every`` seconds."""
        now = self._clock()
        if now < self._next:
            return None
        self._next = now + self._every
        return self.check()

    def check(self) -> Reload | None:
        """Look at the file now: a :class:`Reload` when a new valid content changed anything
        this process uses, else None."""
        stat = self._stat_now()
        self._checks += 1
        if stat == self._stat and self._checks % REHASH_EVERY:
            return None  # unchanged size and time (and, now and then, the bytes are read anyway:
            # an edit within one timestamp tick that kept the size is seen too)
        if stat not in (self._stat, self._settling):
            self._settling = stat  # changed since the last look: read once it stops changing
            return None  # (an editor that truncates, then writes, is not read half-way)
        self._stat, self._settling = stat, None
        try:
            raw = read_config_bytes(self._home)
        except ConfigUnreadable as exc:
            self._unreadable(str(exc))
            return None
        if raw is None:  # deleted, or an editor's save between rename and write: keep going
            if self._seen != "none":
                detail = "config.toml is gone; still running with the last one"
                self._log.warning("config.missing", process=self.process, detail=detail)
            self._seen = "none"
            return None
        digest = config_digest(raw)
        if digest == self._seen:
            return None
        self._seen = digest
        try:
            new = parse_config(raw, self._home, self._env)
        except ConfigError as exc:
            self.error = str(exc)
            detail = "the new config.toml is not valid; still running with the old one"
            self._log.error(
                "config.rejected", process=self.process, error=self.error, detail=detail
            )
            return None
        self.error = ""
        self.latest = new
        return self._apply(new, digest)

    def _unreadable(self, error: str) -> None:
        """config.toml is there but cannot be read: said once per reason, the process goes on
        with what it runs with; the heartbeat carries the reason (``config_error``)."""
        self.error = error
        seen = f"unreadable:{error}"
        if self._seen != seen:
            self._log.error("config.unreadable", process=self.process, error=error,
                      detail="still running with the last good configuration")  # fmt: skip
        self._seen = seen

    def _apply(self, new: Config, digest: str) -> Reload | None:
        uses = [k for k in changed_keys(self.config, new) if _covered(k, self._uses)]
        reloaded = tuple(k for k in uses if _covered(k, self._reloadable))
        restart = tuple(
            k
            for k in changed_keys(self.started, new)
            if _covered(k, self._uses) and not _covered(k, self._reloadable)
        )
        self.digest = digest
        values = flatten(new)
        fresh = [k for k in restart if self._warned.get(k, _UNSET) != values.get(k)]
        self._warned = {k: values.get(k) for k in restart}
        self.restart_keys = restart
        if fresh:
            self._log.warning("config.restart_needed", process=self.process, keys=list(fresh),
                        detail="these keys changed in config.toml; restart this process to "
                        "apply them")  # fmt: skip
        if not reloaded:
            if not uses:
                self._log.info("config.unchanged", process=self.process, digest=digest,
                         detail="nothing this process uses changed")  # fmt: skip
            return None
        self.config = with_keys(self.config, new, reloaded)
        self._log.info("config.reloaded", process=self.process, keys=list(reloaded), digest=digest)
        return Reload(self.config, reloaded, restart)


def watch_in_thread(
    watch: ConfigWatcher, publish: Callable[[dict[str, Any]], None]
) -> threading.Event:
    """For a process that reloads nothing and has no loop of its own to poll from (the rq
    ``jobs`` process): a daemon thread checks the file every ``POLL_EVERY`` seconds and hands
    :meth:`ConfigWatcher.fields` to ``publish`` (its heartbeat). Set the event to stop it."""
    stop = threading.Event()

    def run() -> None:
        publish(watch.fields())
        while not stop.wait(POLL_EVERY):
            try:
                watch.check()
            except OSError as exc:
                log.warning("config.unreadable", process=watch.process, error=str(exc))
            publish(watch.fields())

    threading.Thread(target=run, name="config-watch", daemon=True).start()
    return stop
