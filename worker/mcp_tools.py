"""A turn's tools from MCP servers (issue 29): offered by the turn's audience, called off the
writer, their results kept for the log.

The hub (worker/mcp_hub.py) holds the sessions on its own thread; a turn sees it through
:class:`HubPort`: a snapshot of what it knows now (the servers configured, the listings of those
that are up, the pins) and a blocking ``call``. When a turn begins (on the writer: worker/turn.py
``Turns._job``), :meth:`McpOffers.for_turn` asks worker/mcp_rules.py ``offer`` what the turn's
privacy class is offered of the snapshot, and makes each offered tool a :class:`Tool` of a
:class:`McpTurnTools`: those are all the MCP tools the turn's model is shown, and all it can
reach. A name that was not offered (a model that invents one, a stranger who names the owner's
tool) is not in the registry: ``ToolRegistry.call`` refuses it and no hub is asked.

Each call checks again, on a fresh snapshot, that the tool is still offered to this audience
and unchanged (a reload that removed the audience, a schema approved since, a server gone):
otherwise it is refused, never made. The call runs on the thread that asks (a turn's pool
thread: worker/tools.py ``OnWriter`` sends these names straight here, never to the writer), so
a slow tool never holds memory's writer. Its result is bounded and labelled as that tool's
output (``mcp_rules.labelled``), and kept (:class:`McpCall`): the turn records it in the log
with its reply (worker/ledger.py), in the turn's conversation and privacy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import structlog

from contract.mcp_config import McpServerConfig
from contract.messages import Privacy
from worker.mcp_rules import (
    RESULT_BUDGET,
    ListedTool,
    Offer,
    Offered,
    Pin,
    check_call,
    labelled,
    offer,
)
from worker.tools import OnWriter, Tool, ToolRegistry

log = structlog.get_logger(__name__)


class McpSnapshot(Protocol):
    """What the hub knows now (worker/mcp_hub.py ``McpSnapshot``, immutable): the servers
    configured, the last listing of each server that is up, the pins; ``version`` changes with
    any of them."""

    @property
    def servers(self) -> Mapping[str, McpServerConfig]: ...
    @property
    def listings(self) -> Mapping[str, tuple[ListedTool, ...]]: ...
    @property
    def pins(self) -> Mapping[str, Pin | None]: ...
    @property
    def version(self) -> int: ...


class HubPort(Protocol):
    """What a turn needs of the hub (worker/mcp_hub.py ``McpHub``; tests give a fake)."""

    def snapshot(self) -> McpSnapshot: ...

    def call(self, server: str, tool: str, arguments: dict[str, Any], *, budget: int) -> str:
        """Blocking, on the calling thread; never raises (an error is an ``error: ...`` text)."""
        ...


class WorkerHub(HubPort, Protocol):
    """What the worker's process needs of the hub besides the turns': its heartbeat source
    (worker/health.py), a reloaded ``[mcp]`` (worker/reload.py) and the owner's approval (the
    command ``mcp.approve``: worker/mcp_commands.py)."""

    def health(self) -> dict[str, Any]: ...

    def configure(self, servers: Mapping[str, McpServerConfig]) -> None: ...

    def approve(self, server: str, digest: str | None) -> dict[str, object]: ...


@dataclass(frozen=True)
class McpCall:
    """One call a turn made to an MCP tool: the name the model used, the server and its own
    name for the tool, and ``text``: the labelled result the model was given."""

    exposed: str
    server: str
    tool: str
    text: str


class McpOffers:
    """Each turn's MCP tools, from the hub's snapshot and the turn's privacy class. ``reserved``:
    every built-in tool's name (no offered name takes one); ``budget``: a result's characters."""

    def __init__(
        self, hub: HubPort, reserved: Collection[str], budget: int = RESULT_BUDGET
    ) -> None:
        self.hub, self.reserved, self.budget = hub, frozenset(reserved), budget
        self._lock = threading.Lock()
        # the offers of the snapshot in force, by privacy (a new snapshot: computed again)
        self._cache: tuple[object, dict[Privacy | None, Offer]] = (None, {})

    def offer(self, privacy: Privacy | None) -> Offer:
        """What a turn of ``privacy`` is offered now (any thread)."""
        snapshot = self.hub.snapshot()
        with self._lock:
            seen, offers = self._cache
            if seen is not snapshot:  # the hub swaps its snapshot on any change
                offers = {}
                self._cache = (snapshot, offers)
            made = offers.get(privacy)
        if made is None:
            made = offer(snapshot.servers, snapshot.listings, snapshot.pins, privacy,
                         self.reserved)  # fmt: skip
            with self._lock:
                if self._cache[0] is snapshot:
                    self._cache[1][privacy] = made
        return made

    def for_turn(self, privacy: Privacy | None, taken: Collection[str] = ()) -> McpTurnTools:
        """The MCP tools of a turn of ``privacy`` (a scope that sees nothing: None, no tool);
        ``taken``: the names of the turn's built-in tools, which keep them. A hub that fails
        here offers nothing: the turn goes on with its built-in tools."""
        try:
            offered = self.offer(privacy)
        except Exception:
            log.exception("mcp.offer_failed")
            offered = Offer()
        return McpTurnTools(self, privacy, offered, taken)


class McpTurnTools(ToolRegistry):
    """One turn's MCP tools (see the module's docstring); ``calls``: the calls made, in order."""

    def __init__(
        self,
        offers: McpOffers,
        privacy: Privacy | None,
        offered: Offer,
        taken: Collection[str] = (),
    ) -> None:
        super().__init__()
        self._offers, self._privacy = offers, privacy
        self._lock = threading.Lock()
        self.calls: list[McpCall] = []
        for item in offered.tools.values():
            if item.exposed in taken:  # a built-in tool's name (reserved missed it): not offered
                log.warning("mcp.tool_not_offered", tool=item.exposed, reason="a built-in name")
                continue
            try:
                self.register(Tool(item.exposed, item.description, item.parameters,
                                   partial(self._call, item)))  # fmt: skip
            except ValueError as exc:  # a name or schema the registry refuses: not offered
                log.warning("mcp.tool_not_offered", tool=item.exposed, reason=str(exc))

    def _call(self, offered: Offered, arguments: dict[str, Any]) -> str:
        now = check_call(offered.exposed, self._offers.offer(self._privacy).tools)
        if isinstance(now, str) or now != offered:
            reason = "no longer offered" if isinstance(now, str) else "changed"
            log.warning("mcp.call_refused", tool=offered.exposed, reason=reason)
            if isinstance(now, str):
                return now
            return (
                f"error: the tool {offered.exposed!r} changed since this turn began; "
                "the call was not made"
            )
        budget = self._offers.budget
        text = labelled(offered.exposed, self._offers.hub.call(
            offered.server, offered.tool, arguments, budget=budget), budget)  # fmt: skip
        with self._lock:
            self.calls.append(McpCall(offered.exposed, offered.server, offered.tool, text))
        return text


def turn_offer(
    offers: McpOffers | None, privacy: Privacy | None, specs: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], McpTurnTools | None]:
    """A turn's specs (``specs``: its built-in tools') with its MCP tools', and those tools (None
    without a hub). Built on the writer when the turn begins (worker/turn.py ``Turns._job``)."""
    if offers is None:
        return specs, None
    mcp = offers.for_turn(privacy, {spec["function"]["name"] for spec in specs})
    return specs + mcp.specs(), mcp


def _here(fn: Callable[[], Any]) -> Any:
    return fn()


def with_mcp(
    tools: ToolRegistry, specs: list[dict[str, Any]], mcp: McpTurnTools | None
) -> ToolRegistry:
    """A turn's built-in ``tools`` and its ``mcp`` tools as one registry on this thread (a turn
    run where it was begun: worker/turn.py ``Turns.run`` with no tools given)."""
    return tools if mcp is None else OnWriter(tools, _here, specs, direct=mcp)
