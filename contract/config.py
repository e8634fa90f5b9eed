"""Configuration: ``$RELAYBOT_HOME/config.toml`` overlaid by environment variables.

Everything relaybot writes lives under ``RELAYBOT_HOME`` (default ``~/.relaybot``): the config
file, the memory database, the embedded Redis's data and the logs of processes it starts.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
import unicodedata
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import SplitResult, unquote, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from contract import channels as registry
from contract import config_env
from contract.config_errors import describe_errors, unreadable
from contract.keys import Keys
from contract.mcp_config import McpConfig


def _reached_from() -> str:
    """The installed channels' platforms in words: "the terminal, <a platform> and <another>"."""
    named = [ch.platform or ch.name for ch in registry.channels()]
    return " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)


DEFAULT_SYSTEM_PROMPT = (
    "You are relaybot, the owner's personal assistant. You are reached from "
    f"{_reached_from()}. The history below spans all channels; each line is labelled "
    "[channel / sender], and 'owner' is the person you work for. Answer the last message "
    "concisely."
)


OWNER_NAME_FIELD = "{owner_name}"  # in worker.system_prompt: replaced by owner.name


class ConfigError(RuntimeError):
    """The configuration cannot be used; the message says which key and why."""


class ConfigUnreadable(ConfigError):
    """config.toml is there but cannot be read (a directory, a file this user may not read, a
    dangling symbolic link): ``problem`` names the file and what is wrong with it, ``fix`` the
    command that mends it (contract/config_errors.py); the message is both, in one line."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}: {fix}")
        self.problem, self.fix = problem, fix


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OwnerAlias(_Section):
    address: str = Field(min_length=1)
    channel: str | None = None


class OwnerConfig(_Section):
    name: str = "owner"
    aliases: list[str | OwnerAlias] = Field(default_factory=list)
    # the channels whose gateways are trusted to say that the owner is speaking (None: all of
    # them). The owner's turns from another channel see only their own conversation, as a
    # group would: what a stolen gateway credential can read (README, "The trust model")
    trusted_channels: list[str] | None = None
    # an IANA zone (Europe/Berlin) for the times in the model's context and the clock tool;
    # unset: the system's (contract/timezone.py: TZ, /etc/localtime, else UTC)
    timezone: str | None = None

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from contract.timezone import zone_info

        zone_info(value.strip())  # UnknownZone (a ValueError) says what to write instead
        return value.strip()

    @field_validator("trusted_channels")
    @classmethod
    def _known_channels(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        known = registry.names()
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(
                f"unknown channel(s) {', '.join(map(repr, unknown))}: the channels are "
                f"{', '.join(known)}"
            )
        return value

    def trusts(self, channel: str) -> bool:
        """Whether the owner's own turns from ``channel`` see everything."""
        return self.trusted_channels is None or channel in self.trusted_channels


def _check_port(parsed: SplitResult) -> None:
    """ValueError unless the URL's port, if it names one, is a number from 1 to 65535."""
    try:
        port = parsed.port
    except ValueError:
        raise ValueError("the port is not a number from 1 to 65535") from None
    if port == 0:
        raise ValueError("the port is not a number from 1 to 65535")


def check_redis_url(url: str) -> None:
    """ValueError, without the URL in its message, unless ``url`` is one redis-py can use:
    ``redis://``, ``rediss://`` or ``unix://``, a numeric port, a numeric database."""
    parsed = urlsplit(url)
    if parsed.scheme not in ("redis", "rediss", "unix"):
        raise ValueError("not a Redis URL: it must start with redis://, rediss:// or unix://")
    if parsed.scheme == "unix":
        if not parsed.path:
            raise ValueError(
                "a unix:// Redis URL needs the socket's path (unix:///path/redis.sock)"
            )
        return
    _check_port(parsed)
    database = unquote(parsed.path).replace("/", "")
    if database and not (database.isascii() and database.isdigit()):
        raise ValueError("the database (after the last /) is not a number")


