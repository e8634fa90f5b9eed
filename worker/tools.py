"""The agent's tools: a small registry and the built-in ones.

A tool is a name, a description, a JSON-schema for its arguments and a handler that turns the
decoded arguments into text for the model. :meth:`ToolRegistry.call` never raises: an unknown
tool, arguments that do not fit the schema, and a handler that fails all come back as a short
``error: ...`` string, so the model can read what went wrong and carry on.

No tool sends a message. A turn has exactly one way to reach a person: its reply.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog

log = structlog.get_logger(__name__)

MAX_RESULT_CHARS = 16_000  # a longer tool result is cut, with a note, to protect the context
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI-compatible servers accept

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}

Handler = Callable[[dict[str, Any]], str]


class ToolArgumentError(ValueError):
    """Arguments that do not fit a tool's schema; the message says which and why."""


@dataclass(frozen=True)
class Tool:
    """One tool the model may call."""

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler = field(compare=False)

    def __post_init__(self) -> None:
        if not _TOOL_NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r} must match {_TOOL_NAME.pattern}")
        if self.parameters.get("type", "object") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema object")

    def spec(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def _type_ok(value: object, expected: str | list[str]) -> bool:
    names = [expected] if isinstance(expected, str) else expected
    for name in names:
        types = _JSON_TYPES.get(name)
        if types is None:
            return True  # a type we do not check
        if isinstance(value, bool) and name in ("integer", "number"):
            continue  # JSON true is not a number
        if isinstance(value, types):
            return True
        if name == "integer" and isinstance(value, float) and value.is_integer():
            return True
    return False


def check_arguments(schema: dict[str, Any], arguments: object) -> dict[str, Any]:
    """A light check of the top level of ``arguments`` against an object schema.

    Checks what models get wrong in practice: not an object, a required key missing, a key
    that is not allowed, a value of the wrong JSON type or outside its ``enum``.
    """
    if not isinstance(arguments, dict):
        raise ToolArgumentError("arguments must be a JSON object")
    properties: dict[str, Any] = schema.get("properties") or {}
    missing = [key for key in schema.get("required") or [] if key not in arguments]
    if missing:
        raise ToolArgumentError(f"missing required argument(s): {', '.join(missing)}")
    if schema.get("additionalProperties") is False:
        unknown = sorted(str(key) for key in arguments if key not in properties)
        if unknown:
            allowed = ", ".join(properties) or "none"
            raise ToolArgumentError(
                f"unknown argument(s): {', '.join(unknown)} (allowed: {allowed})"
            )
    for key, value in arguments.items():
        prop = properties.get(key)
        if not isinstance(prop, dict):
            continue
        expected = prop.get("type")
        if expected is not None and not _type_ok(value, expected):
            raise ToolArgumentError(f"argument {key!r} must be of type {expected}")
        enum = prop.get("enum")
        if isinstance(enum, list) and value not in enum:
            raise ToolArgumentError(f"argument {key!r} must be one of {enum}")
    return arguments


def _clip(text: str) -> str:
    if len(text) <= MAX_RESULT_CHARS:
        return text
    cut = len(text) - MAX_RESULT_CHARS
    return f"{text[:MAX_RESULT_CHARS]}\n[... {cut} more characters cut]"


class ToolRegistry:
    """The tools offered to the model in a turn, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def specs(self) -> list[dict[str, Any]]:
        """The ``tools`` list for a chat-completions request (empty if there are none)."""
        return [tool.spec() for tool in self._tools.values()]

    def call(self, name: str, arguments: object) -> str:
        """Run a tool and return its text; every failure becomes an ``error: ...`` string."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            log.warning("tool.unknown", tool=name)
            return f"error: there is no tool named {name!r} (available: {known})"
        try:
            checked = check_arguments(tool.parameters, arguments)
        except ToolArgumentError as exc:
            log.warning("tool.bad_arguments", tool=name, reason=str(exc))
            return f"error: bad arguments for {name}: {exc}"
        try:
            result = tool.handler(checked)
        except Exception as exc:
            log.warning("tool.failed", tool=name, error=type(exc).__name__, exc_info=True)
            return f"error: tool {name} failed: {type(exc).__name__}: {exc}"
        text = result if isinstance(result, str) else str(result)
        log.info("tool.called", tool=name, result_chars=len(text))
        return _clip(text)


class LazyTools(ToolRegistry):
    """A turn's tools, built only when something other than :meth:`specs` is needed (in practice:
    when the model calls one). ``specs`` come from ``shared_specs``, computed by the first turn
    of the same *shape* (whatever decides which tools a turn offers and how they read), so a
    turn whose model answers without tools never builds its tools at all."""

    def __init__(
        self,
        build: Callable[[], Iterable[Tool]],
        shape: Hashable,
        shared_specs: dict[Hashable, list[dict[str, Any]]],
    ) -> None:
        super().__init__()
        self._build: Callable[[], Iterable[Tool]] | None = build
        self._shape = shape
        self._shared = shared_specs

    def _ensure(self) -> None:
        build = self._build
        if build is not None:
            tools = list(build())  # a builder that fails leaves nothing half-registered
            self._build = None
            for tool in tools:
                super().register(tool)

    def specs(self) -> list[dict[str, Any]]:
        specs = self._shared.get(self._shape)
        if specs is None:
            self._ensure()
            specs = self._shared[self._shape] = super().specs()
        return list(specs)

    def register(self, tool: Tool) -> None:
        self._ensure()
        super().register(tool)

    def get(self, name: str) -> Tool | None:
        self._ensure()
        return super().get(name)

    @property
    def names(self) -> list[str]:
        self._ensure()
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        self._ensure()
        return super().__contains__(name)

    def __len__(self) -> int:
        self._ensure()
        return super().__len__()

    def __iter__(self) -> Iterator[Tool]:
        self._ensure()
        return super().__iter__()

    def call(self, name: str, arguments: object) -> str:
        """:meth:`ToolRegistry.call`, which never raises: tools that cannot be built are an
        ``error: ...`` string for the model too."""
        try:
            self._ensure()
        except Exception as exc:
            log.exception("tool.setup_failed", tool=name)
            return f"error: the tools could not be set up: {type(exc).__name__}: {exc}"
        return super().call(name, arguments)


class OnWriter(ToolRegistry):
    """A turn's tools as seen from a pool thread (worker/pool.py): every call, and the specs,
    run on the worker's writer thread through ``on_writer``, so tools that read memory use
    the writer's connection and see what it has written. A name of ``direct`` (the turn's MCP
    tools: worker/mcp_tools.py) is called on the calling thread instead, never on the writer: a
    slow server must not hold memory's writer."""

    def __init__(
        self,
        inner: ToolRegistry,
        on_writer: Callable[[Callable[[], Any]], Any],
        specs: list[dict[str, Any]],
        direct: ToolRegistry | None = None,
    ) -> None:
        super().__init__()
        self._inner, self._on_writer, self._specs = inner, on_writer, specs
        self._direct = direct

    def specs(self) -> list[dict[str, Any]]:
        """Taken on the writer when the turn started (most turns call no tool: no hand-over)."""
        return list(self._specs)

    def call(self, name: str, arguments: object) -> str:
        direct = self._direct
        if direct is not None and name in direct:  # a plain registry: no build, no writer
            return direct.call(name, arguments)
        # the call runs in this thread's context (the turn's log fields: channel, session,
        # stream id), not in whatever the writer has bound
        context = contextvars.copy_context()
        result: str = self._on_writer(lambda: context.run(self._inner.call, name, arguments))
        return result


# -- built-in tools ----------------------------------------------------------------------------


def _utc_now() -> datetime:
    return datetime.now(UTC)


def clock_tool(now: Callable[[], datetime] = _utc_now, owner_zone: tzinfo | None = None) -> Tool:
    """``clock``: the current date and time, in the owner's time zone (``[owner] timezone``,
    else the system's: contract/timezone.py; None: UTC) or in a given IANA time zone."""
    default = getattr(owner_zone, "key", None)  # a ZoneInfo's IANA name; UTC has none

    def handler(arguments: dict[str, Any]) -> str:
        utc = now().astimezone(UTC).replace(microsecond=0)
        zone_name = arguments.get("timezone") or default
        if zone_name is None or zone_name in ("", "UTC", "Etc/UTC", "Z"):
            return f"{utc.isoformat()} ({utc:%A}, UTC)"
        try:
            zone = ZoneInfo(zone_name)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            return (
                f"error: unknown time zone {zone_name!r}; "
                "use an IANA name such as 'Europe/Berlin' or 'America/New_York'"
            )
        local = utc.astimezone(zone)
        return f"{local.isoformat()} ({local:%A}, {zone_name}); UTC {utc.isoformat()}"

    return Tool(
        name="clock",
        description=(
            "The current date and time in ISO 8601, in the owner's time zone, or in the "
            "given IANA time zone."
        ),
        parameters={
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    "description": "An IANA time zone such as 'Europe/Berlin'; default: "
                    "the owner's.",
                }
            },
            "additionalProperties": False,
        },
        handler=handler,
    )


def default_tools(owner_zone: tzinfo | None = None) -> ToolRegistry:
    """The registry the worker uses: today just the clock (in the owner's zone)."""
    return ToolRegistry([clock_tool(owner_zone=owner_zone)])
