"""`relaybot memory erase`: the owner's erasure, to be read before it is confirmed.

The preview is planned here, reading memory read-only (memory/erasure_plan.py): the target's own
log entries (a count), then every reply and note derived from them, one line each — its id as
``--keep`` takes it (``reply:N``, ``note:N``), its hop, the erased row (or note) it drew on, and
its first words — then what ``--keep`` keeps and the replies one hop past the bound, which are
left, and the scheduled items that end with it (``scheduled:N``: cancelled for good, their text
and their occurrences' messages erased; they cannot be kept). After ``Type 'erase'`` (or
``--yes``) one ``memory.erase`` owner command goes to the worker, which plans again from memory
as it is then (whatever was derived since the preview goes too; a ``--keep`` that no longer
names one of its items refuses the erasure) and answers with the receipt: what went, with hops,
and each place outside memory it cleaned (worker/erasures.py). ``--dry-run`` prints the preview
and erases nothing. Exit codes: 0 done, 1 failed or not confirmed, 2 configuration error.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from contract import channels as registry
from contract.terminal import echo, echo_json

if TYPE_CHECKING:
    from contract.config import Config
    from memory.types import ErasurePlan, Item

EXIT_FAILED = 1
ERASE_TIMEOUT = 150.0  # the worker waits up to 2 x 60 s for Redis to rewrite its files


def add_parser(sub: Any) -> None:  # argparse's subparsers action has no public type
    p = sub.add_parser(
        "erase",
        help="erase what a person or conversation said, or one entry (audited)",
        description="Erase a text from memory and every copy relaybot keeps, with the replies "
        "and notes derived from it (up to 3 hops). It first lists what goes; --keep keeps a "
        "listed reply or note.",
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--entity", help="a person: entity id (e-…) or handle channel:address")
    target.add_argument("--conversation", help="a conversation id (as `memory search` shows)")
    target.add_argument("--id", type=int, help="one log entry by its id")
    p.add_argument("--reason", required=True, help="why (kept in the tombstone)")
    p.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="reply:ID|note:ID",
        help="keep this reply or note the preview lists (repeatable; recorded in the tombstone)",
    )
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--dry-run", action="store_true", help="print what it would erase, erase nothing"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_erase)


def _fail(message: str) -> int:
    echo(f"relaybot: {message}", file=sys.stderr)
    return EXIT_FAILED


def _target(args: argparse.Namespace) -> tuple[str, str]:
    if args.entity is not None:
        return "entity", str(args.entity)
    if args.conversation is not None:
        return "conversation", str(args.conversation)
    return "id", str(args.id)


def _plan(cfg: Config, kind: str, target: str, keep: list[str]) -> ErasurePlan | None:
    """The plan, read here (None when memory cannot be read: the worker decides); raises
    CommandError when there is nothing to erase or a ``--keep`` is wrong."""
    from memory.errors import CommandError, MemoryFailure
    from memory.view import MemoryView

    try:
        with MemoryView(cfg.memory_path) as store:
            plan = store.erasure_preview(kind, target, keep)
    except MemoryFailure as exc:
        echo(f"relaybot: cannot preview ({exc}); the worker will decide", file=sys.stderr)
        return None
    if plan.empty:
        raise CommandError(f"nothing to erase for {kind} {target} (already erased?)")
    return plan


def _line(item: Item) -> str:
    words = f'"{item.words}"' if item.words else "(empty)"
    return f"  {item.ref:<12} hop {item.hop}  drew on {item.drew_on:<14} {words}"


def render_preview(plan: ErasurePlan) -> str:
    """What the erasure removes, item by item (see the module docstring)."""
    from memory.types import MAX_HOPS

    people = f" (entities {', '.join(plan.entities)})" if plan.entities else ""
    lines = [
        f"This erases {plan.kind} {plan.target}{people}: the text of {plan.own_rows} of its own "
        f"log entries, and {len(plan.items)} replies and notes derived from them "
        f"(up to {MAX_HOPS} hops):"
    ]
    lines += [_line(i) for i in plan.items] or ["  (none)"]
    if plan.kept:
        lines.append(f"kept, as --keep asks ({len(plan.kept)}):")
        lines += [_line(i) for i in plan.kept]
    if plan.beyond:
        refs = ", ".join(f"reply:{i}" for i in plan.beyond[:20])
        more = f" and {len(plan.beyond) - 20} more" if len(plan.beyond) > 20 else ""
        lines.append(
            f"left by the bound: {len(plan.beyond)} replies one hop further drew on these "
            f"({refs}{more}); erase one with --id if it holds the text"
        )
    if plan.quote_ids:
        lines.append(f"also: its quotes in {len(plan.quote_ids)} later messages (their own "
                     "text stays)")  # fmt: skip
    if plan.subject_ids:
        lines.append(f"also: its subject in {len(plan.subject_ids)} later mails of its thread "
                     "(their own text stays)")  # fmt: skip
    if plan.scheduled:
        lines.append(f"and {len(plan.scheduled)} scheduled items, cancelled for good with their "
                     "text and the messages of their occurrences:")  # fmt: skip
        lines += [_line(i) for i in plan.scheduled]
    if plan.fact_ids or plan.gap_ids:
        lines.append(f"and what layer 2 derived from it: {len(plan.fact_ids)} profile facts "
                     f"({_refs('fact', plan.fact_ids)}) and {len(plan.gap_ids)} capability gaps "
                     f"({_refs('gap', plan.gap_ids)}), blanked; their ranges are derived again "
                     "from what remains")  # fmt: skip
    lines.append("and every copy Redis holds. It cannot be undone; a tombstone records what, "
                 "when, why (no text).")  # fmt: skip
    if plan.items:
        lines.append("To keep a listed reply or note, run it again with --keep reply:ID or "
                     "--keep note:ID.")  # fmt: skip
    return "\n".join(lines)


def _plan_json(plan: ErasurePlan) -> dict[str, Any]:
    def item(i: Item) -> dict[str, Any]:
        return {**i.record(), "ref": i.ref, "words": i.words}

    return {
        "kind": plan.kind,
        "target": plan.target,
        "own_rows": plan.own_rows,
        "log_rows": len(plan.log_ids),
        "notes": len(plan.note_ids),
        "derived": [item(i) for i in plan.items],
        "kept": [item(i) for i in plan.kept],
        "beyond_bound": plan.beyond,
        "quotes": len(plan.quote_ids),
        "subjects": len(plan.subject_ids),
        "scheduled": [item(i) for i in plan.scheduled],
        "facts": plan.fact_ids,
        "gaps": plan.gap_ids,
    }


def _dry_run(plan: ErasurePlan | None, preview: str, *, as_json: bool) -> int:
    if plan is None:
        return EXIT_FAILED
    if as_json:
        echo_json(_plan_json(plan), indent=2, ensure_ascii=False)
    else:
        echo(preview)
    return 0


def _confirmed(preview: str) -> bool:
    echo(preview)
    try:
        answer = input("Type 'erase' to go on: ")
    except EOFError:
        answer = ""
    return answer.strip().lower() == "erase"


def cmd_erase(args: argparse.Namespace, cfg: Config) -> int:
    import getpass

    from memory.errors import CommandError
    from relaybot.owner_commands import CommandFailed, run_command

    kind, target = _target(args)
    if not args.reason.strip():
        return _fail("--reason must say why (it is kept in the tombstone)")
    keep = [str(k).strip() for k in args.keep]
    try:
        plan = _plan(cfg, kind, target, keep)
    except CommandError as exc:
        return _fail(str(exc))
    preview = render_preview(plan) if plan is not None else f"This erases {kind} {target}."
    if args.dry_run:
        return _dry_run(plan, preview, as_json=args.json)
    if not args.yes:
        if not sys.stdin.isatty():
            return _fail(
                "erasing needs confirmation: run it in a terminal, or add --yes "
                "(--dry-run shows what it would erase)"
            )
        if not _confirmed(preview):
            echo("nothing erased")
            return EXIT_FAILED
    request = {
        "kind": kind,
        "target": target,
        "reason": args.reason,
        "requested_by": getpass.getuser(),
        "keep": keep,
    }
    try:
        # the worker also cleans Redis and has it rewrite its files before it answers
        result = run_command(cfg, "memory.erase", request, timeout=ERASE_TIMEOUT)
    except CommandFailed as exc:
        return _fail(str(exc))
    if args.json:
        echo_json(result, indent=2, ensure_ascii=False)
    if not result.get("ok"):
        return _fail(str(result.get("error")))
    if not args.json:
        echo(render_receipt(kind, target, result))
    return 0


def render_receipt(kind: str, target: str, result: dict[str, Any]) -> str:
    """What went (with hops) and every place the erasure cleaned, one per line."""
    derived = int(result.get("derived_replies") or 0)
    lines = [
        f"erased {kind} {target}: tombstone #{result['erasure']}",
        f"  memory:        {result['log_rows']} log entries ({derived} of them replies that drew "
        f"on the text), {result['notes']} notes",
    ]
    items = [d for d in result.get("derived") or [] if isinstance(d, dict)]
    if items:
        by_hop: dict[int, list[str]] = {}
        for d in items:
            by_hop.setdefault(int(d.get("hop") or 0), []).append(f"{d.get('kind')}:{d.get('id')}")
        lines += [f"  hop {h}:         {', '.join(refs)}" for h, refs in sorted(by_hop.items())]
    scheduled = [s for s in result.get("scheduled") or [] if isinstance(s, dict)]
    if scheduled:
        refs = ", ".join(f"#{s.get('id')} (hop {s.get('hop')})" for s in scheduled)
        lines.append(f"  scheduled:     {len(scheduled)} items cancelled, text blanked: {refs}")
    facts, gaps = _ids(result.get("facts")), _ids(result.get("gaps"))
    if facts or gaps:
        lines.append(f"  layer 2:       {len(facts)} profile facts ({_refs('fact', facts)}), "
                     f"{len(gaps)} capability gaps ({_refs('gap', gaps)}) blanked")  # fmt: skip
    if result.get("kept"):
        lines.append(f"  kept:          {', '.join(str(k) for k in result['kept'])}")
    if result.get("beyond_bound"):
        left = ", ".join(f"reply:{i}" for i in result["beyond_bound"])
        lines.append(f"  left (bound):  {left} (one hop past the bound of "
                     f"{result.get('hop_bound')})")  # fmt: skip
    cleaned = result.get("cleaned")
    if not isinstance(cleaned, dict):
        lines.append("  elsewhere:     not reported (a worker from before this version?)")
        return "\n".join(lines)
    lines.append(f"  memory WAL:    {cleaned.get('memory_wal')}")
    redis = cleaned.get("redis")
    if isinstance(redis, dict):
        lines += [
            f"  Redis:         {redis.get('stream_entries')} stream entries, "
            f"{redis.get('queued_replies')} queued and {redis.get('inflight_replies')} in-flight "
            f"replies, {redis.get('dead_letters')} dead letters"
            + "".join(
                f", {hook.said(redis)}"
                for hook in registry.erasures().values()
                if hook.said is not None
            ),
            f"  Redis streams: {redis.get('streams')}",
            f"  Redis AOF:     {redis.get('aof')}",
            f"  Redis RDB:     {redis.get('rdb')}",
        ]
    else:
        lines.append(f"  Redis:         {redis}")
    if cleaned.get("todo_md"):
        lines.append(f"  TODO.md:       {cleaned.get('todo_md')}")
    lines.append(f"  process logs:  {cleaned.get('process_logs')}")
    return "\n".join(lines)


def _ids(raw: object) -> list[int]:
    return [i for i in raw if isinstance(i, int)] if isinstance(raw, list) else []


def _refs(kind: str, ids: list[int], most: int = 20) -> str:
    """``fact:3, fact:9`` (at most ``most``, then how many more)."""
    if not ids:
        return "none"
    more = f" and {len(ids) - most} more" if len(ids) > most else ""
    return ", ".join(f"{kind}:{i}" for i in ids[:most]) + more


__all__ = ["add_parser", "cmd_erase", "render_preview", "render_receipt"]
