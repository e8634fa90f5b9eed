"""The model client: any OpenAI-compatible chat-completions endpoint.

Hosted APIs, Ollama (``http://127.0.0.1:11434/v1``), the llama.cpp server and vLLM all speak the
same ``POST {base_url}/chat/completions`` with tool calling, so one client serves them all.

Every call is bounded. One attempt never takes longer than ``timeout`` seconds (enforced by the
clock, not only by socket timeouts, so a server that dribbles bytes cannot stretch it); failed
attempts that may succeed on a second try (connection errors, timeouts, HTTP 429 and 5xx, and
answers that cannot be used: worker/openai_parse.py) are retried up to ``retries`` times with
exponential backoff and jitter, honouring ``Retry-After`` up to a cap; and the whole call has a
deadline of ``(retries + 1) * timeout`` plus the longest possible sum of backoff waits. When it
gives up it raises :class:`~worker.model.ModelError` with a sentence a user can read. The API key
never appears in an error or a log line, and message contents are logged only as lengths.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import structlog

from contract.config import ModelConfig, display_url
from contract.timeouts import BACKOFF_CAP, JITTER, model_deadline
from worker.model import Completion, ModelError, ModelPort, NoModel
from worker.openai_parse import (
    Failure,
    Masker,
    Raw,
    endpoint_url,
    error_detail,
    garbage,
    has_userinfo,
    hide_echo,
    parse_completion,
    parse_retry_after,
    request_texts,
    seconds,
)

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_MAX = 10.0  # seconds; connecting never gets longer, whatever the timeout
_KEEP_PREFIX = ": "  # an error that echoes the request keeps what comes before this: "(HTTP 400: "
MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # a larger body is not an answer we can use
MIN_ATTEMPT = 0.05  # seconds; less time than this left before the deadline is not worth a try


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
        if api_key and has_userinfo(base_url):
            raise ModelError(  # httpx would send the URL's Basic auth instead of the key
                "the model's base_url holds a user:password and an API key is set: both would "
                "be the Authorization header, keep one",
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
        self._display = display_url(self.base_url)
        # what an error text must never repeat (a server may echo the request line back)
        self._redact = Masker(base_url, self._api_key)
        self.endpoint = endpoint_url(base_url, "chat/completions")  # the query kept: ?key=...
        # seconds one complete() may take at most, all attempts and waits included
        # (contract/timeouts.py: relaybot chat waits at least this long for a reply)
        self.deadline = model_deadline(self.timeout, self.retries, self.backoff)
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
        texts = request_texts(messages)
        deadline = time.monotonic() + self.deadline
        attempts = 0
        last: Failure | None = None
        ran_out = False
        for attempt in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining < min(self.timeout, MIN_ATTEMPT):
                ran_out = True
                break
            budget = min(self.timeout, remaining)
            attempts += 1
            t0 = time.monotonic()
            log.debug(  # every attempt: the noise of a turn, shown with -v
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
            except Failure as failure:
                # a server may quote the request in its error: no log line or error reply
                # may carry the conversation's text (an erasure could not reach it there)
                failure.message = hide_echo(failure.message, texts, keep=_KEEP_PREFIX)
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
            log.debug(
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
            rest = (
                f"did not answer within {seconds(round(self.deadline, 3))} ({attempts} attempt"
                f"{'' if attempts == 1 else 's'}{last_what})"
            )
            raise ModelError(
                f"the model at {self._display} {rest}",
                shown=f"the model {rest}",
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
            return parse_completion(raw.body)
        detail = error_detail(raw.body, self._redact)
        suffix = f": {detail}" if detail else ""
        if raw.status == 429 or raw.status >= 500:
            retry_after = parse_retry_after(raw.headers.get("retry-after"), time.time())
            what = "is rate limiting requests" if raw.status == 429 else "failed"
            raise Failure(
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
        raise Failure(
            "status",
            f"refused the request (HTTP {raw.status}{suffix}){hint}",
            retryable=False,
            status=raw.status,
        )

    def _post(self, payload: bytes, budget: float) -> Raw:
        """One HTTP request that returns within ``budget`` seconds, whatever the server does.

        The request runs on a short-lived daemon thread that also checks the clock between
        chunks; if it has not finished when the budget is spent, it is abandoned (its own
        socket timeouts end it soon after) and the attempt counts as timed out.
        """
        box: list[Raw | BaseException] = []
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
        if isinstance(outcome, Raw):
            return outcome
        if isinstance(outcome, Failure):
            raise outcome
        if isinstance(outcome, httpx.ConnectTimeout):
            raise Failure("connect", "could not be reached (connecting timed out)", retryable=True)
        if isinstance(outcome, httpx.TimeoutException):
            raise self._timed_out(budget)
        if isinstance(outcome, httpx.ConnectError):
            reason = self._redact(str(outcome)) or type(outcome).__name__
            raise Failure("connect", f"could not be reached ({reason})", retryable=True)
        if isinstance(outcome, httpx.UnsupportedProtocol | httpx.InvalidURL):
            # httpx's text repeats the URL (its host, a key in its query): the log line of
            # the attempt carries it masked, the error names only what went wrong
            log.warning("model.unusable_url", url=self._display, reason=self._redact(str(outcome)))
            raise Failure(
                "config",
                f"has an unusable base_url ({type(outcome).__name__}; check [model] base_url)",
                retryable=False,
            )
        if isinstance(outcome, httpx.HTTPError):
            reason = self._redact(str(outcome)) or type(outcome).__name__
            raise Failure("connect", f"broke off the connection ({reason})", retryable=True)
        if isinstance(outcome, Exception):
            raise Failure(
                "error",
                f"could not be asked ({type(outcome).__name__}: {self._redact(str(outcome))})",
                retryable=True,
            )
        raise outcome  # KeyboardInterrupt and friends belong to the caller

    def _post_blocking(self, payload: bytes, budget: float, limit: float) -> Raw:
        with self._client.stream(
            "POST", self.endpoint, content=payload, timeout=self._timeout(budget)
        ) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise garbage(f"the body is larger than {MAX_RESPONSE_BYTES} bytes")
                if time.monotonic() > limit:
                    raise self._timed_out(budget)
                chunks.append(chunk)
            return Raw(response.status_code, response.headers, b"".join(chunks))

    def _timed_out(self, budget: float) -> Failure:
        return Failure("timeout", f"timed out ({seconds(round(budget, 3))})", retryable=True)

    def _final_error(self, failure: Failure, attempts: int) -> ModelError:
        n = f"{attempts} attempt{'' if attempts == 1 else 's'}"
        if failure.kind == "timeout":
            rest = f"timed out after {n} ({seconds(self.timeout)} each)"
        elif not failure.retryable:
            rest = failure.message
        else:
            rest = f"{failure.message}, after {n}"
        return ModelError(
            self._redact(f"the model at {self._display} {rest}"),
            shown=self._redact(f"the model {rest}"),
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
