# ruff: noqa: T201  (a command line talks to its user on stdout/stderr)
"""`relaybot onboard`: the first-run questions (seed 000), written to ``config.toml``.

It asks for the owner's name, the owner's addresses per channel (terminal, Matrix, e-mail; each
optional; they become channel-scoped ``owner.aliases``, which win over unscoped ones) and the
model endpoint (base URL, model, API key, all optional), then writes
``$RELAYBOT_HOME/config.toml`` atomically (mode 0600: it may hold the API key). An existing file
is never overwritten without ``--force``; with it, sections onboarding does not ask about (redis,
worker, roles, gateways, ...) are kept.

The owner's *name* is not made an alias: an unscoped alias matches a sender of that name on every
channel, so anyone who could pick "ada" as a handle somewhere would be taken for the owner.

TOML is written by :func:`dumps` (no dependency): tables, strings, numbers, booleans, dates,
arrays and inline tables, enough for any config relaybot reads.
"""

from __future__ import annotations

import datetime as dt
import getpass
import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contract.config import Config
from contract.messages import describe_validation_error

EXIT_FAILED = 1
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_MATRIX_ID = re.compile(r"^@[^:\s]+:\S+$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
_URL = re.compile(r"^https?://\S+$")


class Cancelled(Exception):
    """The person ended the questions (end of input or Ctrl-C)."""


# -- TOML --------------------------------------------------------------------------------------

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _string(value: str) -> str:
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Path):
        return _string(str(value))
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def dumps(data: Mapping[str, Any]) -> str:
    """``data`` as TOML: scalars and arrays as ``key = value``, mappings as ``[tables]``."""
    lines: list[str] = []

    def table(path: list[str], body: Mapping[str, Any]) -> None:
        scalars = [(k, v) for k, v in body.items() if not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in body.items() if isinstance(v, Mapping)]
        if path and (scalars or not tables):
            if lines:
                lines.append("")
            lines.append("[" + ".".join(_key(p) for p in path) + "]")
        for k, v in scalars:
            lines.append(f"{_key(str(k))} = {_value(v)}")
        for k, v in tables:
            table([*path, str(k)], v)

    table([], data)
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text`` at once: a reader sees the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# -- the questions -----------------------------------------------------------------------------


