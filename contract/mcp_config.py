"""``[mcp.servers.NAME]``: the MCP servers whose tools the model may be offered (issue 29).

One table per server::

    [mcp.servers.files]
    command = ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/home/ada/notes"]
    env = { LOG_LEVEL = "warn" }
    audiences = ["owner"]          # the default: the owner's own conversations only
    tools = ["read_file"]          # an allowlist of the server's own tool names; default: all
    timeout = 30                   # seconds one call may take

    [mcp.servers.weather]
    url = "http://127.0.0.1:8931/mcp"   # streamable HTTP
    headers = { Authorization = "Bearer ..." }   # sent with every request (secrets)
    audiences = ["owner", "direct", "group"]

A server is started as a subprocess (``command``: stdio) or reached at a ``url`` (streamable
HTTP): exactly one of the two. ``audiences`` are the privacy classes (contract/messages.py
``Privacy``) whose turns may be offered its tools. NAME becomes the prefix of the tools' names as
the model sees them (``NAME_tool``: worker/mcp_rules.py), so it holds only what such a prefix
may: lowercase letters, digits and hyphens, at most :data:`MAX_SERVER_NAME` characters, and no
underscore, so that the first underscore of an offered name always ends the server's name.

Pure data and validation: nothing here starts, reaches or trusts a server.
"""

from __future__ import annotations

import json
import re
import shlex
import unicodedata
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from contract.messages import Privacy

MAX_SERVER_NAME = 24  # leaves 39 characters of the model API's 64 for the tool's own name
SERVER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")  # an HTTP token (RFC 9110)
# headers the HTTP transport sets itself: one of ours would break the protocol
OWN_HEADERS = frozenset(
    {"host", "content-length", "content-type", "accept", "connection", "transfer-encoding",
     "mcp-session-id", "mcp-protocol-version"}
)  # fmt: skip
DEFAULT_TIMEOUT = 30.0  # seconds one tool call may take (a listing, a start, a call)
MAX_TIMEOUT = 3600.0


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def server_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an MCP server (one line that says what to write), or None."""
    if not name:
        return "a server's name is empty: name it, e.g. [mcp.servers.files]"
    if len(name) > MAX_SERVER_NAME:
        return (
            f"server name {name[:MAX_SERVER_NAME]!r}... is {len(name)} characters long: "
            f"at most {MAX_SERVER_NAME} (it prefixes each of its tools' names)"
        )
    if SERVER_NAME.match(name):
        return None
    suggestion = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:MAX_SERVER_NAME]
    hint = f" (e.g. {suggestion!r})" if suggestion and SERVER_NAME.match(suggestion) else ""
    return (
        f"server name {name!r} may hold only lowercase letters, digits and hyphens, and start "
        f"with a letter or digit{hint}: it prefixes its tools' names as NAME_tool"
    )


def check_mcp_url(url: str) -> None:
    """ValueError, without the URL in its message (a token may ride in its query or its
    user:password part), unless ``url`` is an ``http://`` or ``https://`` URL with a host."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValueError("the url holds a space or a control character")
    if any(unicodedata.category(c) in ("Cf", "Zs", "Zl", "Zp") for c in url):
        raise ValueError("the url holds an invisible character (pasted with it?)")
    parsed = urlsplit(url)
    if parsed.scheme.casefold() not in ("http", "https"):
        raise ValueError(
            "the url is not http:// or https:// (a streamable HTTP endpoint, e.g. "
            "http://127.0.0.1:8931/mcp); a server started by relaybot takes command = [...]"
        )
    try:
        port = parsed.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError("the url's port is not a number from 1 to 65535")
    if not parsed.hostname:
        raise ValueError("the url names no host (e.g. http://127.0.0.1:8931/mcp)")


