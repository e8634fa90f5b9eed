"""`relaybot memory profiles [ENTITY] [--all] [--json]`, `relaybot memory gaps [--all] [--json]`,
`relaybot memory gaps close ID [--why TEXT]`: layer 2, the entity profiles and capability gaps.

``profiles`` lists the current profile facts from the memory database, read-only (memory/view.py
``MemoryView.profile_facts``), for everyone or for one entity (a name, a handle
``channel:address``, an entity id, ``owner``): each fact's id, kind, confidence, the audience of
its evidence (the most private class among it), the log ids it rests on, first and last seen, how
it was made, and what it supersedes or contradicts. ``--all`` adds the versions it superseded, the
facts judged no longer relevant (retired, with why) and the erased ones (blank). The owner sees
everything here: the command reads the database, which only the owner can.

``gaps`` lists the capability gaps (``MemoryView.gaps``): where the assistant could not do what
someone asked, how often, the capability it needs, the evidence; ``--all`` adds closed ones.
``gaps close`` is an owner command (``memory.gap_close``) the worker applies, as every change to
memory; a gap closed that comes back is opened again.

Exit codes, as the other commands: 0 done, 1 failed (one line on stderr saying why), 2 a
configuration error.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json

if TYPE_CHECKING:
    from contract.config import Config
    from memory.view import MemoryView

# a fact (memory/profiles.py Fact) and a gap (memory/gaps.py Gap), as MemoryView gives them
_Fact = Any
_Gap = Any

EXIT_FAILED = 1
MAX_ID = (1 << 63) - 1  # SQLite's largest integer
MAX_WHY = 300


def _gap_id(text: str) -> int:
    """A gap's number: a whole number SQLite can hold (argparse says the error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a gap's number") from None
    if not 1 <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"{text!r} is not a gap's number (none is)")
    return value


def add_parsers(sub: Any) -> None:  # argparse's subparsers action has no public type
    p = sub.add_parser("profiles", help="what memory learnt about each person (layer 2)")
    p.add_argument("entity", nargs="?", help="only this one: a name, channel:address, id, owner")
    p.add_argument("--all", action="store_true", help="superseded, retired and erased versions too")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_profiles)

    g = sub.add_parser("gaps", help="what the assistant could not do: capability gaps")
    g.add_argument("--all", action="store_true", help="closed ones too")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.set_defaults(func=cmd_gaps)
    gsub = g.add_subparsers(dest="gaps_command", metavar="COMMAND")
    close = gsub.add_parser("close", help="close a gap (through the worker)")
    close.add_argument("id", type=_gap_id, help="the gap's number (relaybot memory gaps)")
    close.add_argument("--why", default="", help="why it is closed (default: closed by the owner)")
    close.add_argument("--json", action="store_true", help="print the worker's JSON result")
    close.set_defaults(func=cmd_gap_close)


def _fail(message: str) -> int:
    echo(f"relaybot: {message}", file=sys.stderr)
    return EXIT_FAILED


# -- whom ----------------------------------------------------------------------------------------


def resolve(view: MemoryView, ref: str, owner_name: str) -> list[str]:
    """The entities ``ref`` names: ``owner`` or the owner's name, an entity id, a handle, an
    address, or the name of an entity or a handle's display name (everyone who has it)."""
    who = " ".join(ref.split()).casefold()
    found: list[str] = []
    if who in ("owner", owner_name.strip().casefold()):
        found.append("owner")
    with contextlib.suppress(LookupError):  # unknown, or an address on several channels
        found.append(view.people.resolve(ref))
    for entity in view.people.entities():
        handles = view.people.handles_of(entity.id)
        if entity.name.strip().casefold() == who or any(
            h.display.strip().casefold() == who for h in handles
        ):
            found.append(entity.id)
    return list(dict.fromkeys(found))


def name_of(view: MemoryView, entity: str, owner_name: str, names: dict[str, str]) -> str:
    """``Bob (e-1a2b…, matrix:@bob:example.org)``; the owner by the configured name."""
    if entity in names:
        return names[entity]
    if entity == "owner":
        label = f"{owner_name or 'the owner'} (owner)"
    else:
        found = view.people.entity(entity)
        handles = view.people.handles_of(entity)
        shown = (found.name if found is not None else "") or next(
            (h.display for h in handles if h.display), ""
        )
        refs = ", ".join([entity, *(h.ref for h in handles)])
        label = f"{shown} ({refs})" if shown else refs
    names[entity] = label
    return label


# -- profiles ------------------------------------------------------------------------------------


def _times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


def state_of(fact: _Fact) -> str:
    """current, superseded, retired or erased."""
    if fact.erased is not None:
        return "erased"
    if fact.superseded_by is not None:
        return "superseded"
    if fact.retired is not None:
        return "retired"
    return "current"


def fact_line(fact: _Fact) -> list[str]:
    """A fact as the list shows it: its line, and its text (blank once erased) below."""
    from memory.view import stamp

    evidence = ", ".join(str(i) for i in fact.evidence) or "-"
    state = state_of(fact)
    chain = ""
    if fact.conflicts_with is not None:
        chain += f", contradicts #{fact.conflicts_with}"
    elif fact.supersedes is not None:
        chain += f", supersedes #{fact.supersedes}"
    if fact.superseded_by is not None:
        chain += f" by #{fact.superseded_by}"
    if state == "retired":
        chain += f", retired: {fact.retired_why or 'no longer relevant'}"
    head = (
        f"  #{fact.id} {fact.kind} {fact.confidence:.2f}, {fact.source_privacy}, log {evidence} "
        f"({fact.conversation}, {stamp(fact.first_seen)} to {stamp(fact.last_seen)}) "
        f"{fact.method}, {state}{chain}"
    )
    text = " ".join(fact.text.split())
    return [head, "      " + (text or "[erased]")]


