"""How `relaybot onboard` asks: on a terminal, from scripted answers on stdin, or not at all.

Every question has a key (``name``, ``model_url``, ``matrix_password``, ...). An answer given on
the command line (``--model-url URL``: :attr:`Asker.preset`) is taken without asking; with
``--no-input`` nothing is asked at all and a question without an answer takes its default (a
required one without default stops onboarding, naming its flag). Otherwise the question is asked
on stdout and read from stdin, a terminal or a pipe (one answer per line), secrets without echo
on a terminal.

When a check fails (the model endpoint, a Matrix or e-mail login), :meth:`Asker.after_failure`
says what to do: ask (retry, keep the answers anyway, or skip the section), or what
``--on-failure`` says (``keep``, ``skip``, ``fail``; ``--no-input`` means ``fail`` unless told).
"""

from __future__ import annotations

import argparse
import getpass
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from contract.config import check_model_url
from contract.terminal import echo

Decision = Literal["retry", "keep", "skip"]
OnFailure = Literal["ask", "keep", "skip", "fail"]

_MATRIX_ID = re.compile(r"^@[^:\s]+:\S+$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
_URL = re.compile(r"^https?://\S+$")


class Cancelled(Exception):
    """The person ended the questions (end of input or Ctrl-C), or a needed answer is missing."""


class CheckFailed(Exception):
    """A check failed and ``--on-failure fail`` (or ``--no-input``) says to stop."""


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


class Asker:
    """Asks on stdout, reads stdin (``input()``); secrets without echo on a terminal."""

    def __init__(
        self,
        read: Callable[[str], str] = input,
        secret: Callable[[str], str] | None = None,
        say: Callable[[str], None] = echo,  # what servers answered is shown, never obeyed
        *,
        preset: Mapping[str, str] | None = None,
        interactive: bool = True,
        on_failure: OnFailure | None = None,
    ) -> None:
        self.read = read
        self.secret = secret or (getpass.getpass if sys.stdin.isatty() else read)
        self.say = say
        self.preset = dict(preset or {})
        self.interactive = interactive
        self.on_failure: OnFailure = on_failure or ("ask" if interactive else "fail")

    def ask(
        self,
        question: str,
        default: str = "",
        *,
        key: str | None = None,
        check: Callable[[str], str | None] | None = None,
        secret: bool = False,
        required: bool = False,
    ) -> str:
        """The answer (or ``default``); asks again, up to 5 times, while ``check`` objects."""
        if key is not None and key in self.preset:
            return self._given(key, self.preset[key].strip() or default, check, required)
        if not self.interactive:
            return self._given(key, default, check, required)
        shown = "(keep the current one)" if secret and default else default
        prompt = f"{question}" + (f" [{shown}]" if shown else "") + ": "
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

    def _given(
        self,
        key: str | None,
        answer: str,
        check: Callable[[str], str | None] | None,
        required: bool,
    ) -> str:
        name = flag(key) if key else "an answer"
        if not answer:
            if required:
                raise Cancelled(f"{name} is needed")
            return answer
        problem = check(answer) if check else None
        if problem is not None:
            raise Cancelled(f"{name}: {problem}")
        return answer

    def many(self, question: str, check: Callable[[str], str | None], *, key: str) -> list[str]:
        def check_all(answer: str) -> str | None:
            for part in split(answer):
                problem = check(part)
                if problem:
                    return problem
            return None

        return split(self.ask(question, check=check_all, key=key))

    def yes(self, question: str, default: bool, *, key: str) -> bool:
        answer = self.ask(
            f"{question} (y/n)", "y" if default else "n", key=key, check=_yes_no_problem
        )
        return answer.strip().lower() in ("y", "yes", "true", "1")

    def choose(
        self, question: str, options: Sequence[str], default: str, *, key: str, required: bool
    ) -> str:
        """An option by its number (1-based) or any name."""

        def check(answer: str) -> str | None:
            if options and answer.isdigit() and not 1 <= int(answer) <= len(options):
                return f"{answer} is not one of the numbers 1-{len(options)}"
            return None

        answer = self.ask(question, default, key=key, check=check, required=required)
        return options[int(answer) - 1] if answer.isdigit() and options else answer

    def forget(self, keys: Sequence[str]) -> None:
        """Ask these again (a retry: the answers given on the command line did not work)."""
        for key in keys:
            self.preset.pop(key, None)

    def after_failure(self, what: str) -> Decision:
        """What to do after a failed check of ``what``: retry, keep anyway, or skip it."""
        if self.on_failure == "fail" or (self.on_failure == "ask" and not self.interactive):
            raise CheckFailed(what)
        if self.on_failure != "ask":
            return self.on_failure
        answer = self.ask(
            f"[r]etry, [k]eep these {what} settings anyway, or [s]kip {what}",
            "r",
            check=lambda a: None if a[:1].lower() in ("r", "k", "s") else "r, k or s",
        )
        return {"r": "retry", "k": "keep", "s": "skip"}[answer[:1].lower()]  # type: ignore[return-value]


# every question's key and what its flag says (``--model-url`` answers ``model_url``)
QUESTIONS: dict[str, str] = {
    "name": "your name (how the assistant calls you)",
    "terminal": "your user name at the terminal ('' : anyone at it)",
    "matrix_ids": "your own Matrix user id(s), comma-separated",
    "emails": "your own e-mail address(es), comma-separated",
    "model_url": "the model endpoint's base URL ('' : set it later)",
    "api_key": "the model endpoint's API key",
    "model": "the model: its name, or its number in the endpoint's list",
    "matrix": "set up the Matrix gateway: y or n",
    "matrix_homeserver": "the bot's homeserver URL",
    "matrix_user": "the bot's Matrix user id",
    "matrix_login": "log the bot in with its p(assword) or an access t(oken)",
    "matrix_password": "the bot's Matrix password",
    "matrix_token": "the bot's Matrix access token",
    "email": "set up the e-mail gateway: y or n",
    "email_imap_host": "the bot's IMAP server",
    "email_imap_tls": "IMAP security: tls, starttls or plain",
    "email_imap_port": "IMAP port (default from the security)",
    "email_imap_user": "the bot's IMAP user",
    "email_imap_password": "the bot's IMAP password",
    "email_smtp_host": "the bot's SMTP server",
    "email_smtp_tls": "SMTP security: starttls, tls or plain",
    "email_smtp_port": "SMTP port (default from the security)",
    "email_smtp_user": "the bot's SMTP user ('' : no login)",
    "email_smtp_password": "the bot's SMTP password (default: the IMAP one)",
    "email_address": "the bot's own e-mail address",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`relaybot onboard`'s options: --force, --no-input, --on-failure, one per question."""
    p.add_argument("--force", action="store_true", help="rewrite an existing config.toml")
    p.add_argument(
        "--no-input",
        action="store_true",
        help="ask nothing: what no flag answers takes its default (for scripts)",
    )
    p.add_argument(
        "--on-failure",
        choices=("ask", "keep", "skip", "fail"),
        help="when a test fails: ask (default on a terminal), keep the answers anyway, skip the "
        "section, or fail and write nothing (default with --no-input)",
    )
    answers = p.add_argument_group("answers (each one is then not asked)")
    for key, text in QUESTIONS.items():
        answers.add_argument(flag(key), dest=f"answer_{key}", metavar="VALUE", help=text)


def preset_answers(args: argparse.Namespace) -> dict[str, str]:
    """The answers given as flags (by :func:`add_arguments`)."""
    return {
        key: str(value)
        for key in QUESTIONS
        if (value := getattr(args, f"answer_{key}", None)) is not None
    }


def asker_for(args: argparse.Namespace) -> Asker:
    """The Asker `relaybot onboard` runs with, from its options."""
    return Asker(
        preset=preset_answers(args), interactive=not args.no_input, on_failure=args.on_failure
    )


def split(answer: str) -> list[str]:
    return [part.strip() for part in re.split(r"[,\s]+", answer) if part.strip()]


def _yes_no_problem(value: str) -> str | None:
    ok = value.strip().lower() in ("y", "yes", "n", "no", "true", "false", "1", "0")
    return None if ok else "y or n"


def matrix_problem(value: str) -> str | None:
    if _MATRIX_ID.match(value):
        return None
    return f"{value!r} is not a Matrix user id (like @ada:example.org)"


def email_problem(value: str) -> str | None:
    return None if _EMAIL.match(value) else f"{value!r} is not an e-mail address"


def url_problem(value: str) -> str | None:
    if _URL.match(value):
        return None
    return f"{value!r} is not an http(s) URL (like http://localhost:11434/v1)"


def model_url_problem(value: str) -> str | None:
    """What the model client could not use (never repeating the URL: a key may ride in it)."""
    try:
        check_model_url(value)
    except ValueError as exc:
        return f"that base URL cannot be used: {exc}"
    return None


def port_problem(value: str) -> str | None:
    return None if value.isdigit() and 1 <= int(value) <= 65535 else f"{value!r} is not a port"


def tls_problem(value: str) -> str | None:
    return None if value in ("tls", "starttls", "plain") else "tls, starttls or plain"
