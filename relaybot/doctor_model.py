"""``relaybot doctor``'s model probes: the endpoint answers, lists the configured model, and the
model calls a tool when asked (one tiny chat completion: a handful of tokens)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import httpx

from contract.config import Config, display_url
from relaybot.doctor_verdict import Check, fail, model_exists, ok, skipped, tool_call, warn
from worker.openai_parse import Masker, clip, endpoint_url

Add = Callable[[Check], None]

TOOL = "report_status"
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL,
            "description": "Report that the assistant is working. Always call this.",
            "parameters": {
                "type": "object",
                "properties": {"status": {"type": "string", "description": "the word ok"}},
                "required": ["status"],
            },
        },
    }
]
_PROMPT = f"Call the function {TOOL} with status set to ok. Do not answer in text."
ANSWER_FACTOR = 6  # a completion may take this many times the check timeout (a model loading)


def _describe(resp: httpx.Response, hide: Masker) -> str:
    try:
        body: Any = resp.json()
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    # masked before it is cut: a key cut in two would no longer match
    return f"HTTP {resp.status_code}" + (f": {clip(str(message), 160, hide)}" if message else "")


def model_group(cfg: Config, timeout: float, add: Add) -> None:
    m = cfg.model
    # what a check says never repeats a secret of the URL or the key (an error text, a
    # server's message that echoes the request line)
    hide = Masker(m.base_url or "", m.api_key.get_secret_value() if m.api_key else None)
    _probe(cfg, timeout, lambda c: add(_masked(c, hide)), hide)


def _masked(check: Check, hide: Masker) -> Check:
    return dataclasses.replace(check, summary=hide(check.summary), hint=hide(check.hint))


def _probe(cfg: Config, timeout: float, add: Add, hide: Masker) -> None:
    m = cfg.model
    if not m.configured:
        add(
            warn(
                "model.configured",
                "no model is configured: relaybot answers every message that no model is set",
                "set [model] base_url and model in config.toml (or OPENAI_BASE_URL and "
                'OPENAI_MODEL), e.g. base_url = "http://127.0.0.1:11434/v1" for Ollama; '
                "relaybot onboard asks for them",
            )
        )
        for cid in ("model.reachable", "model.exists", "model.tools"):
            add(skipped(cid, "no model is configured (model.configured)"))
        return
    base = str(m.base_url)
    where = display_url(base)
    models_url = endpoint_url(base, "models")
    add(ok("model.configured", f"{m.model} at {where}"))
    headers = {"Authorization": f"Bearer {m.api_key.get_secret_value()}"} if m.api_key else {}
    limits = httpx.Timeout(timeout, connect=timeout)
    with httpx.Client(headers=headers, timeout=limits) as http:
        started = time.monotonic()
        try:
            resp = http.get(models_url)
        except httpx.HTTPError as exc:
            add(
                fail(
                    "model.reachable",
                    f"cannot reach {where}: {exc or type(exc).__name__}",
                    "start the model server, or fix [model] base_url (it ends in /v1 for most "
                    "servers)",
                )
            )
            for cid in ("model.exists", "model.tools"):
                add(skipped(cid, "the endpoint is not reachable (model.reachable)"))
            return
        ms = (time.monotonic() - started) * 1000
        if resp.status_code in (401, 403):
            add(
                fail(
                    "model.reachable",
                    f"{where} refused the API key ({_describe(resp, hide)})",
                    "set [model] api_key (or OPENAI_API_KEY) to a key this endpoint accepts",
                )
            )
            for cid in ("model.exists", "model.tools"):
                add(skipped(cid, "the endpoint refused the API key (model.reachable)"))
            return
        add(ok("model.reachable", f"{where} answered in {ms:.0f} ms"))
        listed = _models(resp)
        if listed is None:
            add(
                warn(
                    "model.exists",
                    f"{display_url(models_url)} does not list models ({_describe(resp, hide)}): "
                    f"cannot tell whether {m.model} exists",
                    "check [model] base_url (most servers serve GET /v1/models); the tool "
                    "check below still tries the model",
                )
            )
        else:
            check = model_exists(str(m.model), listed)
            add(check)
            if check.verdict == "fail":
                add(skipped("model.tools", f"{m.model} is not served (model.exists)"))
                return
        add(_tools(http, base, str(m.model), timeout * ANSWER_FACTOR, hide))


def _models(resp: httpx.Response) -> list[str] | None:
    if resp.status_code != 200:
        return None
    try:
        data = resp.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(d["id"]) for d in data if isinstance(d, dict) and "id" in d]


def _tools(http: httpx.Client, base: str, model: str, timeout: float, hide: Masker) -> Check:
    url = endpoint_url(base, "chat/completions")
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": _PROMPT}],
        "tools": _TOOLS,
        "tool_choice": "required",
        "max_tokens": 64,
        "temperature": 0,
    }
    try:
        resp = http.post(url, json=body, timeout=timeout)
        if resp.status_code == 400 and "tool_choice" in resp.text:
            body.pop("tool_choice")  # a server that knows only "auto": the prompt still asks
            resp = http.post(url, json=body, timeout=timeout)
    except httpx.TimeoutException:
        return fail(
            "model.tools",
            f"{model} did not answer a one-line request within {timeout:.0f} s",
            "check the model server's load and logs ([model] timeout bounds real turns)",
        )
    except httpx.HTTPError as exc:
        return fail("model.tools", f"the chat request failed: {exc}", "check the model server")
    if resp.status_code != 200:
        if resp.status_code < 500 and "tool" in resp.text.lower():
            return warn(
                "model.tools",
                f"the endpoint refuses tools for {model} ({_describe(resp, hide)})",
                "pick a model with tool calling (Ollama: tagged 'tools'; llama.cpp: --jinja)",
            )
        return fail(
            "model.tools",
            f"the chat request was refused ({_describe(resp, hide)})",
            "check [model] model and the server's logs",
        )
    try:
        answer = resp.json()
    except ValueError:
        return fail("model.tools", "the endpoint's answer is not JSON", "check [model] base_url")
    return tool_call(TOOL, answer if isinstance(answer, dict) else {})