def _read_facts(view: MemoryView, args: argparse.Namespace, owner_name: str) -> list[_Fact] | None:
    """The facts asked for, each once (None: ``ENTITY`` names nobody). An entity's facts come
    with those of every entity joined to it by a verified link (one person)."""
    if not args.entity:
        return view.profile_facts(None, include_all=args.all)
    entities = resolve(view, args.entity, owner_name)
    if not entities:
        return None
    found = {f.id: f for e in entities for f in view.profile_facts(e, include_all=args.all)}
    return sorted(found.values(), key=lambda f: (f.entity, f.id))


def cmd_profiles(args: argparse.Namespace, cfg: Config) -> int:
    from memory.errors import MemoryFailure
    from relaybot.cli_shared import open_memory

    if not cfg.memory_path.exists():
        return _nothing(args, f"no profiles (no memory database yet at {cfg.memory_path})")
    view = open_memory(cfg)
    if view is None:
        return EXIT_FAILED
    names: dict[str, str] = {}
    try:
        with view:
            facts = _read_facts(view, args, cfg.owner.name)
            for f in facts or []:
                name_of(view, f.entity, cfg.owner.name, names)
    except MemoryFailure as exc:
        return _fail(f"cannot read the profiles in {cfg.memory_path}: {exc}")
    if facts is None:
        return _fail(f"no entity, handle or name {args.entity!r} (see relaybot entities list)")
    if args.json:
        for f in facts:
            record = {**asdict(f), "state": state_of(f), "entity_name": names[f.entity]}
            echo_json(record, ensure_ascii=False)
        return 0
    if not facts:
        whom = f" of {args.entity}" if args.entity else ""
        more = "" if args.all else " (--all shows superseded, retired and erased ones)"
        echo(f"no current profile facts{whom}{more}")
        return 0
    by_entity: dict[str, list[_Fact]] = {}
    for f in facts:
        by_entity.setdefault(f.entity, []).append(f)
    for entity, group in by_entity.items():
        echo(names[entity])
        for f in group:
            for text in fact_line(f):
                echo(text)
    return 0


def _nothing(args: argparse.Namespace, message: str) -> int:
    if args.json:
        return 0
    echo(message)
    return 0


# -- gaps ----------------------------------------------------------------------------------------


def gap_line(gap: _Gap, name: str) -> list[str]:
    from memory.view import stamp

    evidence = ", ".join(str(i) for i in gap.evidence) or "-"
    needs = f", needs {gap.needs}" if gap.needs else ""
    status = gap.status
    if gap.status == "closed":
        status += f" ({gap.closed_reason})"
    elif gap.reopened:
        status += f" (reopened {_times(gap.reopened)})"
    head = (
        f"#{gap.id} {status}, {_times(gap.count)} from {stamp(gap.first_seen)} to "
        f"{stamp(gap.last_seen)}, {name}, {gap.source_privacy}{needs}, log {evidence}"
    )
    text = " ".join(gap.description.split())
    return [head, "    " + (text or "[erased]")]


def cmd_gaps(args: argparse.Namespace, cfg: Config) -> int:
    from memory.errors import MemoryFailure
    from relaybot.cli_shared import open_memory

    if not cfg.memory_path.exists():
        return _nothing(args, f"no capability gaps (no memory database yet at {cfg.memory_path})")
    view = open_memory(cfg)
    if view is None:
        return EXIT_FAILED
    names: dict[str, str] = {}
    try:
        with view:
            gaps = view.gaps(include_closed=args.all)
            for gap in gaps:
                name_of(view, gap.entity, cfg.owner.name, names)
    except MemoryFailure as exc:
        return _fail(f"cannot read the capability gaps in {cfg.memory_path}: {exc}")
    if args.json:
        for gap in gaps:
            echo_json({**asdict(gap), "entity_name": names[gap.entity]}, ensure_ascii=False)
        return 0
    if not gaps:
        echo("no open capability gaps" + ("" if args.all else " (--all shows closed ones)"))
        return 0
    for gap in gaps:
        for text in gap_line(gap, names[gap.entity]):
            echo(text)
    return 0


def cmd_gap_close(args: argparse.Namespace, cfg: Config) -> int:
    """An owner command: the worker, memory's only writer, closes the gap."""
    from relaybot.cli_shared import send_command

    why = " ".join(str(args.why or "").split()) or "closed by the owner"
    if len(why) > MAX_WHY:
        return _fail(f"--why is {len(why)} characters (at most {MAX_WHY})")

    def describe(result: dict[str, Any]) -> str:
        gap = result.get("gap") or {}
        what = " ".join(str(gap.get("description") or "").split())
        kept = " ".join(str(gap.get("closed_reason") or why).split())
        said = f" #{args.id}" + (f": {what}" if what else "") + f" ({kept})"
        if kept != why:  # closed before, for another reason: memory kept that one
            return f"gap{said} was closed already; closing it again changes nothing"
        return f"closed gap{said}"

    return send_command(cfg, "memory.gap_close", {"id": args.id, "why": why},
                        as_json=args.json, describe=describe)  # fmt: skip


__all__ = ["add_parsers", "cmd_gap_close", "cmd_gaps", "cmd_profiles"]
