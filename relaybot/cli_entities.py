"""`relaybot entities list|show|link|suggest|unlink|reject|merge|unmerge`, `relaybot onboard`.

``list`` and ``show`` read the memory database read-only. ``link``, ``suggest``, ``unlink``,
``reject`` and ``merge`` are owner commands: they go through the stream to the worker (the only
writer), which answers with the result (memory/identity.py). ``merge`` moves a handle (or every
handle of an entity) to the owner, audited: the repair when a handle was seen before it became an
owner alias (``list`` points such handles out). Entities are named by id (``e-…``, ``owner``), by
handle ``channel:address`` (``<channel>:@bob:example.org``) or by a bare address on one channel.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json
from contract.timezone import owner_zone, stamp
from relaybot.cli_shared import EXIT_FAILED, open_memory, send_command

if TYPE_CHECKING:
    from datetime import tzinfo

    from contract.config import Config
    from memory.types import People


def add_parsers(sub: Any) -> None:  # argparse's subparsers action has no public type
    """Add the entities subcommands; each sets `func(args, cfg) -> exit code`."""
    p = sub.add_parser("list", help="every entity: kind, name, handles, messages, links")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="one entity: handles, links with their status, messages")
    p.add_argument("ref", help="an entity id, a handle channel:address, or an address")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_show)

    for name, op, text in (
        ("link", "entities.link", "record that two handles are the same person (verified)"),
        ("suggest", "entities.suggest", "suggest that two handles are one person (merges nothing)"),
        ("unlink", "entities.unlink", "undo a link or a suggestion"),
        ("reject", "entities.reject", "dismiss a suggestion"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("a", help="an entity id, a handle channel:address, or an address")
        p.add_argument("b", help="the other one")
        p.add_argument("--reason", default="", help="why (kept with the link)")
        p.add_argument("--json", action="store_true", help="print the worker's JSON result")
        p.set_defaults(func=cmd_link, op=op)

    p = sub.add_parser(
        "merge",
        help="make a handle (or every handle of an entity) the owner's: its messages are "
        "labelled as the owner's from now on (audited; who may see them does not change)",
    )
    p.add_argument("ref", help="a handle channel:address, an entity id e-…, or an address")
    p.add_argument("--reason", default="", help="why (kept in the audit)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="print the worker's JSON result")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser(
        "unmerge",
        help="undo a merge: the handle goes back to the entity it was merged from (audited)",
    )
    p.add_argument("ref", help="the handle channel:address")
    p.add_argument("--reason", default="", help="why (kept in the audit)")
    p.add_argument("--json", action="store_true", help="print the worker's JSON result")
    p.set_defaults(func=cmd_unmerge)


def add_onboard_arguments(p: argparse.ArgumentParser) -> None:
    """``relaybot onboard``'s arguments (its parser is relaybot/cli.py's)."""
    from relaybot.onboard_ask import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_onboard)


def cmd_onboard(args: argparse.Namespace, cfg: Config) -> int:
    from relaybot.onboard import run_onboarding
    from relaybot.onboard_ask import asker_for

    return run_onboarding(cfg, force=args.force, asker=asker_for(args))


# -- writing: owner commands through the worker ------------------------------------------------


def cmd_link(args: argparse.Namespace, cfg: Config) -> int:
    payload = {"a": args.a, "b": args.b, "reason": args.reason}
    return send_command(
        cfg,
        args.op,
        payload,
        as_json=args.json,
        describe=lambda result: describe_link_result(args.op, result),
    )


def cmd_merge(args: argparse.Namespace, cfg: Config) -> int:
    if not args.yes:
        question = (
            f"Merge {args.ref} into the owner? Its messages, earlier ones included, will be "
            "labelled as the owner's in every conversation (`relaybot entities unmerge` undoes "
            "it). [y/N] "
        )
        if not sys.stdin.isatty():
            echo("relaybot: merging needs confirmation: run it in a terminal, or add --yes",
                 file=sys.stderr)  # fmt: skip
            return 1
        if input(question).strip().lower() not in ("y", "yes"):
            echo("nothing merged")
            return 1
    payload = {"ref": args.ref, "reason": args.reason}
    return send_command(
        cfg, "entities.merge", payload, as_json=args.json, describe=describe_merge_result
    )


def cmd_unmerge(args: argparse.Namespace, cfg: Config) -> int:
    payload = {"ref": args.ref, "reason": args.reason}
    return send_command(
        cfg,
        "entities.unmerge",
        payload,
        as_json=args.json,
        describe=lambda r: f"{r.get('unmerged')} is {r.get('back_to')}'s again (not the owner's)",
    )


def describe_merge_result(result: dict[str, Any]) -> str:
    merged = result.get("merged") or []
    lines = [f"merged into the owner (from {result.get('from')}): {', '.join(merged)}"]
    lines.append("their messages, earlier ones included, are now labelled as the owner's")
    return "\n".join(lines)


def describe_link_result(op: str, result: dict[str, Any]) -> str:
    a, b, status = result.get("a"), result.get("b"), result.get("status")
    verb = "is now" if result.get("changed") else "was already"
    lines = [f"{a} — {b}: {verb} {status}"]
    person_a = result.get("person_a") or []
    if len(person_a) > 1:
        lines.append(f"one person: {', '.join(person_a)}")
    else:
        lines.append(f"{a} and {b} are separate people")
    if op == "entities.suggest":
        lines.append("(a suggestion shares nothing until you link them)")
    return "\n".join(lines)


# -- reading: the database, read-only ----------------------------------------------------------


def _when(ts: float | None, zone: tzinfo | None) -> str:
    """In the owner's zone, with its offset (``2026-11-22 11:04 +01:00``; ``… UTC``)."""
    return "-" if ts is None else stamp(ts, zone)


