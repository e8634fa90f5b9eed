"""`relaybot onboard`: the first-run questions (seed 000), checked, written to ``config.toml``.

It asks for the owner's name (it reaches the model's system prompt: contract.config), the owner's
addresses per channel (the terminal's, then what each channel's onboarding asks; each optional;
they become channel-scoped ``owner.aliases``, which win over unscoped ones), then sets up, each
optional and each tested before it is written:

- the model endpoint (relaybot/onboard_sections.py, relaybot/onboard_checks.py): the models
  ``GET /v1/models`` lists are offered (by number or name), and a test completion runs with the
  one chosen;
- each channel's gateway: the questions of its spec's ``onboard`` (contract/onboarding.py), in
  its folder (``gateways/<channel>/onboard.py``), each with its own login test.

A failed test says why, and the person retries, keeps the answers anyway, or skips the section.
Every question can be answered on the command line instead (``relaybot onboard --help``: one flag
per question) or on stdin, one answer per line; ``--no-input`` asks nothing (``--on-failure``
then says what a failed test does; the default is to stop, writing nothing).

``$RELAYBOT_HOME/config.toml`` is written atomically, mode 0600: it holds the API key and the
passwords, as the README's sections on the channels put them. An existing file is never
overwritten without ``--force``; with it, what onboarding does not ask about (redis, worker,
roles, a section that was skipped, a room's policy...) is kept.

The owner's *name* is not made an alias: an unscoped alias matches a sender of that name on every
channel, so anyone who could pick "ada" as a handle somewhere would be taken for the owner.
"""

from __future__ import annotations

import getpass
import shutil
import sys
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contract.config import Config
from contract.messages import describe_validation_error
from contract.terminal import echo
from relaybot.onboard_ask import Asker, Cancelled, CheckFailed, onboardings
from relaybot.onboard_sections import ask_model
from relaybot.toml_write import dumps, write_atomic

__all__ = ["Asker", "Cancelled", "dumps", "run_onboarding", "write_atomic"]

EXIT_FAILED = 1


def ask_owner(asker: Asker, cfg: Config) -> dict[str, Any]:
    """The ``owner`` section: the name and the owner's aliases (empty answers omitted)."""
    say = asker.say
    say("relaybot onboarding: a few questions, every one but your name may be left empty.\n")
    default_name = cfg.owner.name if cfg.owner.name != "owner" else ""
    name = asker.ask(
        "Your name (how the assistant calls you)", default_name, key="name", required=True
    )
    say("\nYour addresses, so the assistant knows you on every channel (you are 'owner').")
    user = getpass.getuser()
    terminal = asker.ask(
        f"Your user name at the terminal (empty: anyone at this terminal, now {user!r}, is you)",
        key="terminal",
    )
    if terminal and terminal.casefold() != user.casefold():
        say(
            f"  note: only the terminal user {terminal!r} will be treated as you; {user!r} will not"
        )
    theirs = {
        channel: asker.many(question, problem, key=key)
        for channel, o in onboardings().items()
        if o.owner is not None
        for key, question, problem in [o.owner]
    }
    aliases: list[Any] = []
    if terminal:
        aliases.append({"address": terminal, "channel": "cli"})
    for channel, addresses in theirs.items():
        aliases += [{"address": a, "channel": channel} for a in addresses]
    owner: dict[str, Any] = {"name": name}
    if aliases:
        owner["aliases"] = aliases
    return owner


def ask_everything(asker: Asker, cfg: Config) -> dict[str, Any]:
    """The answers: ``owner`` always, ``model`` and each channel's section when set up (else
    None)."""
    answers = {"owner": ask_owner(asker, cfg), "model": ask_model(asker, cfg)}
    for channel, o in onboardings().items():
        answers[channel] = o.ask(asker, cfg)
    return answers