def display_url(base_url: str) -> str:
    """The base URL without any user:password part, query or fragment (a key may ride in
    either: ``?key=...``), for messages and logs."""
    from contract.imports import lean_httpx

    lean_httpx()  # tens of ms: only for the commands that show or check a model URL
    import httpx

    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError):
        return "<invalid URL>"
    if url.userinfo:
        url = url.copy_with(username=None, password=None)
    if url.query or url.fragment:
        url = url.copy_with(query=None, fragment=None)
    return str(url)


def check_model_url(url: str) -> None:
    """ValueError, without the URL in its message (a key may ride in its query or its
    user:password part), unless ``url`` is one the model client can ask: ``http://`` or
    ``https://``, a host, a numeric port, no space or control character."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValueError("the URL holds a space or a control character")
    parsed = urlsplit(url)
    if parsed.scheme.casefold() not in ("http", "https"):
        raise ValueError(
            "not an http:// or https:// URL (e.g. http://127.0.0.1:11434/v1 for Ollama)"
        )
    _check_port(parsed)
    if not parsed.hostname:
        raise ValueError("the URL names no host (e.g. http://127.0.0.1:11434/v1)")
    if any(unicodedata.category(c) in ("Cf", "Zs", "Zl", "Zp") for c in url):
        raise ValueError("the URL holds an invisible character (pasted with it?)")
    from contract.imports import lean_httpx

    lean_httpx()
    import httpx

    try:
        httpx.URL(url)  # what the client will parse: an IDNA host, an IPv6 literal
    except httpx.InvalidURL:
        raise ValueError("the host is not a valid host name or IP address") from None


def _model_url(url: str | None) -> str | None:
    if url is not None and url != "":
        check_model_url(url)
    return url


def _one_authorization(base_url: str | None, api_key: SecretStr | None, where: str) -> None:
    """A base URL's user:password (a proxy's Basic auth) and an API key would both be the
    request's Authorization header, and the URL's would win: the key would never be sent."""
    parts = urlsplit(base_url or "")
    if base_url and api_key is not None and (parts.username or parts.password):
        raise ValueError(
            f"{where}base_url holds a user:password and api_key is set; both would be the "
            "request's Authorization header (the key would not be sent): keep one"
        )


class RedisConfig(_Section):
    url: SecretStr | None = None  # None: the embedded Redis under $RELAYBOT_HOME/redis
    prefix: str = "relaybot:"
    # seconds a command (and a connection attempt) may take before it counts as Redis being away
    socket_timeout: float = Field(default=10.0, ge=1, le=3600)
    # rediss:// only: the CA that signed the server's certificate (default: the system's), and
    # this client's certificate and key, for a server with tls-auth-clients (contract/redis_tls.py)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @model_validator(mode="after")
    def _tls_files_need_rediss(self) -> RedisConfig:
        named = [k for k in ("ca_file", "cert_file", "key_file") if getattr(self, k) is not None]
        url = self.url.get_secret_value() if self.url is not None else ""
        if named and not url.startswith("rediss://"):
            raise ValueError(
                f"{', '.join(named)} set, but the Redis URL is not rediss:// (TLS): "
                "use rediss:// or leave the TLS files out"
            )
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file set without cert_file: give the client certificate too")
        return self

    @field_validator("url")
    @classmethod
    def _a_redis_url(cls, url: SecretStr | None) -> SecretStr | None:
        """What redis-py would refuse at the first connection (a ValueError deep in a command)
        is refused here, as a configuration error that never shows the URL (its password)."""
        if url is not None:
            check_redis_url(url.get_secret_value())
        return url


class LogsConfig(_Section):
    """``[logs]``: ``format`` is ``auto`` (readable lines on a terminal or under honcho, JSON
    lines otherwise), ``console`` or ``json`` (contract/logs.py); ``RELAYBOT_LOG_FORMAT`` wins."""

    format: Literal["auto", "console", "json"] = "auto"


class DeriveModelConfig(_Section):
    """``[model.derive]``: a cheaper endpoint or model for derived work (summaries); what is
    not set here is taken from ``[model]``."""

    base_url: str | None = None
    api_key: SecretStr | None = None
    model: str | None = None
    timeout: float | None = Field(default=None, gt=0)
    temperature: float | None = None

    @field_validator("base_url")
    @classmethod
    def _a_model_url(cls, url: str | None) -> str | None:
        return _model_url(url)


class ModelConfig(_Section):
    base_url: str | None = None
    api_key: SecretStr | None = None
    model: str | None = None
    timeout: float = Field(default=60.0, gt=0)
    retries: int = Field(default=3, ge=0, le=10)
    backoff: float = Field(default=1.0, ge=0)
    max_tool_rounds: int = Field(default=5, ge=1, le=20)
    temperature: float | None = None
    # turns that may ask this endpoint at once (a local llama.cpp: 1, or its parallel slots; a
    # hosted API: many); with 2 or more, one of them is kept for the owner's own conversations.
    # 8 by default: a hosted endpoint takes that many at once, and the turns started together
    # share one memory commit (with 4, the commits per message capped the worker below
    # 2,000 msg/s with an instant model: bench.pipeline)
    concurrency: int = Field(default=8, ge=1, le=256)
    derive: DeriveModelConfig | None = None

    @field_validator("base_url")
    @classmethod
    def _a_model_url(cls, url: str | None) -> str | None:
        return _model_url(url)

    @model_validator(mode="after")
    def _one_authorization_each(self) -> ModelConfig:
        _one_authorization(self.base_url, self.api_key, "")
        if self.derive is not None:
            d = self.for_derive()
            _one_authorization(d.base_url, d.api_key, "derive: ")
        return self

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)

    def for_derive(self) -> ModelConfig:
        """The endpoint derived work uses: ``[model.derive]`` over ``[model]``."""
        d = self.derive
        if d is None:
            return self.model_copy(update={"derive": None})
        update: dict[str, Any] = {"derive": None}
        for key in ("base_url", "api_key", "model", "timeout", "temperature"):
            value = getattr(d, key)
            if value is not None:
                update[key] = value
        return self.model_copy(update=update)


class DeriveConfig(_Section):
    """``[derive]``: layer 1, conversation summaries (worker/derive.py). A conversation quiet for
    ``judge_after`` seconds is shown to the model, which judges whether it paused; quiet for
    ``quiet`` seconds (or no model), it counts as paused. An open segment needs ``min_rows``
    rows; a summary covers at most ``max_rows``."""

    enabled: bool = True
    judge_after: float = Field(default=120.0, ge=0)
    quiet: float = Field(default=1800.0, ge=0)
    min_rows: int = Field(default=4, ge=1)
    max_rows: int = Field(default=200, ge=2, le=2000)
    check_every: float = Field(default=30.0, gt=0)


class ScheduleConfig(_Section):
    """``[schedule]``: reminders and recurring tasks (worker/schedule*.py, README "Scheduling").

    Who may schedule: the owner anywhere; a contact only when ``contacts`` is true, only in
    their own direct conversation, with at most ``contact_max_items`` items waiting, at most
    ``contact_per_hour`` new items an hour and a recurrence no more often than
    ``contact_min_every`` seconds. Nobody's recurrence is more often than ``min_every`` (60 s:
    a 5-field cron is at most once a minute). An occurrence more than ``grace`` seconds late
    is handled by its ``late`` policy (``deliver``: once, saying how late; ``skip``). The
    worker looks for items that need their rq job every ``check_every`` seconds."""

    enabled: bool = True
    contacts: bool = False
    grace: float = Field(default=300.0, ge=0)
    late: Literal["deliver", "skip"] = "deliver"
    owner_max_items: int = Field(default=1000, ge=1)
    contact_max_items: int = Field(default=5, ge=0)
    contact_per_hour: int = Field(default=10, ge=0)
    contact_min_every: float = Field(default=3600.0, ge=60)
    min_every: float = Field(default=60.0, ge=60)
    check_every: float = Field(default=1.0, gt=0)


class ProfilesConfig(_Section):
    """``[profiles]``: layer 2, entity profiles and capability gaps (worker/profile_derive.py).

    Every ``check_every`` seconds the worker enqueues a profile job for each layer-1 summary not
    derived yet (at most ``batch`` a round; with no model, profiles wait). The context gives the
    profile section ``context_share`` of its budget, at most ``max_context_facts`` facts;
    ``todo`` has the open capability gaps written to ``TODO.md`` in the home."""

    enabled: bool = True
    check_every: float = Field(default=30.0, gt=0)
    batch: int = Field(default=20, ge=1, le=1000)
    context_share: float = Field(default=0.15, ge=0, le=0.5)
    max_context_facts: int = Field(default=20, ge=0, le=1000)
    todo: bool = True

    @property
    def shown_facts(self) -> int:
        """The facts a turn's profile section may show (none while layer 2 is off)."""
        return self.max_context_facts if self.enabled else 0


