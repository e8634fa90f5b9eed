"""`relaybot memory summaries|resummarize`: layer 1, the conversation summaries.

``summaries`` lists them from the memory database, read-only: their conversation, exact log range,
time span, how they were made (model or extractive fallback), and the versions they superseded
(``--all``: superseded and erased ones too). ``resummarize`` asks the worker (an owner command) to
enqueue a job per current summary of a conversation; each new version supersedes its old one when
the worker applies it (worker/derive.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json

if TYPE_CHECKING:
    from contract.config import Config

EXIT_FAILED = 1


def add_parsers(sub: Any) -> None:  # argparse's subparsers action has no public type
    p = sub.add_parser("summaries", help="the conversation summaries (layer 1) and their ranges")
    p.add_argument("--conversation", help="only this conversation")
    p.add_argument("--all", action="store_true", help="superseded and erased ones too")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_summaries)

    p = sub.add_parser("resummarize", help="derive a conversation's summaries again (new versions)")
    p.add_argument("--conversation", required=True, help="the conversation id")
    p.set_defaults(func=cmd_resummarize)


def cmd_summaries(args: argparse.Namespace, cfg: Config) -> int:
    from memory.errors import MemoryFailure
    from memory.view import stamp
    from relaybot.cli_shared import open_memory

    store = open_memory(cfg)
    if store is None:
        return EXIT_FAILED
    try:
        with store:
            found = store.summaries(args.conversation, every=args.all)
            current = {s.id for s in store.summaries(args.conversation)}
    except MemoryFailure as exc:
        echo(f"relaybot: cannot read the summaries: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        for s in found:
            echo_json({**asdict(s), "current": s.id in current}, ensure_ascii=False)
        return 0
    if not found:
        echo("no summaries" + (f" of {args.conversation}" if args.conversation else ""))
        return 0
    for s in found:
        state = "current" if s.id in current else ("erased" if s.erased else "superseded")
        sup = f", supersedes #{s.supersedes}" if s.supersedes is not None else ""
        echo(
            f"#{s.id} {s.conversation} log {s.first_id}..{s.last_id} ({s.rows} messages, "
            f"{stamp(s.first_ts)} to {stamp(s.last_ts)}) {s.method}, {state}{sup}"
        )
        if s.text:
            echo("    " + s.text.replace("\n", "\n    "))
    return 0


def cmd_resummarize(args: argparse.Namespace, cfg: Config) -> int:
    """An owner command: the worker enqueues the jobs (the terminal's Redis account may not touch
    rq's keys: deploy/redis/users.acl)."""
    from relaybot.cli_shared import send_command

    def describe(result: dict[str, Any]) -> str:
        enqueued = result.get("enqueued") or []
        if not enqueued:
            return (f"nothing enqueued: {args.conversation} has no current summaries, or their "
                    "new versions are queued, running or were derived a moment ago")  # fmt: skip
        return "\n".join(
            f"enqueued {args.conversation} log {p['first_id']}..{p['last_id']} as version "
            f"{p['version']}"
            for p in enqueued
        )

    return send_command(cfg, "memory.resummarize", {"conversation": args.conversation},
                        as_json=False, describe=describe)  # fmt: skip


__all__ = ["add_parsers", "cmd_resummarize", "cmd_summaries"]
