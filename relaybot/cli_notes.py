"""`relaybot memory notes list|show|search|add|supersede`: the scoped notes (memory/notes/).

``list``, ``show`` and ``search`` read the memory database read-only and show the owner every
note (the owner sees everything; ``--all`` adds superseded versions). ``add`` and ``supersede``
are owner commands: they go through the stream to the worker, the only writer, which answers
with the note written (``notes.add``, ``notes.supersede``; a replay adds nothing).

A note added here is ``--visibility private`` unless told otherwise: every one of the owner's
own conversations sees it, and no conversation with other people. ``--visibility public`` shares
it: with ``--scope shared`` (the default scope without ``--chat`` or ``--team``) it is public
knowledge, seen in every conversation, including those with other people; with ``--chat ID`` it
is seen in that conversation too.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json
from contract.timezone import owner_zone, stamp
from relaybot.cli_shared import EXIT_FAILED, open_memory, send_command

if TYPE_CHECKING:
    from contract.config import Config
    from memory.types import Note

LIST_LIMIT = 50
MAX_LIST = 10_000

_TYPES = ("fact", "decision", "action", "question", "note")
_SCOPES = ("shared", "chat", "agent", "team")
_VISIBILITIES = ("public", "private", "internal")


def add_parsers(sub: Any) -> None:  # argparse's subparsers action has no public type
    """Add `relaybot memory notes ...`; each subcommand sets `func(args, cfg) -> exit code`."""
    notes = sub.add_parser("notes", help="scoped notes: list, show, search, add, supersede")
    nsub = notes.add_subparsers(dest="notes_command", required=True, metavar="NOTES_COMMAND")

    p = nsub.add_parser("list", help="notes, newest first (superseded ones only with --all)")
    _filters(p)
    p.set_defaults(func=cmd_list)

    p = nsub.add_parser("search", help="notes matching words, most relevant first")
    p.add_argument("query", help="words to look for (in the topic and the text)")
    _filters(p)
    p.set_defaults(func=cmd_search)

    p = nsub.add_parser("show", help="one note with all its fields and its versions")
    p.add_argument("id", type=int, help="the note's id")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_show)

    p = nsub.add_parser("add", help="write a note (private to your own conversations unless told)")
    p.add_argument("text", help="the note")
    _placement(p, defaults=True)
    p.set_defaults(func=cmd_add)

    p = nsub.add_parser(
        "supersede", help="write a new version of a note (the old one stays, linked)"
    )
    p.add_argument("id", type=int, help="the note to supersede")
    p.add_argument("text", help="the new text")
    _placement(p, defaults=False)
    p.set_defaults(func=cmd_supersede)


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--type", choices=_TYPES)
    p.add_argument("--topic", help="exactly this topic (any case)")
    p.add_argument("--scope", choices=_SCOPES)
    p.add_argument("--visibility", choices=_VISIBILITIES)
    p.add_argument("--chat", help="notes of this conversation id")
    p.add_argument("--role", help="notes of this agent role")
    p.add_argument("--project", help="notes of this project")
    p.add_argument("--all", action="store_true", help="include superseded versions")
    p.add_argument("--limit", type=int, default=LIST_LIMIT, help=f"default {LIST_LIMIT}")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _placement(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    keep = " (default: the old note's)" if not defaults else ""
    p.add_argument("--type", choices=_TYPES, default="note" if defaults else None, help=keep)
    p.add_argument("--topic", default="" if defaults else None, help="a short topic" + keep)
    p.add_argument(
        "--scope",
        choices=_SCOPES,
        help=(
            "default: chat with --chat, team with --team, else shared"
            if defaults
            else keep.strip(" ()")
        ),
    )
    p.add_argument(
        "--visibility",
        choices=_VISIBILITIES,
        default="private" if defaults else None,
        help=(
            "default: private (your own conversations only); public shares it"
            if defaults
            else keep.strip(" ()")
        ),
    )
    p.add_argument("--chat", help="the conversation id of a chat-scoped note" + keep)
    p.add_argument("--role", help="the role of an agent-scoped note" + keep)
    p.add_argument("--team", help="the team of a team-scoped note" + keep)
    p.add_argument("--project", help="the project" + keep)
    p.add_argument("--json", action="store_true", help="print the worker's JSON result")


# -- writing: owner commands through the worker ------------------------------------------------


def _payload(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"text": args.text}
    for key in ("type", "topic", "scope", "visibility", "chat", "role", "team", "project"):
        value = getattr(args, key)
        if value is not None:
            out[key] = value
    return out


def cmd_add(args: argparse.Namespace, cfg: Config) -> int:
    if args.scope is None:
        args.scope = "chat" if args.chat else "team" if args.team else "shared"
    return send_command(cfg, "notes.add", _payload(args), as_json=args.json, describe=_written)


def cmd_supersede(args: argparse.Namespace, cfg: Config) -> int:
    payload = {"id": args.id, **_payload(args)}
    return send_command(cfg, "notes.supersede", payload, as_json=args.json, describe=_written)


def _written(result: dict[str, Any]) -> str:
    note = result.get("note") or {}
    verb = "wrote" if result.get("created") else "already had"
    return f"{verb} note #{note.get('id')}: {_reach(note)}"


def _reach(note: dict[str, Any]) -> str:
    """Where an owner's note is seen (memory/privacy.py, the notes rule)."""
    if note.get("visibility") != "public":
        return "seen only in your own conversations (add --visibility public to share it)"
    if note.get("scope") == "shared":
        return "public knowledge, seen in every conversation (with other people too)"
    if note.get("chat"):
        return f"seen in your own conversations and in conversation {note.get('chat')}"
    return "seen only in your own conversations"