def _replaced() -> dict[str, tuple[str, ...]]:
    """Keys a section's answers replace as a whole (a password replaces a token, and back)."""
    return {"model": ("api_key",), **{c: o.replaced for c, o in onboardings().items()}}


def merged_config(existing: Mapping[str, Any], answers: Mapping[str, Any]) -> dict[str, Any]:
    """``existing`` with the owner section replaced and each section set up overlaid (its other
    keys, such as a room's policy or an allowlist, kept)."""
    data = {k: v for k, v in existing.items() if k != "home"}
    data["owner"] = dict(answers["owner"])
    replaced = _replaced()
    for section in ("model", *onboardings()):
        new = answers.get(section)
        if not new:
            continue
        old = {
            k: v
            for k, v in dict(existing.get(section) or {}).items()
            if k not in replaced.get(section, ())
        }
        data[section] = {**old, **new}
    return data


def _fail(message: str) -> int:
    echo(f"relaybot: {message}", file=sys.stderr)
    return EXIT_FAILED


def _existing(path: Path, force: bool, asker: Asker) -> dict[str, Any] | str:
    if not path.exists():
        return {}
    try:
        existing = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        if not force:
            return (
                f"{path} is not valid TOML ({exc}): fix that line, or run `relaybot onboard "
                "--force` to write a new one (the broken file is kept beside it)"
            )
        kept = path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%dT%H%M%S')}")
        path.rename(kept)
        asker.say(f"{path} was not valid TOML ({exc}): kept as {kept}, nothing of it is reused")
        return {}
    if not force:
        return (
            f"{path} already exists; run `relaybot onboard --force` to answer the questions "
            "again (other settings in it are kept)"
        )
    return existing


def run_onboarding(cfg: Config, *, force: bool = False, asker: Asker | None = None) -> int:
    path = cfg.config_file
    asker = asker or Asker()
    existing = _existing(path, force, asker)
    if isinstance(existing, str):
        return _fail(existing)
    try:
        answers = ask_everything(asker, cfg)
    except Cancelled as exc:
        why = f" ({exc})" if str(exc) else ""
        return _fail(f"onboarding cancelled{why}; nothing was written")
    except CheckFailed as exc:
        return _fail(f"the {exc} test failed (see above); nothing was written")
    data = merged_config(existing, answers)
    try:
        Config.model_validate({**data, "home": cfg.home})
    except ValidationError as exc:
        return _fail(f"these answers make no valid config: {describe_validation_error(exc)}")
    header = "# relaybot configuration, written by `relaybot onboard`; edit freely.\n\n"
    write_atomic(path, header + dumps(data))
    asker.say(f"\nWrote {path} (mode 600: it holds keys and passwords).")
    for line in _next_steps(answers):
        asker.say(line)
    return 0


def command_name() -> str:
    """How to type relaybot here: ``relaybot`` when that is on PATH and is this one, else this
    one's path (``.venv/bin/relaybot`` in a clone whose venv is not activated)."""
    me = Path(sys.argv[0])
    if me.name != "relaybot":  # python -m relaybot, a test's runner
        return "relaybot"
    on_path = shutil.which("relaybot")
    if on_path is not None and Path(on_path).resolve() == me.resolve():
        return "relaybot"
    try:
        return str(me.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(me.resolve())


def _next_steps(answers: Mapping[str, Any]) -> list[str]:
    out = []
    if answers["model"]:
        out.append(f"Start chatting with: {command_name()} chat")
    else:
        out.append(
            "No model yet: set [model] base_url and model in that file (or OPENAI_BASE_URL and "
            f"RELAYBOT_MODEL), then: {command_name()} chat"
        )
    channels = onboardings()
    if any(answers.get(channel) for channel in channels):
        names = "|".join(channels)
        out.append(f"The gateways run under `honcho start` (or: {command_name()} gateway {names}).")
    for channel, o in channels.items():
        if answers.get(channel) and o.next_steps is not None:
            out += o.next_steps(answers[channel])
    return out
