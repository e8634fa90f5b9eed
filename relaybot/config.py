"""Configuration: ``$RELAYBOT_HOME/config.toml`` overlaid by environment variables.

Everything relaybot writes lives under ``RELAYBOT_HOME`` (default ``~/.relaybot``): the config
file, the memory database, the embedded Redis's data and the logs of processes it starts.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from relaybot.wire import Keys, describe_validation_error

DEFAULT_SYSTEM_PROMPT = (
    "You are relaybot, the owner's personal assistant. You are reached from the terminal, "
    "Matrix and e-mail. The history below spans all channels; each line is labelled "
    "[channel / sender], and 'owner' is the person you work for. Answer the last message "
    "concisely."
)


class ConfigError(RuntimeError):
    """The configuration cannot be used; the message says which key and why."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OwnerAlias(_Section):
    address: str = Field(min_length=1)
    channel: str | None = None


class OwnerConfig(_Section):
    name: str = "owner"
    aliases: list[str | OwnerAlias] = Field(default_factory=list)


class RedisConfig(_Section):
    url: SecretStr | None = None  # None: the embedded Redis under $RELAYBOT_HOME/redis
    prefix: str = "relaybot:"


class ModelConfig(_Section):
    base_url: str | None = None
    api_key: SecretStr | None = None
    model: str | None = None
    timeout: float = Field(default=60.0, gt=0)
    retries: int = Field(default=3, ge=0, le=10)
    backoff: float = Field(default=1.0, ge=0)
    max_tool_rounds: int = Field(default=5, ge=1, le=20)
    temperature: float | None = None

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)


class WorkerConfig(_Section):
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    context_tokens: int = Field(default=6000, ge=256)
    max_attempts: int = Field(default=5, ge=1)
    batch: int = Field(default=100, ge=1, le=10_000)
    lease_seconds: float = Field(default=10.0, ge=1)
    assistant_name: str = "relaybot"
    stream_retention: float = Field(default=24 * 3600.0, ge=0)  # seconds acked entries are kept


class DeliveryConfig(_Section):
    max_age: float = Field(default=24 * 3600.0, gt=0)  # seconds; older replies are not delivered


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
        "matrix:!abc:example.org" = { role = "pm", project = "alpha", teams = ["core"] }
    """

    role: str | None = Field(default=None, pattern=ROLE_NAME)
    project: str | None = Field(default=None, min_length=1, max_length=200)
    teams: list[Annotated[str, Field(pattern=ROLE_NAME)]] = Field(default_factory=list)


class Config(_Section):
    home: Path
    owner: OwnerConfig = Field(default_factory=OwnerConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    roles: dict[str, ConversationRole] = Field(default_factory=dict)

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


# environment variable -> (section, key); later entries win over earlier ones
ENV_OVERRIDES: tuple[tuple[str, str, str], ...] = (
    ("REDIS_URL", "redis", "url"),
    ("RELAYBOT_REDIS_URL", "redis", "url"),
    ("RELAYBOT_REDIS_PREFIX", "redis", "prefix"),
    ("OPENAI_BASE_URL", "model", "base_url"),
    ("RELAYBOT_MODEL_BASE_URL", "model", "base_url"),
    ("OPENAI_API_KEY", "model", "api_key"),
    ("RELAYBOT_MODEL_API_KEY", "model", "api_key"),
    ("OPENAI_MODEL", "model", "model"),
    ("RELAYBOT_MODEL", "model", "model"),
    ("RELAYBOT_MODEL_TIMEOUT", "model", "timeout"),
    ("RELAYBOT_MODEL_RETRIES", "model", "retries"),
    ("RELAYBOT_OWNER_NAME", "owner", "name"),
    ("RELAYBOT_CONTEXT_TOKENS", "worker", "context_tokens"),
    ("RELAYBOT_REPLY_MAX_AGE", "delivery", "max_age"),
    ("RELAYBOT_MEMORY_PATH", "memory", "path"),
    ("RELAYBOT_MEMORY_SYNCHRONOUS", "memory", "synchronous"),
    ("RELAYBOT_WORKSPACE", "memory", "workspace"),
)


def default_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get("RELAYBOT_HOME") or "~/.relaybot"
    return Path(raw).expanduser().resolve()


def load_config(home: Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read the config file (if any) and apply environment overrides."""
    env = os.environ if env is None else env
    home = home or default_home(env)
    data: dict[str, Any] = {}
    path = home / "config.toml"
    if path.exists():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    from_env: dict[tuple[str, str], str] = {}
    for var, section, key in ENV_OVERRIDES:
        value = env.get(var)
        if value:
            data.setdefault(section, {})[key] = value
            from_env[(section, key)] = var
    data["home"] = home
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        # a bad value that came from the environment is blamed on its variable, not on the file
        blamed = sorted(
            {from_env[loc] for err in exc.errors() if (loc := tuple(err["loc"][:2])) in from_env}
        )
        where = f"{path}" + (f" (with {', '.join(blamed)} from the environment)" if blamed else "")
        raise ConfigError(f"{where}: {describe_validation_error(exc)}") from None