# -- reading: the database, read-only ----------------------------------------------------------


def _find(args: argparse.Namespace, cfg: Config, query: str | None) -> int:
    store = open_memory(cfg)
    if store is None:
        return EXIT_FAILED
    with store:
        found = store.notes(
            query=query,
            limit=max(1, min(args.limit, MAX_LIST)),
            max_results=MAX_LIST,
            type=args.type,
            topic=args.topic,
            scope=args.scope,
            visibility=args.visibility,
            chat=args.chat,
            role=args.role,
            project=args.project,
            include_superseded=args.all,
        )
    if args.json:
        echo_json([n.as_dict() for n in found], indent=2, ensure_ascii=False)
    elif not found:
        echo("no notes" + (f" match {query!r}" if query else ""))
    else:
        for note in found:
            echo(describe(note))
    return 0


def cmd_list(args: argparse.Namespace, cfg: Config) -> int:
    return _find(args, cfg, None)


def cmd_search(args: argparse.Namespace, cfg: Config) -> int:
    return _find(args, cfg, args.query)


def cmd_show(args: argparse.Namespace, cfg: Config) -> int:
    store = open_memory(cfg)
    if store is None:
        return EXIT_FAILED
    with store:
        versions = store.note_versions(args.id)
    note = next((n for n in versions if n.id == args.id), None)
    if note is None:
        echo(f"relaybot: there is no note #{args.id}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        payload = {"note": note.as_dict(), "versions": [n.as_dict() for n in versions]}
        echo_json(payload, indent=2, ensure_ascii=False)
        return 0
    zone = owner_zone(cfg.owner.timezone)
    for key, value in note.as_dict().items():
        shown = stamp(float(value), zone) if key == "created_ts" else value
        echo(f"{key:>20}: {'-' if shown is None else shown}")
    if len(versions) > 1:
        echo("\nversions (oldest first):")
        for version in versions:
            mark = "*" if version.id == note.id else " "
            echo(f" {mark} {describe(version)}")
    return 0


def describe(note: Note) -> str:
    """One line for the owner: the note as the model sees it, plus where it lives."""
    from memory.view import format_note

    where = [
        f"{key}={value}"
        for key, value in (
            ("chat", note.chat),
            ("role", note.role),
            ("team", note.team),
            ("project", note.project),
            ("from", note.source_conversation or note.author),
        )
        if value
    ]
    return format_note(note, max_chars=300) + (f"   [{' '.join(where)}]" if where else "")