class WorkerConfig(_Section):
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    context_tokens: int = Field(default=6000, ge=256)
    max_attempts: int = Field(default=5, ge=1)
    batch: int = Field(default=100, ge=1, le=10_000)
    lease_seconds: float = Field(default=10.0, ge=1)
    assistant_name: str = "relaybot"
    stream_retention: float = Field(default=24 * 3600.0, ge=0)  # seconds acked entries are kept
    # An inbound entry beyond any of these is dead-lettered as it is read (worker/deadletter.py),
    # so that no entry a gateway can write makes the worker hold more than a bounded copy.
    max_entry_fields: int = Field(default=64, ge=12)  # the contract has 12 fields
    max_field_bytes: int = Field(default=1 << 20, ge=65_536)  # one field's name or value
    max_entry_bytes: int = Field(default=2 << 20, ge=65_536)  # all names and values of an entry
    # The dead-letter stream keeps at most about this many entries, none older than this.
    dead_max_len: int = Field(default=10_000, ge=1)
    dead_retention: float = Field(default=30 * 24 * 3600.0, gt=0)  # seconds


TurnMode = Literal["collect", "followup"]


class TurnsConfig(_Section):
    """How messages that arrive while their session's turn runs are answered: ``collect`` (one
    turn answers all of them, in order, with one reply) or ``followup`` (one turn per message).
    ``mode`` is the default; ``channels`` and ``conversations`` set it per channel or per
    conversation id (the conversation wins)."""

    mode: TurnMode = "collect"
    channels: dict[str, TurnMode] = Field(default_factory=dict)
    conversations: dict[str, TurnMode] = Field(default_factory=dict)

    def mode_of(self, channel: str, conversation: str) -> TurnMode:
        return self.conversations.get(conversation) or self.channels.get(channel) or self.mode


