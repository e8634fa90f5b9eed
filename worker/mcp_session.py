"""One MCP server's session on the hub's event loop (issue 29): connect, list, stay up, notice
the end, reconnect with backoff; and a tool call on that session, whose every failure becomes a
one-line ``error: ...`` result.

A :class:`Runner` is one server's supervisor: an asyncio task of the hub's loop
(worker/mcp_hub.py) that opens the transport (stdio: the server started as a child with only
the SDK's default environment and its ``env``; streamable HTTP: the SDK's client, its 1 MiB
limit of one answer kept), initializes a ``ClientSession``, lists the tools (again on
``notifications/tools/list_changed``) and tells the hub. Between the transport and the session
sits a pump of ours: it sees the transport's end (a stdio server that exited, was killed or
closed its output) and what is not JSON-RPC (a server that answers garbage), which the session
alone keeps to itself. Any end of a session (a failure to start, the server's death, garbage,
a listing that fails) is a reason in words; the runner waits out its backoff (doubling, with
jitter) and tries again, until the hub stops it. Nothing raises out of a runner's task.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TextIO
from urllib.parse import urlsplit

import anyio
import httpx2
import structlog
from anyio.streams.memory import MemoryObjectSendStream
from mcp import ClientSession, MCPError, StdioServerParameters
from mcp import types as mcp_types
from mcp.client._transport import TransportStreams  # the SDK's own type of a transport
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE, streamable_http_client
from mcp.shared.message import SessionMessage

from contract.mcp_config import McpServerConfig
from worker.mcp_rules import ListedTool, result_text

log = structlog.get_logger(__name__)

Item = SessionMessage | Exception
MAX_PAGES = 20  # pages of a tools/list; a server that pages on forever is down
MAX_TOOLS = 1000  # tools of one server; more is not a tool server we can offer
MAX_REASON = 300  # characters of a reason or an error


CLOSED = "the server closed the connection"
HTTP_ERROR = "Server returned an error response"  # the SDK's words for a 4xx/5xx with no JSON-RPC
HTTP_TIMEOUT, HTTP_READ_TIMEOUT = 30.0, 300.0  # the SDK's own client's (mcp.shared._httpx_utils)
RELIST_EVERY = 1.0  # seconds between two listings a server's tools/list_changed asks for
PING_EVERY = 30.0  # seconds a url server may be quiet before it is pinged
START_TIMEOUT = 60.0  # seconds a start or a listing may take at least (npx may download first)


def start_timeout(cfg: McpServerConfig) -> float:
    """How long starting (initialize) and listing may take: a call's ``timeout`` is often a
    few seconds, while a server's start (a Python or Node program's imports) is slower."""
    return max(cfg.timeout, START_TIMEOUT)


def transport_of(cfg: McpServerConfig) -> str:
    return "stdio" if cfg.command is not None else "http"


def shown_url(url: str) -> str:
    """``url`` as it may be shown: no user:password, no query, no fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def one_line(text: str, cfg: McpServerConfig | None = None) -> str:
    """``text`` as one bounded line, with a configured URL's secrets taken out."""
    if cfg is not None and cfg.url:
        text = text.replace(cfg.url, shown_url(cfg.url))
        text = re.sub(r"\?[^\s'\"]*", "", text) if "?" in cfg.url else text
    text = " ".join(text.split())
    return text[:MAX_REASON] + ("..." if len(text) > MAX_REASON else "")


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException, cfg: McpServerConfig) -> str:
    """Why a session could not start or ended, in words (one line)."""
    leaf = _leaf(exc)
    if isinstance(leaf, FileNotFoundError) and cfg.command is not None:
        return f"could not start: no program {cfg.command[0][:80]!r}"
    if isinstance(leaf, PermissionError) and cfg.command is not None:
        return f"could not start: {cfg.command[0][:80]!r} may not be run (permission denied)"
    if isinstance(leaf, TimeoutError):
        return f"did not answer within {start_timeout(cfg):g} s"
    if isinstance(leaf, MCPError):
        if leaf.code == mcp_types.REQUEST_TIMEOUT:
            return f"did not answer within {start_timeout(cfg):g} s"
        if leaf.code == mcp_types.CONNECTION_CLOSED:
            return CLOSED
        if cfg.url is not None and leaf.message == HTTP_ERROR:
            return (
                "the server answered with an HTTP error status (a key missing or wrong in headers?)"
            )
        return one_line(f"the server refused: {leaf.message}", cfg)
    name = leaf.__class__.__name__
    detail = str(leaf)
    if cfg.url is not None:
        where = shown_url(cfg.url)
        return one_line(f"could not reach {where}: {name}: {detail}" if detail else name, cfg)
    return one_line(f"{name}: {detail}" if detail else name, cfg)


