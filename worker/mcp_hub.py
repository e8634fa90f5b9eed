"""The worker's MCP hub (issue 29): one asyncio event loop on a thread of its own, holding one
session per configured MCP server (worker/mcp_session.py), and what the rest of the worker asks
of it, from any other thread:

- :meth:`McpHub.snapshot`: the configuration in force, each connected server's last listing and
  the pins, as one immutable object swapped whole on any change (a turn's offer is made from it:
  worker/mcp_rules.py ``offer``);
- :meth:`McpHub.call`: a tool call, made on the hub's loop while the calling turn thread waits;
  it never raises: any failure is a one-line ``error: ...`` result and the turn goes on;
- :meth:`McpHub.approve`: the owner's approval of a server's listing as it is now (its pin);
- :meth:`McpHub.configure`: a reload (servers added, removed, restarted; the rest at once);
- :meth:`McpHub.health`: each server's state and tools, for the worker's heartbeat.

Why here: the worker's turns run side by side on the pool's threads and the memory writer must
never wait on a tool; one loop serves every turn's calls (a session multiplexes them), starts a
stdio server once, and reconnects in the background. Pins: the first listing of a server with
no pin file is written as its pin (trust on first use); a pin file that cannot be read is never
overwritten by a first sight (only the owner's approval replaces it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import structlog

from contract.mcp_config import McpServerConfig
from worker.mcp_pins import PinStore
from worker.mcp_rules import ListedTool, Pin, PinError, compare, listing_digest, offer, pin_of
from worker.mcp_session import PING_EVERY, Runner, one_line, transport_of

log = structlog.get_logger(__name__)

BACKOFF = (1.0, 300.0)  # seconds: the first wait before a reconnect, and the longest
CALL_MARGIN = 5.0  # seconds a caller waits past a server's timeout before giving up itself
STOPPING = "error: the worker is stopping"
READY_WAIT = 20.0  # seconds a worker that took the lease waits for its servers' first listing
CLOSE_WAIT = 15.0  # seconds close() waits for the sessions to end (stdio: up to ~6 s each)


@dataclass(frozen=True)
class McpSnapshot:
    """What the hub knows now, whole: the configuration in force, the listings of the servers
    that are up, and the pins (None: none, or unreadable). ``version`` bumps on any change."""

    servers: Mapping[str, McpServerConfig]
    listings: Mapping[str, tuple[ListedTool, ...]]
    pins: Mapping[str, Pin | None]
    version: int


@dataclass(frozen=True)
class _Status:
    state: str
    reason: str
    since: float
    retry_at: float | None


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


def _identity(cfg: McpServerConfig) -> tuple[object, ...]:
    """What a session is made of: a change of it restarts the server."""
    env = tuple(sorted((k, v.get_secret_value()) for k, v in cfg.env.items()))
    headers = tuple(sorted((k, v.get_secret_value()) for k, v in cfg.headers.items()))
    return (tuple(cfg.command or ()), cfg.url, env, headers)


class McpHub:
    """The MCP sessions of one worker (see the module's docstring)."""

    def __init__(
        self,
        servers: Mapping[str, McpServerConfig],
        pins: PinStore,
        *,
        clock: Callable[[], float] = time.time,
        reserved: Collection[str] = (),
        backoff: tuple[float, float] = BACKOFF,
        ping_every: float = PING_EVERY,
    ) -> None:
        self._pins, self._clock, self._backoff = pins, clock, backoff
        self._ping_every = ping_every
        self._born = clock()
        self._reserved = frozenset(reserved)
        self._lock = threading.RLock()
        self._servers: dict[str, McpServerConfig] = dict(servers)
        self._listings: dict[str, tuple[ListedTool, ...]] = {}
        self._pin_state: dict[str, str] = {}
        self._pin: dict[str, Pin | None] = {}
        self._runners: dict[str, Runner] = {}
        self._status: dict[str, _Status] = {}  # as last told by each runner (with its listing)
        self._live: set[Runner] = set()  # every runner whose task has not ended (close waits)
        self._snap = McpSnapshot(_frozen(self._servers), _frozen({}), _frozen({}), 0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stopping = False  # stopping(): no call is made or waited for any more
        self._inflight: set[concurrent.futures.Future[str]] = set()
        for name in self._servers:
            self._read_pin(name)
        self._publish()

    # -- lifecycle ---------------------------------------------------------------------------

    def reserve(self, names: Collection[str]) -> None:
        """The built-in tools' names, which no offered name takes (known once the worker's turns
        are built, after the hub): what :meth:`health` shows is then what turns are offered."""
        with self._lock:
            self._reserved = frozenset(names)

    def start(self) -> McpHub:
        """Start the hub's loop; each server connects in the background (nothing waits)."""
        with self._lock:
            if self._loop is not None or self._closed:
                return self
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._thread = threading.Thread(target=self._serve, name="mcp-hub", daemon=True)
            self._thread.start()
            for name in self._servers:
                loop.call_soon_threadsafe(self._start_runner, name)
        return self

    def _serve(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._loop_error)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        log.warning("mcp.loop_error", error=one_line(repr(exc) if exc else str(context)))

    def close(self) -> None:
        """End every session (stdio servers terminated) and the loop; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._stop_all(), loop)
        try:
            future.result(timeout=CLOSE_WAIT)
        except Exception as exc:
            log.warning("mcp.close_incomplete", error=one_line(repr(exc)))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=CLOSE_WAIT)
        with self._lock:
            self._listings.clear()
            self._publish()

    async def _stop_all(self) -> None:
        with self._lock:
            self._runners.clear()
            runners = list(self._live)
        await asyncio.gather(*(r.stop() for r in runners), return_exceptions=True)
        current = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    # -- on the loop -------------------------------------------------------------------------

    def _start_runner(self, name: str) -> None:
        with self._lock:
            cfg = self._servers.get(name)
            if cfg is None or self._closed or name in self._runners:
                return
            runner = Runner(name, cfg, self._changed, backoff=self._backoff, clock=self._clock,
                            ping_every=self._ping_every)  # fmt: skip
            self._runners[name] = runner
            self._live.add(runner)
        assert self._loop is not None
        runner.start(self._loop, done=self._live.discard)

    async def _restart(self, name: str, old: Runner | None) -> None:
        if old is not None:
            await old.stop()
        if self._runners.get(name) is old or old is None:
            self._runners.pop(name, None)
            self._start_runner(name)

    async def _remove(self, runner: Runner) -> None:
        await runner.stop()

    def _changed(self, runner: Runner) -> None:
        """A runner's state or listing changed (on the loop)."""
        with self._lock:
            if self._runners.get(runner.name) is not runner or runner.name not in self._servers:
                return  # stopped, removed or replaced: it says nothing any more
            name = runner.name
            self._status[name] = _Status(runner.state, runner.reason, runner.since, runner.retry_at)
            if runner.state == "up" and runner.listing is not None:
                self._listings[name] = runner.listing
                self._first_sight(name, runner.listing)
            else:
                self._listings.pop(name, None)
            self._publish()

    # -- pins --------------------------------------------------------------------------------

    def _read_pin(self, name: str) -> None:
        try:
            pin = self._pins.read(name)
        except (PinError, ValueError) as exc:
            self._pin[name], self._pin_state[name] = None, f"unreadable: {one_line(str(exc))}"
            log.error("mcp.pin_unreadable", server=name, error=one_line(str(exc)))
            return
        self._pin[name] = pin
        if self._pin_state.get(name) != "first" or pin is None:
            self._pin_state[name] = "ok" if pin is not None else "none"

    def _first_sight(self, name: str, listed: tuple[ListedTool, ...]) -> None:
        self._read_pin(name)
        if self._pin_state[name] != "none":
            return  # a pin, or one unreadable: never taken for a first sight
        pin = pin_of(name, listed)
        try:
            self._pins.write(pin)
        except OSError as exc:
            log.error("mcp.pin_write_failed", server=name, error=one_line(str(exc)))
            return
        self._pin[name], self._pin_state[name] = pin, "first"
        log.info("mcp.pinned", server=name, tools=len(listed), digest=listing_digest(listed))

    def _publish(self) -> None:
        """Swap in a new snapshot (under the lock)."""
        pins = {n: self._pin.get(n) for n in self._servers}
        self._snap = McpSnapshot(
            _frozen(self._servers),
            _frozen({n: t for n, t in self._listings.items() if n in self._servers}),
            _frozen(pins),
            self._snap.version + 1,
        )

    # -- what other threads ask --------------------------------------------------------------

    def snapshot(self) -> McpSnapshot:
        """What the hub knows now (a swapped immutable object: no lock, no copy)."""
        return self._snap

    def call(self, server: str, tool: str, arguments: dict[str, Any], *, budget: int) -> str:
        """Call ``server``'s ``tool`` and wait for its result as text (mcp_rules.result_text),
        or a one-line ``error: ...``. Any thread but the hub's; never raises."""
        try:
            return self._call(server, tool, arguments, budget)
        except Exception as exc:  # the promise: a turn always gets a result
            log.error("mcp.call_crashed", server=server[:40], error=one_line(repr(exc)))
            return f"error: the call to the MCP server failed ({exc.__class__.__name__})"

    def _call(self, server: str, tool: str, arguments: dict[str, Any], budget: int) -> str:
        with self._lock:
            cfg, loop = self._servers.get(server), self._loop
            runner = self._runners.get(server)
        if cfg is None:
            return f"error: no MCP server named {server[:40]!r} is configured"
        if loop is None or self._closed or runner is None:
            return f"error: the MCP server {server!r} is not running (the worker is stopping?)"
        if threading.current_thread() is self._thread:
            return "error: an MCP tool was called from the MCP hub's own thread"
        timeout = cfg.timeout
        with self._lock:
            if self._stopping:
                return STOPPING + "; the call was not made"
            future = asyncio.run_coroutine_threadsafe(
                runner.call(tool, dict(arguments), budget, timeout), loop
            )
            self._inflight.add(future)
        try:
            return future.result(timeout=timeout + CALL_MARGIN)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return f"error: the tool did not answer within {timeout:g} s (its server's timeout)"
        except concurrent.futures.CancelledError:
            if self._stopping:
                return STOPPING + "; the call was given up"
            return f"error: the call was cancelled (the MCP server {server!r} was stopped)"
        finally:
            with self._lock:
                self._inflight.discard(future)

    def stopping(self) -> None:
        """The worker was told to stop: the calls in flight are given up at once and no new one
        is made (each turn gets an ``error: ...`` result and finishes), so a tool that hangs
        for its whole ``timeout`` never holds the stop (systemd's TimeoutStopSec). Safe from a
        signal handler: it only sets a flag and cancels futures."""
        with self._lock:
            self._stopping = True
            inflight = list(self._inflight)
        for future in inflight:
            future.cancel()

    def wait_ready(self, timeout: float, stop: Callable[[], bool] = lambda: False) -> None:
        """Wait until every configured server has been reached or given up on once (up, or
        down with why), at most ``timeout`` seconds or until ``stop()``: the entries a worker
        takes over at its start (pending after a crash, or sent while it was down) are then
        offered the tools they would have been offered had it been running."""
        began = time.monotonic()
        deadline = began + timeout
        waiting = sorted(self._servers)
        while time.monotonic() < deadline and not stop():
            with self._lock:
                waiting = [
                    n
                    for n in self._servers
                    if (told := self._status.get(n)) is None or told.state == "starting"
                ]
            if not waiting:
                return
            time.sleep(0.05)
        log.info("mcp.not_ready", servers=waiting, waited=round(time.monotonic() - began, 1),
                 why="the worker is stopping" if stop() else "still starting")  # fmt: skip

    def approve(self, server: str, digest: str | None) -> dict[str, object]:
        """Make ``server``'s listing as it is now its pin (the owner's approval), if it is the
        listing of ``digest`` (when given). On the writer thread; never raises."""
        with self._lock:
            if server not in self._servers:
                return {"ok": False, "error": f"no MCP server named {server[:40]!r} is configured"}
            listed = self._listings.get(server)
            if listed is None:
                told = self._status.get(server)
                why = f" ({told.state}: {told.reason})" if told and told.reason else ""
                return {
                    "ok": False,
                    "error": f"the MCP server {server!r} is not connected{why}: nothing to approve",
                }
            now = listing_digest(listed)
            if digest is not None and digest != now:
                return {
                    "ok": False,
                    "error": f"the tools of {server!r} changed since they were shown "
                    f"(digest {digest[:12]} shown, {now[:12]} now): look again (relaybot tools)",
                }
            old = self._pin.get(server)
            diff = compare(old if old is not None else Pin(server, {}), listed)
            pin = pin_of(server, listed)
            try:
                self._pins.write(pin)
            except (OSError, ValueError) as exc:
                return {"ok": False, "error": one_line(f"the pin could not be written: {exc}")}
            self._pin[server], self._pin_state[server] = pin, "ok"
            self._publish()
        log.info("mcp.approved", server=server, digest=now, changed=diff.changed, added=diff.added)
        fresh = set(diff.added) | set(diff.changed)
        return {
            "ok": True,
            "server": server,
            "digest": now,
            "added": diff.added,
            "changed": diff.changed,
            "removed": diff.removed,
            "tools": {t.name: t.description for t in listed if t.name in fresh},
        }

    def configure(self, servers: Mapping[str, McpServerConfig]) -> None:
        """Apply a reload (on the writer; nothing waits): a removed server's session is closed,
        a new one started, one whose command, url or env changed restarted; audiences, the
        allowlist and the timeout apply at once."""
        with self._lock:
            if self._closed:
                return
            old, self._servers = self._servers, dict(servers)
            stops: list[Runner] = []
            starts: list[tuple[str, Runner | None]] = []
            for name in old.keys() - servers.keys():
                self._listings.pop(name, None)
                self._status.pop(name, None)
                runner = self._runners.pop(name, None)
                if runner is not None:
                    stops.append(runner)
                log.info("mcp.server_removed", server=name)
            for name, cfg in servers.items():
                before = old.get(name)
                if before is None:
                    self._read_pin(name)
                    starts.append((name, None))
                    log.info("mcp.server_added", server=name)
                elif _identity(before) != _identity(cfg):
                    self._listings.pop(name, None)
                    self._status[name] = _Status("starting", "", self._clock(), None)
                    starts.append((name, self._runners.get(name)))
                    log.info("mcp.server_restarted", server=name)
                elif (runner := self._runners.get(name)) is not None:
                    runner.cfg = cfg  # timeout of listings; audiences and tools are the hub's
            self._publish()
            loop = self._loop
        if loop is None:
            return
        for runner in stops:
            asyncio.run_coroutine_threadsafe(self._remove(runner), loop)
        for name, previous in starts:
            asyncio.run_coroutine_threadsafe(self._restart(name, previous), loop)

    def health(self) -> dict[str, Any]:
        """Each configured server's state and tools, for the worker's heartbeat."""
        now = self._clock()
        out: dict[str, Any] = {}
        with self._lock:
            snap = self.snapshot()
            status = dict(self._status)
            pin_state = dict(self._pin_state)
        for name, cfg in sorted(snap.servers.items()):
            told = status.get(name) or _Status("starting", "", self._born, None)
            listed = snap.listings.get(name)
            state = told.state if told.state != "up" or listed is not None else "starting"
            retry = told.retry_at if state == "down" else None
            tools: list[dict[str, str]] = []
            if listed is not None:
                made = offer(
                    {name: cfg}, {name: listed}, snap.pins, cfg.audiences[0], self._reserved
                )
                tools = [
                    {"name": o.tool, "exposed": o.exposed, "status": "offered", "reason": ""}
                    for o in made.tools.values()
                ] + [
                    {"name": w.tool, "exposed": "", "status": "withheld", "reason": w.reason}
                    for w in made.withheld
                ]
                tools.sort(key=lambda t: t["name"])
            out[name] = {
                "state": state,
                "reason": told.reason if state == "down" else "",
                "since": told.since,
                "transport": transport_of(cfg),
                "audiences": [a.value for a in cfg.audiences],
                "digest": listing_digest(listed) if listed is not None else None,
                "pin": pin_state.get(name, "none"),
                "retry_in": max(retry - now, 0.0) if retry is not None else None,
                "tools": tools,
            }
        return {"mcp": out}
