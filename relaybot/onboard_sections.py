"""The sections `relaybot onboard` sets up after the owner: the model here, each channel's in its
folder (its spec's ``onboard``: contract/onboarding.py).

Each asks its questions (relaybot/onboard_ask.py), checks the answers against the real service
(relaybot/onboard_checks.py) and returns the section's keys for config.toml. A failed check says
why; then the person retries, keeps the answers anyway, or skips the section (``--on-failure``
without a terminal). A skipped section returns None: config.toml keeps what it had.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from typing import Any
from urllib.parse import urlsplit

from contract.config import Config
from contract.onboarding import report, with_answers
from relaybot import onboard_checks as checks
from relaybot.onboard_ask import (
    Asker,
    model_url_problem,
)
from worker.openai_parse import has_userinfo

MODEL_KEYS = ("model_url", "api_key", "model")
SHOW_MODELS = 40  # models listed by number; the rest can be named


# -- the model -----------------------------------------------------------------------------------


def is_local(base_url: str) -> bool:
    """Whether the endpoint is a server on this machine (``localhost``, a loopback address in
    any spelling: ``127.1``, ``0x7f000001``, ``[::ffff:127.0.0.1]``; the any-address ``0.0.0.0``
    or ``[::]``, which reaches this machine; this machine's own name): most answer one request
    at a time (llama.cpp's default, Ollama on a small machine), and requests beyond that wait
    in its queue until they time out. relaybot's default concurrency (8) is a hosted API's."""
    try:
        host = (urlsplit(base_url).hostname or "").casefold().rstrip(".")
    except ValueError:
        return False
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    if host == socket.gethostname().casefold().rstrip("."):  # no DNS lookup: onboard may be offline
        return True
    return _loopback_address(host)


def _loopback_address(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:  # the forms an IPv4 address may also take in a URL: 127.1, 2130706433, 0x7f000001
            ip = ipaddress.ip_address(socket.inet_aton(host))
        except (OSError, ValueError):
            return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def _one_authorization(base_url: str, api_key: str) -> str | None:
    if api_key and has_userinfo(base_url):
        return (
            "the base URL holds a user:password, which would be sent instead of an API key "
            "(both are the Authorization header): give no key, or a base URL without it"
        )
    return None


def ask_model(asker: Asker, cfg: Config) -> dict[str, Any] | None:
    """``[model]`` base_url, model and api_key, tested: the models listed, a test completion."""
    asker.say("\nThe model: any OpenAI-compatible endpoint (Ollama, llama.cpp, vLLM, hosted).")
    current_key = cfg.model.api_key.get_secret_value() if cfg.model.api_key else ""
    while True:
        base_url = asker.ask(
            "Base URL (e.g. http://localhost:11434/v1; empty: set it later)",
            cfg.model.base_url or "",
            key="model_url",
            check=model_url_problem,
        )
        if not base_url:
            return None
        api_key = asker.ask(
            "API key (empty: none)",
            current_key,
            key="api_key",
            secret=True,
            check=functools.partial(_one_authorization, base_url),
        )
        listing = checks.list_models(base_url, api_key)
        report(asker, listing)
        models = listing.models
        for n, name in enumerate(models[:SHOW_MODELS], start=1):
            asker.say(f"  {n:>3}. {name}")
        if len(models) > SHOW_MODELS:
            asker.say(f"  ... and {len(models) - SHOW_MODELS} more (type a name)")
        default = cfg.model.model or (models[0] if models else "")
        model = asker.choose(
            "Model (its number or name)" if models else "Model name (e.g. qwen2.5:7b)",
            models[:SHOW_MODELS],
            default,
            key="model",
            required=True,
        )
        if listing.ok and models and model not in models:
            asker.say(f"  note: the endpoint does not list {model!r}")
        reachable = listing.ok or listing.unlisted
        tried = checks.try_completion(base_url, api_key, model) if reachable else None
        if tried is not None:
            report(asker, tried)
        section: dict[str, Any] = {"base_url": base_url, "model": model}
        if api_key:
            section["api_key"] = api_key
        if is_local(base_url):
            section["concurrency"] = 1
            asker.say(
                "  a server on this machine: concurrency = 1, one request at a time (if it "
                "has more parallel slots, set [model] concurrency to them)"
            )
        if tried is not None and tried.ok:
            return section
        decision = asker.after_failure("model")
        if decision == "keep":
            return section
        if decision == "skip":
            return None
        asker.forget(MODEL_KEYS)
        cfg = with_answers(cfg, "model", section)  # a retry starts from these answers
        current_key = api_key