def call_error(exc: BaseException, cfg: McpServerConfig, timeout: float) -> str:
    """The ``error: ...`` result of a call that failed with ``exc``."""
    leaf = _leaf(exc)
    if isinstance(leaf, TimeoutError) or (
        isinstance(leaf, MCPError) and leaf.code == mcp_types.REQUEST_TIMEOUT
    ):
        return f"error: the tool did not answer within {timeout:g} s (its server's timeout)"
    if isinstance(leaf, MCPError):
        if "byte limit" in leaf.message:  # the SDK's words for an SSE event over its limit
            return (
                f"error: the answer was larger than {DEFAULT_MAX_SSE_EVENT_SIZE // 1024 // 1024}"
                " MiB, the most one answer over HTTP may be"
            )
        if leaf.code == mcp_types.CONNECTION_CLOSED:
            return "error: the server closed the connection during the call"
        return one_line(f"error: the server refused the call: {leaf.message}", cfg)
    return one_line(f"error: the call failed: {describe(leaf, cfg)}", cfg)


def answer_text(result: Any, budget: int) -> str:
    """A ``CallToolResult`` as text (mcp_rules.result_text), at most about ``budget`` read."""
    if not isinstance(result, mcp_types.CallToolResult):
        return "error: the server answered the call with something that is not a tool's result"
    blocks = [b.model_dump(by_alias=True, exclude_none=True) for b in result.content]
    if not blocks and result.structured_content is not None:
        blocks = [{"type": "text", "text": repr(result.structured_content)[: budget + 1]}]
    return result_text(blocks, bool(result.is_error), budget)


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: the worker's own (the logs the owner reads)."""
    stream = sys.__stderr__
    try:
        if stream is not None:
            stream.fileno()
            return stream
    except (OSError, ValueError):
        pass
    return open(os.devnull, "w")  # for the process's lifetime


@asynccontextmanager
async def open_transport(cfg: McpServerConfig) -> AsyncIterator[TransportStreams]:
    """The transport of ``cfg``: a started stdio server (terminated on exit) or an HTTP one."""
    if cfg.command is not None:
        params = StdioServerParameters(
            command=cfg.command[0],
            args=cfg.command[1:],
            env={k: v.get_secret_value() for k, v in cfg.env.items()},
            # a byte that is not UTF-8 becomes U+FFFD: "strict" ends the SDK's reading of the
            # server's output for good (every later call would time out)
            encoding_error_handler="replace",
        )
        async with stdio_client(params, errlog=_errlog()) as (read, write):
            yield read, write
    else:
        assert cfg.url is not None
        headers = {k: v.get_secret_value() for k, v in cfg.headers.items()}
        # the SDK's own client's timeouts (a server may hold a response stream open), and the
        # owner's headers (an API key) on every request
        timeout = httpx2.Timeout(HTTP_TIMEOUT, read=HTTP_READ_TIMEOUT)
        async with (
            httpx2.AsyncClient(headers=headers, timeout=timeout) as client,
            streamable_http_client(cfg.url, http_client=client) as (read, write),
        ):
            yield read, write


Listener = Callable[["Runner"], None]