def entity_table(people: People, cfg: Config) -> list[dict[str, Any]]:
    """Every entity with its handles, message count, last message and link counts."""
    from memory.types import OWNER, OwnerResolver

    handles: dict[str, list[str]] = {}
    for channel, address, entity in people.handles():
        handles.setdefault(str(entity), []).append(f"{channel}:{address}")
    counts = people.message_counts()
    links: dict[str, dict[str, int]] = {}
    for link in people.links():
        for entity in (link.a, link.b):
            per = links.setdefault(entity, {})
            per[link.status] = per.get(link.status, 0) + 1
    entities = [(e.id, e.kind, e.name, e.created_ts) for e in people.entities()]
    if OWNER not in {e[0] for e in entities}:
        entities.insert(0, (OWNER, "person", cfg.owner.name, 0.0))
    resolver = OwnerResolver(cfg.owner_aliases)
    owner_aliases = [f"{channel or '*'}:{address}" for channel, address in resolver.aliases()]
    owner_aliases += [f"{h} (merged)" for h in handles.get(OWNER, [])]
    out: list[dict[str, Any]] = []
    for entity, kind, name, created in entities:
        n, last = counts.get(entity, (0, 0))
        last_ts = people.message_ts(last) if last else None
        out.append(
            {
                "id": entity,
                "kind": kind,
                "name": cfg.owner.name if entity == OWNER else name,
                "handles": owner_aliases if entity == OWNER else handles.get(entity, []),
                "messages": n,
                "last_message": last_ts,
                "created": created or None,
                "links": links.get(entity, {}),
                # handles the configuration says are the owner's, still under another entity
                "owner_aliases": []
                if entity == OWNER
                else [h for h in handles.get(entity, []) if resolver.is_owner(*h.split(":", 1))],
            }
        )
    return out


def cmd_list(args: argparse.Namespace, cfg: Config) -> int:
    store = open_memory(cfg)
    if store is None:
        return EXIT_FAILED
    with store:
        table = entity_table(store.people, cfg)
    if args.json:
        echo_json(table, indent=2, ensure_ascii=False)
        return 0
    zone = owner_zone(cfg.owner.timezone)
    echo(f"{'ENTITY':<16} {'KIND':<8} {'MSGS':>6}  {'LAST':<23} {'LINKS':<12} NAME / HANDLES")
    for e in table:
        links = ", ".join(f"{n} {s}" for s, n in sorted(e["links"].items())) or "-"
        echo(
            f"{e['id']:<16} {e['kind']:<8} {e['messages']:>6}  "
            f"{_when(e['last_message'], zone):<23} "
            f"{links:<12} {e['name']}"
        )
        for handle in e["handles"]:
            echo(f"{'':<69} {handle}")
        for handle in e["owner_aliases"]:
            echo(
                f"{'':<69} ! {handle} is an owner alias: relaybot entities merge {handle}",
            )
    return 0