class Asker:
    """Asks on stdout, reads stdin (``input()``); secrets without echo on a terminal."""

    def __init__(
        self,
        read: Callable[[str], str] = input,
        secret: Callable[[str], str] | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        self.read = read
        self.secret = secret or (getpass.getpass if sys.stdin.isatty() else read)
        self.say = say

    def ask(
        self,
        question: str,
        default: str = "",
        *,
        check: Callable[[str], str | None] | None = None,
        secret: bool = False,
        required: bool = False,
    ) -> str:
        """The answer (or ``default``); asks again, up to 5 times, while ``check`` objects."""
        prompt = f"{question}" + (f" [{default}]" if default else "") + ": "
        for _ in range(5):
            try:
                answer = (self.secret if secret else self.read)(prompt).strip()
            except (EOFError, KeyboardInterrupt):
                raise Cancelled from None
            answer = answer or default
            if not answer:
                problem = "an answer is needed here" if required else None
            else:
                problem = check(answer) if check else None
            if problem is None:
                return answer
            self.say(f"  {problem}")
        raise Cancelled

    def many(self, question: str, check: Callable[[str], str | None]) -> list[str]:
        def check_all(answer: str) -> str | None:
            for part in _split(answer):
                problem = check(part)
                if problem:
                    return problem
            return None

        return _split(self.ask(question, check=check_all))


def _split(answer: str) -> list[str]:
    return [part.strip() for part in re.split(r"[,\s]+", answer) if part.strip()]


def _matrix_problem(value: str) -> str | None:
    if _MATRIX_ID.match(value):
        return None
    return f"{value!r} is not a Matrix user id (like @ada:example.org)"


def _email_problem(value: str) -> str | None:
    return None if _EMAIL.match(value) else f"{value!r} is not an e-mail address"


def _url_problem(value: str) -> str | None:
    if _URL.match(value):
        return None
    return f"{value!r} is not an http(s) URL (like http://localhost:11434/v1)"


def ask_owner_and_model(asker: Asker, cfg: Config) -> dict[str, Any]:
    """The answers, as the ``owner`` and ``model`` sections of a config (empty answers omitted)."""
    say = asker.say
    say("relaybot onboarding: a few questions, every one but your name may be left empty.\n")
    default_name = cfg.owner.name if cfg.owner.name != "owner" else ""
    name = asker.ask("Your name (how the assistant calls you)", default_name, required=True)
    say("\nYour addresses, so the assistant knows you on every channel (you are 'owner').")
    user = getpass.getuser()
    terminal = asker.ask(
        f"Your user name at the terminal (empty: anyone at this terminal, now {user!r}, is you)"
    )
    if terminal and terminal.casefold() != user.casefold():
        say(
            f"  note: only the terminal user {terminal!r} will be treated as you; {user!r} will not"
        )
    matrix = asker.many("Your Matrix user id(s), comma-separated", _matrix_problem)
    email = asker.many("Your e-mail address(es), comma-separated", _email_problem)
    say("\nThe model: any OpenAI-compatible endpoint (Ollama, llama.cpp, vLLM, hosted).")
    base_url = asker.ask(
        "Base URL (e.g. http://localhost:11434/v1; empty: set it later)",
        cfg.model.base_url or "",
        check=_url_problem,
    )
    model: dict[str, Any] = {}
    if base_url:
        model["base_url"] = base_url
        model["model"] = asker.ask(
            "Model name (e.g. qwen2.5:7b)", cfg.model.model or "", required=True
        )
        key = asker.ask("API key (empty: none)", secret=True)
        if key:
            model["api_key"] = key
    aliases: list[Any] = []
    if terminal:
        aliases.append({"address": terminal, "channel": "cli"})
    aliases += [{"address": a, "channel": "matrix"} for a in matrix]
    aliases += [{"address": a, "channel": "email"} for a in email]
    owner: dict[str, Any] = {"name": name}
    if aliases:
        owner["aliases"] = aliases
    return {"owner": owner, "model": model}


def merged_config(existing: Mapping[str, Any], answers: Mapping[str, Any]) -> dict[str, Any]:
    """``existing`` with the owner section replaced and the model keys answered overlaid."""
    data = {k: v for k, v in existing.items() if k != "home"}
    data["owner"] = dict(answers["owner"])
    if answers["model"]:
        data["model"] = {**dict(existing.get("model") or {}), **answers["model"]}
    return data


def run_onboarding(cfg: Config, *, force: bool = False, asker: Asker | None = None) -> int:
    path = cfg.config_file
    existing: dict[str, Any] = {}
    if path.exists():
        if not force:
            print(
                f"relaybot: {path} already exists; run `relaybot onboard --force` to answer the "
                "questions again (other settings in it are kept)",
                file=sys.stderr,
            )
            return EXIT_FAILED
        try:
            existing = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            print(f"relaybot: {path} is not valid TOML ({exc}); fix or remove it", file=sys.stderr)
            return EXIT_FAILED
    asker = asker or Asker()
    try:
        answers = ask_owner_and_model(asker, cfg)
    except Cancelled:
        print("\nrelaybot: onboarding cancelled; nothing was written", file=sys.stderr)
        return EXIT_FAILED
    data = merged_config(existing, answers)
    try:
        Config.model_validate({**data, "home": cfg.home})
    except ValidationError as exc:
        problem = describe_validation_error(exc)
        print(f"relaybot: these answers make no valid config: {problem}", file=sys.stderr)
        return EXIT_FAILED
    header = "# relaybot configuration, written by `relaybot onboard`; edit freely.\n\n"
    write_atomic(path, header + dumps(data))
    asker.say(f"\nWrote {path}.")
    if answers["model"]:
        asker.say("Start chatting with: relaybot chat")
    else:
        asker.say(
            "No model yet: set [model] base_url and model in that file (or OPENAI_BASE_URL and "
            "RELAYBOT_MODEL), then: relaybot chat"
        )
    return 0
