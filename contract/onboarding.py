"""What a channel's onboarding questions use (``relaybot onboard``, relaybot/onboard.py): the
:class:`Asker` that asks them (on a terminal, or answered by flags and stdin), the result of the
test a section's answers get (:class:`Tried`), and :class:`Onboarding`, what a channel's spec
names as its questions (contract/channels.py: ``onboard``)."""

from __future__ import annotations

import getpass
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from contract.config import Config, config_class, display_url
from contract.terminal import echo

Decision = Literal["retry", "keep", "skip"]
OnFailure = Literal["ask", "keep", "skip", "fail"]

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


def split(answer: str) -> list[str]:
    return [part.strip() for part in re.split(r"[,\s]+", answer) if part.strip()]


def _yes_no_problem(value: str) -> str | None:
    ok = value.strip().lower() in ("y", "yes", "n", "no", "true", "false", "1", "0")
    return None if ok else "y or n"


def url_problem(value: str) -> str | None:
    if _URL.match(value):
        return None
    return f"{value!r} is not an http(s) URL (like http://localhost:11434/v1)"


def port_problem(value: str) -> str | None:
    return None if value.isdigit() and 1 <= int(value) <= 65535 else f"{value!r} is not a port"


# -- what a test says, in words -------------------------------------------------------------

TIMEOUT = 10.0  # seconds for each request or connection of a test
MAX_DETAIL = 300
_SPAN = 10_000  # characters of a server's text looked at


def short(text: str) -> str:
    """One line of at most MAX_DETAIL characters (``…`` where it was cut)."""
    text = " ".join(text.split())[:_SPAN]
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


def http_problem(exc: httpx.HTTPError, url: str) -> str:
    url = display_url(url)
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url}: {short(str(exc)) or 'connection refused'}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url} did not answer within {TIMEOUT:g} s"
    return f"{url}: {short(str(exc)) or type(exc).__name__}"


def error_text(resp: httpx.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return short(resp.text)
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return short(str(err.get("message") or err))
        if isinstance(err, str):
            return short(f"{data.get('errcode', '')} {err}".strip())
    return short(resp.text)


@dataclass(frozen=True)
class Tried:
    """What a test of a section's answers found: ok or not, and in words what happened."""

    ok: bool
    detail: str  # what happened, in words
    models: list[str] = field(default_factory=list)  # the model listing's, when that was the check
    device_id: str | None = None  # a login's device, when the platform has one
    unlisted: bool = False  # the endpoint answers but has no model list (a completion may work)


def report(asker: Asker, result: Tried) -> bool:
    asker.say(f"  {'ok' if result.ok else 'FAILED'}: {result.detail}")
    return result.ok


def with_answers(cfg: Config, name: str, section: dict[str, Any]) -> Config:
    """``cfg`` with a section's answers in it: the defaults of the questions asked again."""
    data = cfg.model_dump()
    data[name] = {**data[name], **section}
    return config_class().model_validate(data)


@dataclass(frozen=True)
class Onboarding:
    """A channel's onboarding (its spec's ``onboard`` names one)."""

    # its questions' keys and what their flags say (``--<ch>-user`` answers ``<ch>_user``)
    questions: Mapping[str, str]
    # the owner's own addresses on it: (key, question, the problem with one answer)
    owner: tuple[str, str, Callable[[str], str | None]] | None
    # the section's answers after their test (None: skipped, config.toml keeps what it had)
    ask: Callable[[Asker, Config], dict[str, Any] | None]
    replaced: tuple[str, ...] = ()  # keys its answers replace as a whole (a password, a token)
    next_steps: Callable[[Mapping[str, Any]], list[str]] | None = None