def entity_detail(people: People, cfg: Config, ref: str) -> dict[str, Any]:
    """One entity: handles, person, links (state and history) and message counts.

    Raises LookupError if ``ref`` names no entity.
    """
    from memory.types import OWNER, OwnerResolver

    entity = people.resolve(ref)
    found = people.entity(entity)
    handles: list[dict[str, Any]]
    if entity == OWNER:
        handles = [
            {"handle": f"{channel or '*'}:{address}", "display": "", "first_seen": None}
            for channel, address in OwnerResolver(cfg.owner_aliases).aliases()
        ]
        handles += [
            {"handle": f"{h.ref} (merged)", "display": h.display, "first_seen": h.first_seen}
            for h in people.handles_of(entity)
        ]
    else:
        handles = [
            {"handle": h.ref, "display": h.display, "first_seen": h.first_seen}
            for h in people.handles_of(entity)
        ]

    def link_dict(link: Any) -> dict[str, Any]:
        other = link.b if link.a == entity else link.a
        return {
            "with": other,
            "status": link.status,
            "reason": link.reason,
            "actor": link.actor,
            "ts": link.ts,
        }

    by_channel = people.messages_by_channel(entity)
    conversations = [
        {"conversation": c, "privacy": p, "messages": n}
        for c, p, n in people.conversations_of(entity, 20)
    ]
    span = people.message_span(entity)
    return {
        "id": entity,
        "kind": found.kind if found else "person",
        "name": cfg.owner.name if entity == OWNER else (found.name if found else ""),
        "created": found.created_ts if found else None,
        "handles": handles,
        "person": sorted(people.person(entity)),
        "links": [link_dict(link) for link in people.links(entity)],
        "link_history": [link_dict(link) for link in people.link_history(entity)],
        "merges": [
            {
                "handle": m.ref,
                "from": m.from_entity,
                "to": m.to_entity,
                "reason": m.reason,
                "actor": m.actor,
                "ts": m.ts,
            }
            for m in people.moves(entity)
        ],
        "messages": sum(by_channel.values()),
        "messages_by_channel": by_channel,
        "conversations": conversations,
        "first_message": span[0] if span else None,
        "last_message": span[1] if span else None,
    }


def cmd_show(args: argparse.Namespace, cfg: Config) -> int:
    store = open_memory(cfg)
    if store is None:
        return EXIT_FAILED
    with store:
        try:
            detail = entity_detail(store.people, cfg, args.ref)
        except LookupError as exc:
            echo(f"relaybot: {exc}", file=sys.stderr)
            return EXIT_FAILED
    if args.json:
        echo_json(detail, indent=2, ensure_ascii=False)
        return 0
    zone = owner_zone(cfg.owner.timezone)
    echo(f"{detail['id']}  ({detail['kind']})  {detail['name']}")
    echo(f"  created   {_when(detail['created'], zone)}")
    echo("  handles")
    for h in detail["handles"] or [{"handle": "(none)", "display": "", "first_seen": None}]:
        shown = f" — {h['display']}" if h["display"] else ""
        echo(f"    {h['handle']}{shown}")
    if len(detail["person"]) > 1:
        echo(f"  person    {', '.join(detail['person'])} (verified links)")
    echo("  links")
    if not detail["links"]:
        echo("    (none)")
    for link in detail["links"]:
        why = f" — {link['reason']}" if link["reason"] else ""
        when = _when(link["ts"], zone)
        echo(f"    {link['with']:<16} {link['status']:<10} {when} by {link['actor']}{why}")
    for m in detail["merges"]:
        why = f" — {m['reason']}" if m["reason"] else ""
        echo(f"  merged    {m['handle']}: {m['from']} → {m['to']} {_when(m['ts'], zone)}{why}")
    channels = ", ".join(f"{c} {n}" for c, n in detail["messages_by_channel"].items())
    echo(f"  messages  {detail['messages']}" + (f" ({channels})" if channels else ""))
    if detail["messages"]:
        echo(f"  first     {_when(detail['first_message'], zone)}")
        echo(f"  last      {_when(detail['last_message'], zone)}")
    for conv in detail["conversations"]:
        echo(f"    {conv['messages']:>6}  {conv['conversation']} ({conv['privacy']})")
    return 0