class DeliveryConfig(_Section):
    max_age: float = Field(default=24 * 3600.0, gt=0)  # seconds; older replies are not delivered
    # a session whose send failed (SMTP 4xx, greylisting, a server down) is tried again after
    # retry_min seconds, doubling up to retry_max, until it is sent or older than max_age
    retry_min: float = Field(default=5.0, gt=0)
    retry_max: float = Field(default=300.0, gt=0)


class MemoryConfig(_Section):
    path: Path | None = None  # default: $RELAYBOT_HOME/memory.sqlite3
    synchronous: str = Field(default="NORMAL", pattern="^(OFF|NORMAL|FULL|EXTRA)$")
    workspace: Path | None = None  # default: $RELAYBOT_HOME/workspace (holds MEMORY.md)


ROLE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class ConversationRole(_Section):
    """How one conversation (room, thread, terminal session) runs: under which agent role, in
    which project, and in which teams (seed 003; these decide which scoped notes it sees).

    In ``config.toml`` the ``[roles]`` table maps a conversation or session id to a role name or
    to a table of these keys::

        [roles]
        "cli:work" = "architect"
        "room:!abc:example.org" = { role = "pm", project = "alpha", teams = ["core"] }
    """

    role: str | None = Field(default=None, pattern=ROLE_NAME)
    project: str | None = Field(default=None, min_length=1, max_length=200)
    teams: list[Annotated[str, Field(pattern=ROLE_NAME)]] = Field(default_factory=list)