class Runner:
    """One server's supervisor on the hub's loop; ``on_change`` is told of every change of its
    state or listing (on the loop's thread)."""

    def __init__(
        self,
        name: str,
        cfg: McpServerConfig,
        on_change: Listener,
        *,
        backoff: tuple[float, float],
        clock: Callable[[], float],
        ping_every: float = PING_EVERY,
    ) -> None:
        self.name, self.cfg, self._ping_every = name, cfg, ping_every
        self.session: ClientSession | None = None
        self.listing: tuple[ListedTool, ...] | None = None
        self.state, self.reason = "starting", ""
        self.since = clock()
        self.retry_at: float | None = None
        self._on_change, self._backoff, self._clock = on_change, backoff, clock
        self._stopping = False
        self._scope: anyio.CancelScope | None = None
        self._attempt_scope: anyio.CancelScope | None = None
        self._lost: str | None = None
        self._relist = asyncio.Event()
        self._garbage_told = False
        self._garbage = 0  # lines of garbage seen while up (a call's timeout may be one)
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop, done: Listener) -> None:
        """Start the task on ``loop`` (its thread); ``done`` is told when it has ended."""
        self._task = loop.create_task(self._run(), name=f"mcp:{self.name}")
        self._task.add_done_callback(lambda _: done(self))

    async def stop(self) -> None:
        """End the session (a stdio server is terminated) and the task; on the loop."""
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()
        if self._task is not None:
            await asyncio.wait({self._task})

    def _set(self, state: str, reason: str = "", retry_in: float | None = None) -> None:
        changed = state != self.state
        if changed or reason != self.reason:
            self.since = self._clock()
        self.state, self.reason = state, reason
        self.retry_at = None if retry_in is None else self._clock() + retry_in
        if state == "up" and changed:
            log.info("mcp.server_up", server=self.name, tools=len(self.listing or ()))
        elif state == "down" and changed:
            log.warning("mcp.server_down", server=self.name, reason=reason)
        self._on_change(self)

    async def _run(self) -> None:
        low, high = self._backoff
        delay = low
        try:
            with anyio.CancelScope() as self._scope:
                if self._stopping:
                    return
                while not self._stopping:
                    reason, up_for = await self._attempt()
                    self.session, self.listing = None, None
                    if self._stopping:
                        break
                    if up_for >= 10 * low:
                        delay = low  # it ran a while: a fresh start of the backoff
                    wait = delay * random.uniform(1.0, 1.25)
                    self._set("down", reason, retry_in=wait)
                    await anyio.sleep(wait)
                    delay = min(delay * 2, high)
        except Exception as exc:  # never out of the loop: this runner ends, and says so
            self.session, self.listing = None, None
            log.error("mcp.runner_failed", server=self.name, error=one_line(repr(exc)))
            self._set("down", one_line(f"the hub's session failed: {exc!r}"))
        finally:
            self.session, self.listing = None, None

    async def _attempt(self) -> tuple[str, float]:
        """One session, from start to its end: why it ended, and how long it was up."""
        self._lost, self._garbage_told = None, False
        self._relist.clear()
        up_at: float | None = None
        try:
            with anyio.CancelScope() as self._attempt_scope:
                async with open_transport(self.cfg) as (read, write):
                    send, recv = anyio.create_memory_object_stream[Item](0)
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(self._pump, read, send)
                        async with ClientSession(
                            recv,
                            write,
                            read_timeout_seconds=start_timeout(self.cfg),
                            message_handler=self._on_message,
                        ) as session:
                            with anyio.fail_after(start_timeout(self.cfg)):
                                await session.initialize()
                            await self._list(session)
                            self.session, up_at = session, time.monotonic()
                            self._set("up")
                            while True:
                                if not await self._quiet_or_relist(session):
                                    continue
                                await self._relisted(session)
            reason = self._lost or "the connection ended"
        except Exception as exc:
            # what the session failed with, unless that is only the connection's end the pump
            # saw first (with more to say: garbage, an exit); a refusal says its own words
            told = describe(exc, self.cfg)
            reason = self._lost if self._lost and told == CLOSED else told
        finally:
            self.session = None
        return reason, (time.monotonic() - up_at) if up_at is not None else 0.0

    async def _quiet_or_relist(self, session: ClientSession) -> bool:
        """Wait for the server's ``tools/list_changed`` (True). A url server quiet for
        ``ping_every`` seconds is pinged (False): one that went away while idle is found down
        now, not at the next turn's call (a stdio server's exit ends its pipe at once)."""
        if self.cfg.url is None:
            await self._relist.wait()
            return True
        with anyio.move_on_after(self._ping_every):
            await self._relist.wait()
            return True
        with anyio.fail_after(start_timeout(self.cfg)):
            try:
                await session.send_ping()
            except MCPError as exc:  # it answered (with an error, such as no ping): alive
                if exc.code == mcp_types.CONNECTION_CLOSED:
                    raise
        return False

    async def _relisted(self, session: ClientSession) -> None:
        """The server said its tools changed: listed again, at most every
        :data:`RELIST_EVERY` seconds (notifications that come faster are one), and told only
        when the listing did change (a server that says so in a loop costs one listing a
        second, and no log line)."""
        await anyio.sleep(RELIST_EVERY)
        self._relist.clear()
        before = self.listing
        await self._list(session)
        if self.listing != before:
            log.info("mcp.listing_changed", server=self.name)
            self._on_change(self)

    async def _list(self, session: ClientSession) -> None:
        tools: list[ListedTool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools += [ListedTool(t.name, t.description or "", t.input_schema) for t in page.tools]
            if len(tools) > MAX_TOOLS:
                raise ValueError(f"it lists more than {MAX_TOOLS} tools")
            cursor = page.next_cursor
            if not cursor:
                self.listing = tuple(tools)
                return
        raise ValueError(f"its tools/list goes on past {MAX_PAGES} pages")

    def _lose(self, reason: str) -> None:
        if self._lost is None and not self._stopping:
            self._lost = reason
            if self._attempt_scope is not None:
                self._attempt_scope.cancel()

    async def _pump(self, read: AsyncIterable[Item], send: MemoryObjectSendStream[Item]) -> None:
        """The transport's messages to the session; its end and its garbage to us."""
        garbage = "it wrote something that is not MCP (JSON-RPC) to the connection"
        async with send:
            try:
                async for item in read:
                    if isinstance(item, Exception):
                        if self.session is None:  # before it is up: not an MCP server
                            self._lose(garbage)
                            return
                        self._garbage += 1
                        if not self._garbage_told:
                            self._garbage_told = True
                            log.warning("mcp.garbage", server=self.name, error=one_line(str(item)))
                        continue
                    await send.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass
        self._lose("the server closed the connection (it exited or was killed)")

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._relist.set()

    async def call(self, tool: str, arguments: dict[str, Any], budget: int, timeout: float) -> str:
        """One call on the session (on the loop); never raises but for cancellation."""
        session = self.session
        if session is None:
            return f"error: the MCP server {self.name!r} is not connected ({self._why()})"
        garbage = self._garbage
        try:
            result = await session.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except Exception as exc:
            error = call_error(exc, self.cfg, timeout)
            if self._garbage > garbage and "did not answer within" in error:
                # its answer may be what it wrote that was not MCP (JSON-RPC): no id to match
                error = (f"error: no answer within {timeout:g} s; meanwhile the server wrote "
                         "something that is not MCP (JSON-RPC): a broken answer?")  # fmt: skip
            log.warning("mcp.call_failed", server=self.name, tool=tool[:64], error=error)
            leaf = _leaf(exc)
            if isinstance(leaf, MCPError) and leaf.message == "Connection closed":
                self._lose("the server closed the connection during a call")  # the session's end
            return error
        return answer_text(result, budget)

    def _why(self) -> str:
        if self.state == "down":
            return f"down: {self.reason}"
        return "still starting"
