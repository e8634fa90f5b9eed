"""How `relaybot onboard` asks: on a terminal, from scripted answers on stdin, or not at all.

Every question has a key (``name``, ``model_url``, a channel's ``<ch>_...``). An answer given on
the command line (``--model-url URL``: :attr:`Asker.preset`) is taken without asking; with
``--no-input`` nothing is asked at all and a question without an answer takes its default (a
required one without default stops onboarding, naming its flag). Otherwise the question is asked
on stdout and read from stdin, a terminal or a pipe (one answer per line), secrets without echo
on a terminal.

When a check fails (the model endpoint, a gateway's login), :meth:`Asker.after_failure`
says what to do: ask (retry, keep the answers anyway, or skip the section), or what
``--on-failure`` says (``keep``, ``skip``, ``fail``; ``--no-input`` means ``fail`` unless told).
"""

from __future__ import annotations

import argparse

from contract import channels as registry
from contract.config import check_model_url
from contract.onboarding import (
    Asker,
    Cancelled,
    CheckFailed,
    Decision,
    Onboarding,
    OnFailure,
    flag,
    port_problem,
    split,
    url_problem,
)

__all__ = [
    "QUESTIONS",
    "Asker",
    "Cancelled",
    "CheckFailed",
    "Decision",
    "OnFailure",
    "flag",
    "onboardings",
    "port_problem",
    "split",
    "url_problem",
]


def onboardings() -> dict[str, Onboarding]:
    """Each channel's onboarding (its spec's ``onboard``), in the registry's order."""
    return {ch.name: registry.load(ch.onboard) for ch in registry.channels() if ch.onboard}


# every question's key and what its flag says (``--model-url`` answers ``model_url``)
QUESTIONS: dict[str, str] = {
    "name": "your name (how the assistant calls you)",
    "terminal": "your user name at the terminal ('' : anyone at it)",
    **{o.owner[0]: o.owner[1] for o in onboardings().values() if o.owner is not None},
    "model_url": "the model endpoint's base URL ('' : set it later)",
    "api_key": "the model endpoint's API key",
    "model": "the model: its name, or its number in the endpoint's list",
    **{key: text for o in onboardings().values() for key, text in o.questions.items()},
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


def model_url_problem(value: str) -> str | None:
    """What the model client could not use (never repeating the URL: a key may ride in it)."""
    try:
        check_model_url(value)
    except ValueError as exc:
        return f"that base URL cannot be used: {exc}"
    return None