class CoreConfig(_Section):
    """The sections every installation has; :data:`Config` adds one per registered channel
    (contract/channels.py), validated by the channel's own model."""

    home: Path
    owner: OwnerConfig = Field(default_factory=OwnerConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    turns: TurnsConfig = Field(default_factory=TurnsConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    logs: LogsConfig = Field(default_factory=LogsConfig)
    roles: dict[str, ConversationRole] = Field(default_factory=dict)
    derive: DeriveConfig = Field(default_factory=DeriveConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    profiles: ProfilesConfig = Field(default_factory=ProfilesConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)  # [mcp.servers.NAME] (issue 29)

    @field_validator("roles", mode="before")
    @classmethod
    def _role_names(cls, value: Any) -> Any:
        """``"cli:work" = "architect"`` is short for ``"cli:work" = { role = "architect" }``."""
        if isinstance(value, Mapping):
            return {k: {"role": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    def conversation_role(self, conversation: str, session: str = "") -> ConversationRole:
        """The ``[roles]`` entry of a conversation (looked up by conversation id, then by
        session id); an empty one (no role, no project, no teams) when there is none."""
        found = self.roles.get(conversation) or (self.roles.get(session) if session else None)
        return found or ConversationRole()

    @property
    def owner_aliases(self) -> list[str | OwnerAlias]:
        """Every alias of the owner: ``owner.aliases``, and the owner's addresses a channel's
        section lists (its ``owner_addresses``), scoped to that channel."""
        extra = [
            OwnerAlias(address=a, channel=ch.name)
            for ch in registry.channels()
            if ch.owner_addresses is not None
            for a in ch.owner_addresses(getattr(self, ch.name))
        ]
        return [*self.owner.aliases, *extra]

    @property
    def system_prompt(self) -> str:
        """The system prompt the model gets: ``worker.system_prompt`` with the owner's name.

        ``{owner_name}`` in the prompt is replaced by ``owner.name``; a prompt without it gets one
        sentence naming the owner appended (none while the name is the default ``owner``)."""
        prompt, name = self.worker.system_prompt, self.owner.name.strip()
        if OWNER_NAME_FIELD in prompt:
            return prompt.replace(OWNER_NAME_FIELD, name or "owner")
        if not name or name == "owner":
            return prompt
        return f"{prompt.rstrip()} The owner's name is {name}; the history calls them 'owner'."

    @property
    def keys(self) -> Keys:
        return Keys(self.redis.prefix)

    @property
    def embedded_redis(self) -> bool:
        return self.redis.url is None

    @property
    def memory_path(self) -> Path:
        return self.memory.path or self.home / "memory.sqlite3"

    @property
    def workspace_dir(self) -> Path:
        """The owner's workspace: MEMORY.md lives here."""
        return self.memory.workspace or self.home / "workspace"

    @property
    def redis_dir(self) -> Path:
        return self.home / "redis"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def config_file(self) -> Path:
        return self.home / "config.toml"


@cache
def _config_class(specs: tuple[registry.Channel, ...]) -> type[CoreConfig]:
    sections: dict[str, Any] = {
        ch.name: (ch.section, Field(default_factory=ch.section))
        for ch in specs
        if ch.section is not None
    }
    model: type[CoreConfig] = create_model(
        "Config", __base__=CoreConfig, __module__=__name__, **sections
    )
    return model


def config_class() -> type[CoreConfig]:
    """The configuration's model: :class:`CoreConfig` with a section per registered channel."""
    return _config_class(registry.channels())


if TYPE_CHECKING:
    Config = CoreConfig
else:

    def __getattr__(name: str) -> Any:
        """``Config`` is built on first use, once the channels are known (the registry)."""
        if name == "Config":
            return config_class()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# environment variable -> (section, key); later entries win over earlier ones. A channel's own
# variables are in its spec (contract/channels.py): env_overrides() has both.
ENV_OVERRIDES: tuple[tuple[str, str, str], ...] = (
    ("REDIS_URL", "redis", "url"),
    ("RELAYBOT_REDIS_URL", "redis", "url"),
    ("RELAYBOT_REDIS_PREFIX", "redis", "prefix"),
    ("RELAYBOT_REDIS_SOCKET_TIMEOUT", "redis", "socket_timeout"),
    ("RELAYBOT_LOG_FORMAT", "logs", "format"),
    ("OPENAI_BASE_URL", "model", "base_url"),
    ("RELAYBOT_MODEL_BASE_URL", "model", "base_url"),
    ("OPENAI_API_KEY", "model", "api_key"),
    ("RELAYBOT_MODEL_API_KEY", "model", "api_key"),
    ("OPENAI_MODEL", "model", "model"),
    ("RELAYBOT_MODEL", "model", "model"),
    ("RELAYBOT_MODEL_TIMEOUT", "model", "timeout"),
    ("RELAYBOT_MODEL_RETRIES", "model", "retries"),
    ("RELAYBOT_OWNER_NAME", "owner", "name"),
    ("RELAYBOT_TIMEZONE", "owner", "timezone"),
    ("RELAYBOT_CONTEXT_TOKENS", "worker", "context_tokens"),
    ("RELAYBOT_MODEL_CONCURRENCY", "model", "concurrency"),
    ("RELAYBOT_TURNS_MODE", "turns", "mode"),
    ("RELAYBOT_REPLY_MAX_AGE", "delivery", "max_age"),
    ("RELAYBOT_MEMORY_PATH", "memory", "path"),
    ("RELAYBOT_MEMORY_SYNCHRONOUS", "memory", "synchronous"),
    ("RELAYBOT_WORKSPACE", "memory", "workspace"),
)


def env_overrides() -> tuple[tuple[str, str, str], ...]:
    """Every environment variable that overrides a key: ``(variable, section, key)``, the
    core sections' then each registered channel's."""
    own = tuple((var, ch.name, key) for ch in registry.channels() for var, key in ch.env)
    return ENV_OVERRIDES + own


def apply_env(data: dict[str, Any], env: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """Set in ``data`` (config.toml's tables) what the environment sets: the named variables of
    :func:`env_overrides`, then every ``RELAYBOT_<SECTION>__<KEY>`` (contract/config_env.py),
    which wins. Returns ``(section, key) -> variable``; :class:`ConfigError` for a variable of
    that form that names no key or holds an unreadable value."""
    from_env: dict[tuple[str, str], str] = {}
    for var, section, key in env_overrides():
        value = env.get(var)
        if value:
            data.setdefault(section, {})[key] = value
            from_env[(section, key)] = var
    try:
        from_env |= config_env.apply(data, env, config_class())
    except config_env.EnvError as exc:
        raise ConfigError(f"environment: {exc}") from None
    return from_env


def default_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get("RELAYBOT_HOME") or "~/.relaybot"
    return Path(raw).expanduser().resolve()


def load_config(home: Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read the config file (if any) and apply environment overrides."""
    env = os.environ if env is None else env
    home = home or default_home(env)
    return parse_config(read_config_bytes(home), home, env)


def read_config_bytes(home: Path) -> bytes | None:
    """The bytes of ``home/config.toml``; None when there is no such file.
    :class:`ConfigUnreadable` when there is one that cannot be read: a directory, a file this
    user may not read (root's after a ``sudo`` edit), a symbolic link to nothing (a file meant to
    be there: not taken for "no file", which would run with the defaults)."""
    path = home / "config.toml"
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        if path.is_symlink():
            raise ConfigUnreadable(*unreadable(path, exc)) from None
        return None
    except OSError as exc:
        raise ConfigUnreadable(*unreadable(path, exc)) from None


def config_digest(raw: bytes | None) -> str:
    """What a process reports as the config it runs with (its heartbeat's ``config``): the first
    12 hex digits of the SHA-256 of config.toml's bytes; ``"none"`` without a file."""
    return "none" if raw is None else hashlib.sha256(raw).hexdigest()[:12]


def parse_config(raw: bytes | None, home: Path, env: Mapping[str, str] | None = None) -> Config:
    """The configuration of ``home`` from config.toml's bytes (None: no file) and the
    environment; :class:`ConfigError` says which key is wrong and why."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    path = home / "config.toml"
    if raw is not None:
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    from_env = apply_env(data, env)
    data["home"] = home
    try:
        return config_class().model_validate(data)
    except ValidationError as exc:
        # a bad value that came from the environment is blamed on its variable, not on the file
        blamed = sorted(
            {from_env[loc] for err in exc.errors() if (loc := tuple(err["loc"][:2])) in from_env}
        )
        where = f"{path}" + (f" (with {', '.join(blamed)} from the environment)" if blamed else "")
        raise ConfigError(f"{where}: {describe_errors(exc, config_class())}") from None