class McpServerConfig(_Section):
    """One ``[mcp.servers.NAME]`` table (see the module's docstring)."""

    command: list[str] | None = None
    url: str | None = None
    env: dict[str, SecretStr] = Field(default_factory=dict)
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    audiences: list[Privacy] = Field(default_factory=lambda: [Privacy.OWNER])
    tools: list[str] | None = None
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0, le=MAX_TIMEOUT)

    @field_validator("command", mode="before")
    @classmethod
    def _a_list(cls, value: Any) -> Any:
        """``command = "npx server"`` is refused with the list to write: it is never split by a
        shell (a path with a space would become two arguments)."""
        if isinstance(value, str):
            try:
                parts = shlex.split(value)
            except ValueError:  # an unclosed quote
                parts = value.split()
            # the program, not its arguments: one may be a secret (--api-key ...), and this
            # message reaches the heartbeat (contract/config_watch.py public_error)
            program = json.dumps(parts[0][:80]) if parts else '"program"'
            more = f", ... ({len(parts) - 1} more, each in quotes)" if len(parts) > 1 else ""
            raise ValueError(
                f"command is a list of the program and its arguments: [{program}{more}]"
            )
        return value

    @field_validator("command")
    @classmethod
    def _a_command(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("command is empty: give the program and its arguments as a list")
        if not value[0].strip():
            raise ValueError("command's first item (the program) is empty")
        if any("\x00" in part for part in value):
            raise ValueError("command holds a NUL character")
        return value

    @field_validator("url")
    @classmethod
    def _an_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_mcp_url(value)
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        bad = sorted(k for k in value if not ENV_NAME.match(k))
        if bad:
            raise ValueError(
                f"env name(s) {', '.join(map(repr, bad))} are not environment variable names "
                "(letters, digits and _, not starting with a digit)"
            )
        if any("\x00" in v.get_secret_value() for v in value.values()):
            raise ValueError("an env value holds a NUL character")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        bad = [k for k in value if not HEADER_NAME.match(k)]
        if bad:  # not shown: a name may be a whole "Authorization: Bearer ..." line
            raise ValueError(
                f"{len(bad)} header name(s) are not HTTP header names (letters, digits and -, "
                'e.g. headers = { Authorization = "Bearer ..." }: the value after =)'
            )
        own = sorted(k for k in value if k.casefold() in OWN_HEADERS)
        if own:
            raise ValueError(
                f"header(s) {', '.join(own)} are set by the MCP transport itself: remove them"
            )
        for name, secret in value.items():  # a value is never shown: it is a secret
            text = secret.get_secret_value()
            if any(c in text for c in "\r\n\x00") or not text.isascii():
                raise ValueError(
                    f"header {name}'s value holds a line break, a NUL or a non-ASCII character"
                )
        return value

    @field_validator("audiences")
    @classmethod
    def _some_audience(cls, value: list[Privacy]) -> list[Privacy]:
        if not value:
            raise ValueError(
                "audiences is empty: no turn would be offered this server's tools; name "
                "owner, direct or group, or remove the server"
            )
        return list(dict.fromkeys(value))  # in the order written, each once

    @field_validator("tools")
    @classmethod
    def _an_allowlist(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError(
                "tools is empty: no tool would be offered; leave it out to offer all of the "
                "server's tools, or name them"
            )
        if any(not t.strip() for t in value):
            raise ValueError("tools holds an empty name")
        return list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if self.command is None and self.url is None:
            raise ValueError(
                "neither command nor url: give command = [...] for a server relaybot starts "
                '(stdio) or url = "http://..." for one it reaches (streamable HTTP)'
            )
        if self.command is not None and self.url is not None:
            raise ValueError(
                "both command and url: a server is either started or reached; keep one"
            )
        if self.url is not None and self.env:
            raise ValueError(
                "env is set for a url server: env is given to a server relaybot starts "
                "(command); remove it"
            )
        if self.command is not None and self.headers:
            raise ValueError(
                "headers are set for a command server: headers are sent to a server relaybot "
                "reaches (url); a started one takes env"
            )
        return self

    def offered_to(self, privacy: Privacy) -> bool:
        """Whether a turn of this privacy class may be offered this server's tools."""
        return privacy in self.audiences


RESULT_CHARS = 12_000  # characters of a tool's result given to the model, label included
MAX_RESULT_CHARS = 16_000  # what worker/tools.py lets any tool's result be


class McpConfig(_Section):
    """``[mcp]``: the servers, by name (``[mcp.servers.NAME]``), and ``result_chars``: how much
    of a tool's result the model is given (and the log keeps), its label included."""

    servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    result_chars: int = Field(default=RESULT_CHARS, ge=500, le=MAX_RESULT_CHARS)

    @field_validator("servers", mode="before")
    @classmethod
    def _server_names(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name in value:
                problem = server_name_problem(str(name))
                if problem is not None:
                    raise ValueError(problem)
        return value
