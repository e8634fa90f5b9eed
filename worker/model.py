"""The model client: any OpenAI-compatible chat-completions endpoint.

Hosted APIs, Ollama (``http://127.0.0.1:11434/v1``), the llama.cpp server and vLLM all speak the
same ``POST {base_url}/chat/completions`` with tool calling, so one client serves them all.

Every call is bounded. One attempt never takes longer than ``timeout`` seconds (enforced by the
clock, not only by socket timeouts, so a server that dribbles bytes cannot stretch it); failed
attempts that may succeed on a second try (connection errors, timeouts, HTTP 429 and 5xx, and
answers that cannot be used) are retried up to ``retries`` times with exponential backoff and
jitter, honouring ``Retry-After`` up to a cap; and the whole call has a deadline of
``(retries + 1) * timeout`` plus the longest possible sum of backoff waits. When it gives up it
raises :class:`ModelError` with a sentence a user can read. The API key never appears in an error
or a log line, and message contents are logged only as lengths.
"""

from __future__ import annotations

import email.utils
import json
import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import httpx
import structlog
from pydantic import BaseModel, Field

from contract.config import ModelConfig

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_MAX = 10.0  # seconds; connecting never gets longer, whatever the timeout
BACKOFF_CAP = 30.0  # seconds; no single exponential backoff wait is longer than this
JITTER = 0.25  # each backoff wait is stretched by a random factor in [1, 1 + JITTER]
RETRY_AFTER_CAP = 30.0  # seconds; a server's Retry-After is honoured up to this (and the deadline)
MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # a larger body is not an answer we can use
MIN_ATTEMPT = 0.05  # seconds; less time than this left before the deadline is not worth a try
DETAIL_CHARS = 200  # how much of a server's error message goes into a ModelError

NO_MODEL_TEXT = (
    "No model is configured, so I cannot answer yet.\n"
    "Set one in config.toml (in $RELAYBOT_HOME, default ~/.relaybot):\n"
    "\n"
    "    [model]\n"
    '    base_url = "http://127.0.0.1:11434/v1"   # any OpenAI-compatible endpoint\n'
    '    model = "llama3.1"\n'
    '    api_key = "..."                          # only if the endpoint needs one\n'
    "\n"
    "or in the environment: OPENAI_BASE_URL, OPENAI_API_KEY and RELAYBOT_MODEL. "
    "Then restart the worker."
)


class ModelError(RuntimeError):
    """The model could not produce an answer; ``str(error)`` is fit to show to the user.

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
    ) -> None:
        super().__init__(message)
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


@dataclass(frozen=True)
class _Raw:
    status: int
    headers: httpx.Headers
    body: bytes


class _Failure(Exception):
    """One failed attempt (internal). ``message`` completes 'the model at URL ...'."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _display_url(base_url: str) -> str:
    """The base URL without any user:password part, for messages and logs."""
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError):
        return "<invalid URL>"
    if url.userinfo:
        url = url.copy_with(username=None, password=None)
    return str(url)


def _parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return max(0.0, min(seconds, RETRY_AFTER_CAP))


def _error_detail(body: bytes) -> str:
    """A short, single-line description from an error body (OpenAI or plain text)."""
    text = ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        text = body.decode("utf-8", "replace")
    else:
        if isinstance(data, dict):
            err = data.get("error", data)
            if isinstance(err, dict):
                msg = err.get("message") or err.get("detail") or err.get("error")
                text = msg if isinstance(msg, str) else json.dumps(err)[:DETAIL_CHARS]
            elif isinstance(err, str):
                text = err
            else:
                text = json.dumps(data)[:DETAIL_CHARS]
        else:
            text = json.dumps(data)[:DETAIL_CHARS]
    text = " ".join(text.split())
    if len(text) > DETAIL_CHARS:
        text = text[: DETAIL_CHARS - 1] + "…"
    return text


