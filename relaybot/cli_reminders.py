"""`relaybot reminders [--json] [--all]`, `reminders add`, `reminders cancel ID`: scheduled work.

The list reads the memory database read-only (memory/view.py ``MemoryView.scheduled``): each
waiting item's id, conversation, next time in the owner's time zone (``[owner] timezone``, else
the system's), how it recurs, its late policy and its text; ``--all`` adds the items that ended
(done, cancelled, erased), with what their occurrences became.

``add`` and ``cancel`` are owner commands (``schedule.add``, ``schedule.cancel``): the worker,
memory's only writer, checks them against ``[schedule]`` and stores them
(worker/schedule_commands.py); a replay adds nothing twice. ``add``'s times, and whether
``cancel``'s item is there and waiting, are checked here first too, so a mistyped time or id is
said at once, without a worker (the worker checks again).
``--session`` names where it fires: ``NAME`` or ``cli:NAME`` (a terminal chat session, as
``relaybot chat --session NAME``), or another channel's session memory has seen (its newest
message's conversation and privacy); without it, your newest terminal chat session.

Exit codes, as the other commands: 0 done, 1 refused or failed (one line on stderr saying why),
2 a configuration error.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json

if TYPE_CHECKING:
    from datetime import tzinfo

    from contract.config import Config
    from memory.types import ScheduledItem

EXIT_FAILED = 1
TEXT_SHOWN = 120  # characters of an item's text in the list (--json has all of it)


MAX_TEXT = 2000  # characters of a reminder's text (memory/schedule.py MAX_TEXT: the worker's check)
MAX_ID = (1 << 63) - 1  # SQLite's largest integer


def _item_id(text: str) -> int:
    """A reminder's number: a whole number SQLite can hold (argparse says the error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a reminder's number") from None
    if not 1 <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"{text!r} is not a reminder's number (none is)")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``relaybot reminders``'s arguments and subcommands (its parser is relaybot/cli.py's)."""
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", help="ended ones too (done, cancelled, erased)")
    p.set_defaults(func=cmd_list)
    sub = p.add_subparsers(dest="reminders_command", metavar="COMMAND")

    add = sub.add_parser("add", help="set a reminder or a recurring task (through the worker)")
    when = add.add_mutually_exclusive_group()
    when.add_argument(
        "--at", metavar="TIME", help="ISO 8601, e.g. 2026-11-29T09:00 (your zone without offset)"
    )
    when.add_argument("--in", dest="in_", metavar="DURATION", help="90s, 10m, 2h, 3d, 1h30m, 1w")
    add.add_argument(
        "--every", metavar="CRON", help="repeat: a 5-field cron expression in your zone"
    )
    add.add_argument("--until", metavar="TIME", help="a recurring one stops after this time")
    add.add_argument(
        "--late",
        choices=("deliver", "skip"),
        help="an occurrence missed while relaybot was down: deliver once, saying how late, or "
        "skip it (default: [schedule] late)",
    )
    add.add_argument(
        "--session",
        metavar="SESSION",
        help="where it fires: NAME (a terminal chat session) or a channel's session, e.g. "
        "matrix:!room:example.org (default: your newest terminal chat session)",
    )
    add.add_argument("--json", action="store_true", help="print the worker's JSON result")
    add.add_argument("text", nargs="+", help="what to remind you of")
    add.set_defaults(func=cmd_add)

    cancel = sub.add_parser("cancel", help="cancel a reminder by its id (through the worker)")
    cancel.add_argument("id", type=_item_id, help="the reminder's number (relaybot reminders)")
    cancel.add_argument("--json", action="store_true", help="print the worker's JSON result")
    cancel.set_defaults(func=cmd_cancel)


def _zone(cfg: Config) -> tzinfo | None:
    from contract.timezone import owner_zone

    return owner_zone(cfg.owner.timezone)


def _fail(message: str) -> int:
    echo(f"relaybot: {message}", file=sys.stderr)
    return EXIT_FAILED


# -- the list ----------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace, cfg: Config) -> int:
    from memory.errors import MemoryFailure
    from memory.view import MemoryView

    if not cfg.memory_path.exists():
        if args.json:
            echo_json([])
        else:
            echo(f"no reminders (no memory database yet at {cfg.memory_path})")
        return 0
    try:
        with MemoryView(cfg.memory_path) as view:
            items = view.scheduled(include_ended=args.all)
            runs = view.scheduled_runs([i.id for i in items]) if args.all else {}
    except MemoryFailure as exc:
        return _fail(f"cannot read the reminders in {cfg.memory_path}: {exc}")
    zone = _zone(cfg)
    if args.json:
        echo_json(
            [record(item, zone, runs.get(item.id, []) if args.all else None) for item in items],
            indent=2,
            ensure_ascii=False,
        )
        return 0
    if not items:
        echo("no reminders waiting" + ("" if args.all else " (--all shows ended ones)"))
        return 0
    for item in items:
        echo(line(item, zone))
        for run in runs.get(item.id, []) if args.all else []:
            echo(f"      {_stamp(run.occurrence, zone)} {run.outcome} (entry {run.stream_id})")
    return 0


def _stamp(ts: float, zone: tzinfo | None) -> str:
    from contract.timezone import stamp

    return stamp(ts, zone)


def _recurrence(item: ScheduledItem, zone: tzinfo | None) -> str:
    from worker.schedule_rules import describe_recurrence

    how = "once" if item.cron is None else describe_recurrence(item.cron)
    if item.until is not None:
        how += f" until {_stamp(item.until, zone)}"
    return how


def record(item: ScheduledItem, zone: tzinfo | None, runs: list[Any] | None) -> dict[str, Any]:
    """An item for ``--json``: every stored field, its next time in the owner's zone and its
    recurrence in words (and, with ``--all``, its runs)."""
    out = {
        **item.record(),
        "next_at": _stamp(item.next_due, zone) if item.next_due is not None else None,
        "recurrence": _recurrence(item, zone),
    }
    if runs is not None:
        out["runs"] = [
            {
                "occurrence": r.occurrence,
                "outcome": r.outcome,
                "stream_id": r.stream_id,
                "at": r.at,
            }
            for r in runs
        ]
    return out


def line(item: ScheduledItem, zone: tzinfo | None) -> str:
    """One item as one line: id, when (or how it ended), recurrence, late policy, where, text."""
    if item.status == "active" and item.next_due is not None:
        when = f"next {_stamp(item.next_due, zone)}"
    else:
        when = item.status
        if item.ended is not None:
            when += f" {_stamp(item.ended, zone)}"
    counts = ""
    if item.fired or item.skipped or item.status != "active":
        counts = f", fired {item.fired}, skipped {item.skipped}"
        if item.last_occurrence is not None:
            counts += f" (last {_stamp(item.last_occurrence, zone)}: {item.last_outcome})"
    text = " ".join(item.text.split())
    if len(text) > TEXT_SHOWN:
        text = text[: TEXT_SHOWN - 1] + "…"
    if item.status == "erased":
        text = "[erased]"
    return (
        f"#{item.id} {when}, {_recurrence(item, zone)}, late: {item.late}{counts}, "
        f"in {item.conversation}: {text}"
    )


# -- add and cancel: owner commands through the worker -----------------------------------------


def cmd_add(args: argparse.Namespace, cfg: Config) -> int:
    from datetime import UTC

    from relaybot.cli_shared import send_command
    from worker.schedule_rules import ScheduleError, plan

    text = " ".join(args.text).strip()
    if not text:
        return _fail("a reminder needs a text: say what to remind of")
    if len(text) > MAX_TEXT:  # said here: a long one would not even fit in the command's entry
        return _fail(
            f"a reminder's text is at most {MAX_TEXT} characters (this one has {len(text)}): "
            "shorten it"
        )
    try:  # said at once; the worker checks again (its clock, its limits)
        plan(at=args.at, in_=args.in_, every=args.every, until=args.until,
             zone=_zone(cfg) or UTC, now=time.time(), min_every=cfg.schedule.min_every)  # fmt: skip
    except ScheduleError as exc:
        return _fail(str(exc))
    given = {"at": args.at, "in": args.in_, "every": args.every, "until": args.until,
             "late": args.late, "session": args.session}  # fmt: skip
    payload: dict[str, Any] = {"text": text, **{k: v for k, v in given.items() if v is not None}}

    def said(result: dict[str, Any]) -> str:
        item = result.get("item") or {}
        head = "set" if result.get("created") else "already set (nothing added)"
        where = str(item.get("session", ""))
        out = (
            f"reminder #{item.get('id')} {head}: next {result.get('next')}, "
            f"{result.get('recurrence')}, late: {item.get('late')}, in {where}"
        )
        if where.startswith("cli:"):
            out += f" (relaybot chat --session {where.removeprefix('cli:')} shows it)"
        return out

    return send_command(cfg, "schedule.add", payload, as_json=args.json, describe=said)


def cmd_cancel(args: argparse.Namespace, cfg: Config) -> int:
    from relaybot.cli_shared import send_command

    refused = _not_cancellable(cfg, args.id)
    if refused is not None:
        return _fail(refused)

    def said(result: dict[str, Any]) -> str:
        item = result.get("item") or {}
        text = " ".join(str(item.get("text", "")).split())
        return f"cancelled reminder #{item.get('id')} in {item.get('conversation')}: {text}"

    return send_command(cfg, "schedule.cancel", {"id": args.id}, as_json=args.json, describe=said)


def _not_cancellable(cfg: Config, item_id: int) -> str | None:
    """Why item ``item_id`` cannot be cancelled, as memory holds it now (read-only: said at once,
    without a worker), or None (the worker decides; memory that cannot be read is left to it)."""
    from memory.errors import MemoryFailure
    from memory.view import MemoryView

    if not cfg.memory_path.exists():
        return None
    try:
        with MemoryView(cfg.memory_path) as view:
            item = view.scheduled_item(item_id)
    except MemoryFailure:
        return None
    if item is None:
        return f"there is no reminder #{item_id} (relaybot reminders lists them)"
    if item.status != "active":
        return (
            f"reminder #{item_id} is {item.status} already: nothing to cancel "
            "(relaybot reminders --all shows it)"
        )
    return None
