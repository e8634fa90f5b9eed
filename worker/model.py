"""What the agent needs from a model (:class:`ModelPort`), and what it gets back.

The agent (worker/agent.py) talks to this interface only. worker/openai_client.py implements it
for any OpenAI-compatible endpoint; :class:`NoModel` stands in when none is configured. A model
adapter raises only :class:`ModelError`, whose text a user can read.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

NO_MODEL_TEXT = (
    "No model is configured, so I cannot answer yet.\n"
    "Set one in config.toml (in $RELAYBOT_HOME, default ~/.relaybot):\n"
    "\n"
    "    [model]\n"
    '    base_url = "http://127.0.0.1:11434/v1"   # any OpenAI-compatible endpoint\n'
    '    model = "llama3.1"\n'
    '    api_key = "..."                          # only if the endpoint needs one\n'
    "\n"
    "(a running worker picks up config.toml within seconds; `relaybot onboard` asks for it), "
    "or in the environment: OPENAI_BASE_URL, OPENAI_API_KEY and RELAYBOT_MODEL, then restart "
    "the worker."
)


class ModelError(RuntimeError):
    """The model could not produce an answer. ``str(error)`` is for the operator (logs: it
    names the endpoint); :attr:`shown` is what the user who wrote is shown in the error reply,
    which may be anyone (a group room, an outside sender): it never names the endpoint.

    ``kind`` names what went wrong (``connect``, ``timeout``, ``status``, ``garbage``,
    ``deadline``, ``config``), ``status`` is the last HTTP status if there was one,
    ``attempts`` how many requests were made and ``retryable`` whether trying again later
    could help (everything except a 4xx other than 429 and a bad configuration).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "error",
        status: int | None = None,
        attempts: int = 0,
        retryable: bool = True,
        shown: str | None = None,
    ) -> None:
        super().__init__(message)
        self.shown = message if shown is None else shown
        self.kind = kind
        self.status = status
        self.attempts = attempts
        self.retryable = retryable


class ToolCall(BaseModel):
    """One function call the model asked for; ``arguments`` is already decoded."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Completion(BaseModel):
    """The model's answer: text, tool calls, or (rarely) both."""

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str | None = None


@runtime_checkable
class ModelPort(Protocol):
    """What the agent needs from a model. ``complete`` raises only :class:`ModelError`."""

    @property
    def name(self) -> str: ...

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> Completion: ...


class NoModel:
    """Stands in when no model is configured: every answer says so and how to fix it."""

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason

    @property
    def name(self) -> str:
        return "none"

    @property
    def text(self) -> str:
        if self.reason:
            return f"{NO_MODEL_TEXT}\n({self.reason}.)"
        return NO_MODEL_TEXT

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        return Completion(content=self.text, tool_calls=[], finish_reason="stop")

    def close(self) -> None:
        """Nothing to release; present so every model can be closed the same way."""
