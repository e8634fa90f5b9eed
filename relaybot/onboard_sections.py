"""The sections `relaybot onboard` sets up after the owner: the model, Matrix, e-mail.

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
from gateways.email.config import EmailConfig
from gateways.matrix.config import MatrixConfig
from relaybot import onboard_checks as checks
from relaybot.onboard_ask import (
    Asker,
    email_problem,
    matrix_problem,
    model_url_problem,
    port_problem,
    tls_problem,
    url_problem,
)
from worker.openai_parse import has_userinfo

MODEL_KEYS = ("model_url", "api_key", "model")
MATRIX_KEYS = (
    "matrix_homeserver",
    "matrix_user",
    "matrix_login",
    "matrix_password",
    "matrix_token",
)
EMAIL_KEYS = (
    "email_imap_host",
    "email_imap_tls",
    "email_imap_port",
    "email_imap_user",
    "email_imap_password",
    "email_smtp_host",
    "email_smtp_tls",
    "email_smtp_port",
    "email_smtp_user",
    "email_smtp_password",
    "email_address",
)
SHOW_MODELS = 40  # models listed by number; the rest can be named


def with_answers(cfg: Config, name: str, section: dict[str, Any]) -> Config:
    """``cfg`` with a section's answers in it: the defaults of the questions asked again."""
    data = cfg.model_dump()
    data[name] = {**data[name], **section}
    return Config.model_validate(data)


def report(asker: Asker, result: checks.Check) -> bool:
    asker.say(f"  {'ok' if result.ok else 'FAILED'}: {result.detail}")
    return result.ok


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


# -- Matrix --------------------------------------------------------------------------------------


def ask_matrix(asker: Asker, cfg: Config) -> dict[str, Any] | None:
    """``[matrix]`` homeserver, user_id and password or access_token, after a login test."""
    m = MatrixConfig.of(cfg)
    asker.say("\nMatrix: relaybot uses an account of its own on a homeserver (not yours).")
    if not asker.yes("Set up the Matrix gateway?", m.configured, key="matrix"):
        return None
    while True:
        homeserver = asker.ask(
            "Homeserver URL (e.g. https://matrix.example.org)",
            m.homeserver or "",
            key="matrix_homeserver",
            check=url_problem,
            required=True,
        )
        user_id = asker.ask(
            "The bot's Matrix user id (e.g. @relaybot:example.org)",
            m.user_id or "",
            key="matrix_user",
            check=matrix_problem,
            required=True,
        )
        how = asker.ask(
            "Log in with its [p]assword or an access [t]oken",
            "t" if "matrix_token" in asker.preset or m.access_token else "p",
            key="matrix_login",
            check=lambda a: None if a[:1].lower() in ("p", "t") else "p or t",
        )[:1].lower()
        section: dict[str, Any] = {"homeserver": homeserver, "user_id": user_id}
        if how == "t":
            current = m.access_token.get_secret_value() if m.access_token else ""
            token = asker.ask(
                "Access token", current, key="matrix_token", secret=True, required=True
            )
            result = checks.matrix_login(homeserver, user_id, token=token)
            section["access_token"] = token
            if result.device_id:
                section["device_id"] = result.device_id
        else:
            current = m.password.get_secret_value() if m.password else ""
            password = asker.ask(
                "Password", current, key="matrix_password", secret=True, required=True
            )
            result = checks.matrix_login(homeserver, user_id, password=password)
            section["password"] = password
        if report(asker, result):
            return section
        decision = asker.after_failure("Matrix")
        if decision == "keep":
            return section
        if decision == "skip":
            return None
        asker.forget(MATRIX_KEYS)
        cfg = with_answers(cfg, "matrix", section)  # a retry starts from these answers
        m = MatrixConfig.of(cfg)


# -- e-mail --------------------------------------------------------------------------------------


def _smtp_host(imap_host: str) -> str:
    return "smtp." + imap_host.removeprefix("imap.") if imap_host.startswith("imap.") else imap_host