def _content_text(content: object) -> str | None:
    """Message content as text; some servers send a list of ``{"type": "text"}`` parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "".join(parts)
    raise _Failure("garbage", "returned message content that is not text", retryable=True)


def _garbage(what: str) -> _Failure:
    return _Failure("garbage", f"returned an unusable response ({what})", retryable=True)


def _parse_tool_call(index: int, raw: object) -> ToolCall:
    if not isinstance(raw, dict):
        raise _garbage("a tool call that is not an object")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise _garbage("a tool call without a function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _garbage("a tool call without a function name")
    arguments: Any = function.get("arguments")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise _garbage(f"arguments of tool call {name!r} are not JSON") from None
    if not isinstance(arguments, dict):
        raise _garbage(f"arguments of tool call {name!r} are not a JSON object")
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{index}_{uuid.uuid4().hex[:8]}"
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _parse_completion(body: bytes) -> Completion:
    """Decode a chat-completions response body; raises ``_Failure`` (garbage) if unusable."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise _garbage("the body is not JSON") from None
    if not isinstance(data, dict):
        raise _garbage("the body is not a JSON object")
    if "error" in data and not data.get("choices"):
        detail = _error_detail(body)
        raise _Failure("garbage", f"returned an error: {detail}", retryable=True)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _garbage("no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _garbage("no message")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _garbage("tool_calls is not a list")
    finish = choice.get("finish_reason")
    return Completion(
        content=_content_text(message.get("content")),
        tool_calls=[_parse_tool_call(i, raw) for i, raw in enumerate(raw_calls)],
        finish_reason=finish if isinstance(finish, str) else None,
    )


def max_backoff_total(retries: int, backoff: float) -> float:
    """The longest the backoff waits between ``retries + 1`` attempts can add up to."""
    return sum(min(backoff * 2.0**i, BACKOFF_CAP) * (1 + JITTER) for i in range(retries))


class OpenAIChatClient:
    """A chat-completions client with a keep-alive connection pool; see the module docstring."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 1.0,
        temperature: float | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not base_url or not model:
            raise ModelError(
                "the model is not configured: both base_url and model are needed",
                kind="config",
                retryable=False,
            )
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError("timeout must be > 0, retries and backoff >= 0")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.temperature = temperature
        self._api_key = api_key or None
        self._sleep = sleep
        self._display = _display_url(self.base_url)
        self.endpoint = f"{self.base_url}/chat/completions"
        # seconds one complete() may take at most, all attempts and waits included
        self.deadline = (self.retries + 1) * self.timeout + max_backoff_total(
            self.retries, self.backoff
        )
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": "relaybot",
        }
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._client = httpx.Client(
            headers=headers,
            timeout=self._timeout(self.timeout),
            transport=transport,
            follow_redirects=False,
        )

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> OpenAIChatClient:
        return cls(
            base_url=cfg.base_url or "",
            model=cfg.model or "",
            api_key=cfg.api_key.get_secret_value() if cfg.api_key else None,
            timeout=cfg.timeout,
            retries=cfg.retries,
            backoff=cfg.backoff,
            temperature=cfg.temperature,
        )

    @property
    def name(self) -> str:
        return self.model

    def __repr__(self) -> str:
        return f"OpenAIChatClient(model={self.model!r}, base_url={self._display!r})"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the request --------------------------------------------------------------------------

    def build_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        """Ask the model once (with retries); raises :class:`ModelError` when it cannot."""
        try:
            payload = json.dumps(self.build_body(messages, tools)).encode()
        except (TypeError, ValueError) as exc:
            raise ModelError(
                f"the conversation could not be encoded for the model: {exc}",
                kind="config",
                retryable=False,
            ) from None
        deadline = time.monotonic() + self.deadline
        attempts = 0
        last: _Failure | None = None
        ran_out = False
        for attempt in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining < min(self.timeout, MIN_ATTEMPT):
                ran_out = True
                break
            budget = min(self.timeout, remaining)
            attempts += 1
            t0 = time.monotonic()
            log.info(
                "model.request",
                model=self.model,
                url=self._display,
                attempt=attempts,
                messages=len(messages),
                tools=len(tools),
                bytes=len(payload),
            )
            try:
                completion = self._attempt(payload, budget)
            except _Failure as failure:
                last = failure
                log.warning(
                    "model.attempt_failed",
                    model=self.model,
                    url=self._display,
                    attempt=attempts,
                    kind=failure.kind,
                    status=failure.status,
                    reason=self._redact(failure.message),
                    latency_ms=round((time.monotonic() - t0) * 1000),
                    retryable=failure.retryable,
                )
                if not failure.retryable:
                    raise self._final_error(failure, attempts) from None
                if attempt == self.retries:
                    break
                wait = min(self.backoff * 2.0**attempt, BACKOFF_CAP) * random.uniform(1, 1 + JITTER)
                if failure.retry_after is not None:
                    wait = max(wait, failure.retry_after)
                wait = min(wait, max(0.0, deadline - time.monotonic()))
                if wait > 0:
                    log.info("model.backoff", attempt=attempts, wait_s=round(wait, 3))
                    self._sleep(wait)
                continue
            log.info(
                "model.response",
                model=self.model,
                url=self._display,
                attempt=attempts,
                status=200,
                latency_ms=round((time.monotonic() - t0) * 1000),
                content_chars=len(completion.content or ""),
                tool_calls=len(completion.tool_calls),
                finish_reason=completion.finish_reason,
            )
            return completion
        if ran_out or last is None:
            # the overall deadline ran out before all attempts were made
            last_what = f"; last: {self._redact(last.message)}" if last else ""
            raise ModelError(
                f"the model at {self._display} did not answer within "
                f"{_seconds(round(self.deadline, 3))} ({attempts} attempt"
                f"{'' if attempts == 1 else 's'}{last_what})",
                kind="deadline",
                status=last.status if last else None,
                attempts=attempts,
            )
        raise self._final_error(last, attempts)

    def _timeout(self, budget: float) -> httpx.Timeout:
        return httpx.Timeout(budget, connect=min(CONNECT_TIMEOUT_MAX, budget))

    def _attempt(self, payload: bytes, budget: float) -> Completion:
        raw = self._post(payload, budget)
        if raw.status == 200:
            return _parse_completion(raw.body)
        detail = _error_detail(raw.body)
        suffix = f": {detail}" if detail else ""
        if raw.status == 429 or raw.status >= 500:
            retry_after = _parse_retry_after(raw.headers.get("retry-after"), time.time())
            what = "is rate limiting requests" if raw.status == 429 else "failed"
            raise _Failure(
                "status",
                f"{what} (HTTP {raw.status}{suffix})",
                retryable=True,
                status=raw.status,
                retry_after=retry_after,
            )
        hint = ""
        if raw.status in (401, 403):
            hint = " — check the API key"
        elif raw.status == 404:
            hint = " — check base_url (it usually ends in /v1) and the model name"
        raise _Failure(
            "status",
            f"refused the request (HTTP {raw.status}{suffix}){hint}",
            retryable=False,
            status=raw.status,
        )

    def _post(self, payload: bytes, budget: float) -> _Raw:
        """One HTTP request that returns within ``budget`` seconds, whatever the server does.

        The request runs on a short-lived daemon thread that also checks the clock between
        chunks; if it has not finished when the budget is spent, it is abandoned (its own
        socket timeouts end it soon after) and the attempt counts as timed out.
        """
        box: list[_Raw | BaseException] = []
        done = threading.Event()
        limit = time.monotonic() + budget

        def run() -> None:
            try:
                box.append(self._post_blocking(payload, budget, limit))
            except BaseException as exc:  # handed over to the calling thread
                box.append(exc)
            finally:
                done.set()

        threading.Thread(target=run, name="relaybot-model-request", daemon=True).start()
        if not done.wait(budget) or not box:
            raise self._timed_out(budget)
        outcome = box[0]
        if isinstance(outcome, _Raw):
            return outcome
        if isinstance(outcome, _Failure):
            raise outcome
        if isinstance(outcome, httpx.ConnectTimeout):
            raise _Failure("connect", "could not be reached (connecting timed out)", retryable=True)
        if isinstance(outcome, httpx.TimeoutException):
            raise self._timed_out(budget)
        if isinstance(outcome, httpx.ConnectError):
            reason = self._redact(str(outcome)) or type(outcome).__name__
            raise _Failure("connect", f"could not be reached ({reason})", retryable=True)
        if isinstance(outcome, httpx.UnsupportedProtocol | httpx.InvalidURL):
            raise _Failure(
                "config",
                f"has an unusable base_url ({self._redact(str(outcome))})",
                retryable=False,
            )
        if isinstance(outcome, httpx.HTTPError):
            reason = self._redact(str(outcome)) or type(outcome).__name__
            raise _Failure("connect", f"broke off the connection ({reason})", retryable=True)
        if isinstance(outcome, Exception):
            raise _Failure(
                "error",
                f"could not be asked ({type(outcome).__name__}: {self._redact(str(outcome))})",
                retryable=True,
            )
        raise outcome  # KeyboardInterrupt and friends belong to the caller

    def _post_blocking(self, payload: bytes, budget: float, limit: float) -> _Raw:
        with self._client.stream(
            "POST", self.endpoint, content=payload, timeout=self._timeout(budget)
        ) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise _garbage(f"the body is larger than {MAX_RESPONSE_BYTES} bytes")
                if time.monotonic() > limit:
                    raise self._timed_out(budget)
                chunks.append(chunk)
            return _Raw(response.status_code, response.headers, b"".join(chunks))

    def _timed_out(self, budget: float) -> _Failure:
        return _Failure("timeout", f"timed out ({_seconds(round(budget, 3))})", retryable=True)

    def _redact(self, text: str) -> str:
        if self._api_key and self._api_key in text:
            text = text.replace(self._api_key, "***")
        return text

    def _final_error(self, failure: _Failure, attempts: int) -> ModelError:
        n = f"{attempts} attempt{'' if attempts == 1 else 's'}"
        where = f"the model at {self._display}"
        if failure.kind == "timeout":
            message = f"{where} timed out after {n} ({_seconds(self.timeout)} each)"
        elif not failure.retryable:
            message = f"{where} {failure.message}"
        else:
            message = f"{where} {failure.message}, after {n}"
        return ModelError(
            self._redact(message),
            kind=failure.kind,
            status=failure.status,
            attempts=attempts,
            retryable=failure.retryable,
        )


def make_model(cfg: ModelConfig) -> ModelPort:
    """The configured model client, or :class:`NoModel` when base_url or model is missing."""
    if not cfg.configured:
        missing = [key for key in ("base_url", "model") if not getattr(cfg, key)]
        reason = None
        if len(missing) == 1:
            present = "model" if missing[0] == "base_url" else "base_url"
            reason = f"{present} is set but {missing[0]} is not"
        return NoModel(reason)
    return OpenAIChatClient.from_config(cfg)