def ask_email(asker: Asker, cfg: Config) -> dict[str, Any] | None:
    """``[email]`` IMAP and SMTP servers, logins and the bot's address, after login tests."""
    e = EmailConfig.of(cfg)
    asker.say("\nE-mail: relaybot reads a mailbox of its own over IMAP and answers over SMTP.")
    if not asker.yes("Set up the e-mail gateway?", e.configured, key="email"):
        return None
    while True:
        section = _email_answers(asker, cfg)
        imap = checks.imap_login(
            section["imap_host"],
            section["imap_port"],
            section["imap_tls"],
            section["imap_user"],
            section["imap_password"],
            folder=e.folder,
            ca_file=e.ca_file,
        )
        smtp = checks.smtp_login(
            section["smtp_host"],
            section["smtp_port"],
            section["smtp_tls"],
            section["smtp_user"],
            section["smtp_password"],
            ca_file=e.ca_file,
        )
        if report(asker, imap) & report(asker, smtp):
            return section
        decision = asker.after_failure("e-mail")
        if decision == "keep":
            return section
        if decision == "skip":
            return None
        asker.forget(EMAIL_KEYS)
        cfg = with_answers(cfg, "email", section)  # a retry starts from these answers


def _email_answers(asker: Asker, cfg: Config) -> dict[str, Any]:
    e = EmailConfig.of(cfg)

    def secret(value: Any) -> str:
        return str(value.get_secret_value()) if value is not None else ""

    imap_host = asker.ask(
        "IMAP server (e.g. imap.fastmail.com)", e.imap_host or "", key="email_imap_host",
        required=True,
    )  # fmt: skip
    imap_tls = asker.ask(
        "IMAP security: tls (port 993), starttls (143) or plain (loopback only)",
        e.imap_tls, key="email_imap_tls", check=tls_problem,
    )  # fmt: skip
    imap_port = asker.ask(
        "IMAP port", str(e.imap_port or checks.DEFAULT_PORTS["imap"][imap_tls]),
        key="email_imap_port", check=port_problem,
    )  # fmt: skip
    imap_user = asker.ask(
        "IMAP user (the bot's mailbox)", e.imap_user or "", key="email_imap_user", required=True
    )
    imap_password = asker.ask(
        "IMAP password (an app password with most providers)", secret(e.imap_password),
        key="email_imap_password", secret=True, required=True,
    )  # fmt: skip
    smtp_host = asker.ask(
        "SMTP server", e.smtp_host or _smtp_host(imap_host), key="email_smtp_host", required=True
    )
    smtp_tls = asker.ask(
        "SMTP security: starttls (port 587), tls (465) or plain (loopback only)",
        e.smtp_tls, key="email_smtp_tls", check=tls_problem,
    )  # fmt: skip
    smtp_port = asker.ask(
        "SMTP port", str(e.smtp_port or checks.DEFAULT_PORTS["smtp"][smtp_tls]),
        key="email_smtp_port", check=port_problem,
    )  # fmt: skip
    smtp_user = asker.ask(
        "SMTP user (empty: no login)", e.smtp_user or imap_user, key="email_smtp_user"
    )
    smtp_password = ""
    if smtp_user:
        smtp_password = asker.ask(
            "SMTP password (empty: the IMAP password)", secret(e.smtp_password),
            key="email_smtp_password", secret=True,
        ) or imap_password  # fmt: skip
    own = e.addresses[0] if e.addresses else (imap_user if "@" in imap_user else "")
    address = asker.ask(
        "The bot's own e-mail address (it sends from it)", own, key="email_address",
        check=email_problem, required=True,
    )  # fmt: skip
    section: dict[str, Any] = {
        "imap_host": imap_host,
        "imap_port": int(imap_port),
        "imap_tls": imap_tls,
        "imap_user": imap_user,
        "imap_password": imap_password,
        "smtp_host": smtp_host,
        "smtp_port": int(smtp_port),
        "smtp_tls": smtp_tls,
        "addresses": [address, *[a for a in e.addresses if a != address]],
    }
    if smtp_user:
        section["smtp_user"] = smtp_user
        section["smtp_password"] = smtp_password
    return section
