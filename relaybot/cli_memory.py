"""`relaybot memory status|export|import`: looking after memory as a whole (``erase``:
relaybot/cli_erase.py).

``status`` and ``export`` read the memory database read-only, here (memory/status.py,
memory/export.py). ``import`` reads and checks the file here (memory/import_file.py) and sends the
records to the worker, the only writer, as ``memory.import`` owner commands, each packed to fit
one stream entry (relaybot/import_parts.py), with the handle mappings of ``--map``/``--map-file``,
and prints whom the worker took each sender for (mapped, or left an entity of its own). Exit
codes: 0 done, 1 failed or (import) some records were rejected, 2 configuration error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json, json_safe

if TYPE_CHECKING:
    from contract.config import Config
    from memory.view import MemoryView

EXIT_FAILED = 1


def add_parsers(sub: Any) -> None:  # argparse's subparsers action has no public type
    """Add this module's subcommands; each sets `func(args, cfg) -> exit code`."""
    p = sub.add_parser("status", help="counts, size, last entry, corrupt rows skipped")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--check",
        action="store_true",
        help="read and validate every log row (a full count of corrupt rows) and run "
        "SQLite's quick_check; slower on a large log",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("export", help="everything in memory as JSON Lines, with ids")
    p.add_argument("--out", type=Path, help="write to this file (default: standard output)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="import an export, or a squidbot history.jsonl (idempotent)")
    p.add_argument("file", type=Path, help="the JSON Lines file ('-' for standard input)")
    p.add_argument(
        "--format",
        choices=("auto", "relaybot", "squidbot"),
        default="auto",
        help="the file's format (default: recognised from its first line)",
    )
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="CHANNEL:ADDRESS=TARGET",
        help="the sender CHANNEL:ADDRESS is TARGET: owner, an entity id (e-…) or a known handle "
        "channel:address (repeatable; e.g. --map telegram:12345=owner)",
    )
    p.add_argument(
        "--map-file",
        type=Path,
        metavar="FILE",
        help="mappings, one CHANNEL:ADDRESS=TARGET per line ('#' starts a comment line)",
    )
    p.add_argument("--dry-run", action="store_true", help="check the file, send nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for each part (default 120)"
    )
    p.set_defaults(func=cmd_import)

    from relaybot import cli_erase, cli_profiles

    cli_erase.add_parser(sub)
    cli_profiles.add_parsers(sub)  # layer 2: profiles, gaps


def _open(cfg: Config) -> MemoryView:
    from memory.view import MemoryView

    return MemoryView(cfg.memory_path)


def _fail(message: str) -> int:
    echo(f"relaybot: {message}", file=sys.stderr)
    return EXIT_FAILED


# -- status ------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, cfg: Config) -> int:
    from memory.errors import MemoryFailure

    if not cfg.memory_path.exists():
        if args.json:
            echo_json({"path": str(cfg.memory_path), "exists": False})
        else:
            echo(f"no memory database yet at {cfg.memory_path} (the worker creates it)")
        return 0
    try:
        with _open(cfg) as store:
            status = store.status(check=args.check, assistant_name=cfg.worker.assistant_name)
    except MemoryFailure as exc:
        return _fail(f"cannot read the memory database {cfg.memory_path}: {exc}")
    if args.json:
        echo_json({"exists": True, **status}, indent=2)
    else:
        echo(render_status(status))
    check = status.get("check")
    return EXIT_FAILED if check and check["quick_check"] != "ok" else 0


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # not reached


def render_status(status: dict[str, Any]) -> str:
    c = status["counts"]

    def n(key: str) -> str:
        value = c.get(key)
        return "-" if value is None else str(value)

    size = status["size"]
    lines = [
        f"memory:      {status['path']} (schema version {status['schema_version']})",
        f"size:        {_bytes(size['db_bytes'])} database + {_bytes(size['wal_bytes'])} WAL",
        f"log:         {n('log_in')} in, {n('log_out')} out, in {n('conversations')} conversations",
        f"identity:    {n('entities')} entities, {n('handles')} handles, "
        f"{n('entity_links')} link events",
        f"notes:       {n('notes_active')} active, {n('notes_superseded')} superseded",
        f"erasures:    {n('erasures')} ({n('erased_log_rows')} log rows erased)",
    ]
    last = status.get("last_entry")
    if last:
        lines.append(
            f"last entry:  #{last['id']} {last['time']} {last['label']} "
            f"(conversation {last['conversation']})"
        )
    else:
        lines.append("last entry:  none (the log is empty)")
    corrupt = status["corrupt_rows_skipped"]
    if status["corrupt_rows_complete"]:
        check = status["check"]
        lines.append(
            f"corrupt rows skipped: {corrupt} (every row read: {check['valid_rows']} valid)"
        )
        quick = check["quick_check"]
        lines.append(
            "integrity:   ok" if quick == "ok" else "integrity:   " + "; ".join(quick[:10])
        )
    else:
        lines.append(f"corrupt rows skipped: {corrupt} so far (--check reads every row)")
    return "\n".join(lines)


# -- export ------------------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace, cfg: Config) -> int:
    from memory.errors import MemoryFailure
    from memory.types import ExportStats

    stats = ExportStats()
    try:
        with _open(cfg) as store:
            if args.out is None:
                for line in store.export(stats):
                    sys.stdout.write(json_safe(line))  # the same JSON, inert on a terminal
                sys.stdout.flush()
            else:
                out: Path = args.out
                tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
                try:
                    # everything the assistant knows: readable by the owner alone
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w", encoding="utf-8") as fh:
                        for line in store.export(stats):
                            fh.write(line)
                        fh.flush()
                        os.fsync(fh.fileno())
                    tmp.replace(out)  # atomic: a reader never sees half an export
                finally:
                    tmp.unlink(missing_ok=True)
    except MemoryFailure as exc:
        return _fail(f"cannot read the memory database {cfg.memory_path}: {exc}")
    except BrokenPipeError:
        raise  # `relaybot memory export | head`: the entry point ends quietly
    except OSError as exc:
        return _fail(f"cannot write the export: {exc}")
    where = "standard output" if args.out is None else str(args.out)
    parts = ", ".join(f"{k} {v}" for k, v in stats.records.items() if v)
    echo(
        f"exported {sum(stats.records.values())} records ({parts or 'none'}) to {where}",
        file=sys.stderr,
    )
    if stats.corrupt_rows:
        echo(
            f"skipped {stats.corrupt_rows} corrupt log rows (they cannot be read)", file=sys.stderr
        )
    return 0


# -- import ------------------------------------------------------------------------------------


def _lines(path: Path, bad: list[tuple[int, str]]) -> Iterator[str]:
    """The file's lines as text; a line that is not UTF-8 becomes empty and is reported."""
    fh = sys.stdin.buffer if str(path) == "-" else path.open("rb")
    try:
        for n, raw in enumerate(fh, start=1):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad.append((n, f"not UTF-8 (byte {exc.start})"))
                yield ""
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()


def cmd_import(args: argparse.Namespace, cfg: Config) -> int:
    from memory.errors import FormatError
    from memory.importing import parse_file, parse_mapping
    from memory.types import OwnerResolver
    from relaybot.import_parts import command_args

    undecodable: list[tuple[int, str]] = []
    resolver = OwnerResolver(cfg.owner_aliases)
    try:
        mapping = parse_mapping(_map_entries(args))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return _fail(f"--map: {exc}")
    try:
        parsed = parse_file(
            _lines(args.file, undecodable),
            resolver=resolver,
            fmt=None if args.format == "auto" else args.format,
            mapping=mapping,
        )
    except FormatError as exc:
        return _fail(f"{args.file}: {exc}")
    except OSError as exc:
        return _fail(f"cannot read {args.file}: {exc}")
    rejected: list[dict[str, Any]] = [
        {"line": n, "reason": why} for n, why in sorted([*undecodable, *parsed.rejected])
    ]
    totals = _Totals(rejected=rejected)
    calls = [("memory.import", a) for a in command_args(parsed.items, fmt=parsed.format)]
    failed: str | None = None
    if calls and not args.dry_run:
        from relaybot.owner_commands import CommandFailed, run_commands

        try:
            results = run_commands(cfg, calls, timeout=args.timeout)
        except CommandFailed as exc:
            results, failed = [], str(exc)
        for result in results:
            if not result.get("ok"):
                failed = failed or str(result.get("error"))
                continue
            totals.add(result)
    added, present, handles = totals.added, totals.present, totals.handles
    handles_more = totals.handles_more
    _explain_handles(handles, resolver)
    if parsed.format != "squidbot" and mapping.targets:
        parsed.warnings.append("--map applies to squidbot histories (an export has its entities)")
    summary = {
        "file": str(args.file),
        "format": parsed.format,
        "lines": parsed.lines,
        "records": len(parsed.items),
        "commands": len(calls),
        "dry_run": bool(args.dry_run),
        "added": added,
        "present": present,
        "rejected": sorted(rejected, key=lambda r: (r["line"] is None, r["line"] or 0)),
        "handles": dict(sorted(handles.items())),
        "handles_more": handles_more,
        "warnings": parsed.warnings,
        "error": failed,
    }
    if args.json:
        echo_json(summary, indent=2, ensure_ascii=False)
    else:
        echo(render_import(summary))
    return EXIT_FAILED if failed or rejected else 0


def render_import(summary: dict[str, Any]) -> str:
    def counts(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) if d else "none"

    lines = [f"{summary['file']}: {summary['format']} format, {summary['records']} records read"]
    if summary["dry_run"]:
        lines.append(f"dry run: {summary['commands']} commands would be sent; nothing was")
    else:
        lines.append(f"added:           {counts(summary['added'])}")
        lines.append(f"already present: {counts(summary['present'])}")
    lines += render_handles(summary.get("handles") or {}, int(summary.get("handles_more") or 0))
    rejected = summary["rejected"]
    lines.append(f"rejected:        {len(rejected)}")
    for r in rejected[:50]:
        where = f"line {r['line']}" if r["line"] is not None else "a record"
        lines.append(f"  {where}: {r['reason']}")
    if len(rejected) > 50:
        lines.append(f"  ... and {len(rejected) - 50} more (--json lists them all)")
    lines += [f"warning: {w}" for w in summary["warnings"]]
    if summary["error"]:
        lines.append(f"error: {summary['error']} (importing again adds only what is missing)")
    return "\n".join(lines)


@dataclass
class _Totals:
    """The results of the import's commands, added up."""

    rejected: list[dict[str, Any]]
    added: dict[str, int] = field(default_factory=dict)
    present: dict[str, int] = field(default_factory=dict)
    handles: dict[str, dict[str, str]] = field(default_factory=dict)
    handles_more: int = 0

    def add(self, result: dict[str, Any]) -> None:
        for key, target in (("added", self.added), ("present", self.present)):
            for kind, count in (result.get(key) or {}).items():
                target[kind] = target.get(kind, 0) + int(count)
        self.rejected += [
            {"line": r.get("line"), "reason": r.get("reason")} for r in result.get("rejected") or []
        ]
        for handle, found in (result.get("handles") or {}).items():
            self.handles.setdefault(str(handle), dict(found))
        self.handles_more += int(result.get("handles_more") or 0)


def _map_entries(args: argparse.Namespace) -> list[str]:
    entries = list(args.map)
    if args.map_file is not None:
        entries += args.map_file.read_text(encoding="utf-8").splitlines()
    return entries


def _explain_handles(handles: dict[str, dict[str, str]], resolver: Any) -> None:
    """Say by what each mapped sender was mapped: an owner alias of the config, or --map."""
    for handle, found in handles.items():
        if found.get("how") == "owner":
            channel, _, address = handle.partition(" / ")
            found["by"] = "owner.aliases" if resolver.is_owner(channel, address) else "--map"
        elif found.get("how") in ("mapped", "conflict"):
            found["by"] = "--map"


def render_handles(handles: dict[str, dict[str, str]], more: int) -> list[str]:
    """What the senders of the imported messages were mapped to, and what was left unmapped."""
    mapped = {h: f for h, f in handles.items() if f.get("how") in ("owner", "mapped")}
    conflicts = {h: f for h, f in handles.items() if f.get("how") == "conflict"}
    unmapped = {h: f for h, f in handles.items() if f.get("how") in ("known", "new")}
    lines: list[str] = []
    if mapped:
        lines.append(f"mapped:          {len(mapped)} sender(s)")
        lines += [f"  {h} -> {f['entity']} (by {f.get('by', '--map')})" for h, f in mapped.items()]
    for h, f in conflicts.items():
        lines.append(
            f"  {h} -> {f['entity']}: NOT as mapped, it belongs to that entity already "
            "(`relaybot entities link` joins the two)"
        )
    if unmapped:
        lines.append(f"unmapped:        {len(unmapped)} sender(s), each an entity of its own")
        for h, f in unmapped.items():
            state = "new" if f.get("how") == "new" else "already known"
            lines.append(f"  {h} -> {f['entity']} ({state})")
        lines.append(
            "  (to map one, import again with --map CHANNEL:ADDRESS=owner, =e-… or "
            "=channel:address; a new mapping applies to messages not imported yet)"
        )
    if more:
        lines.append(f"  ... and {more} more senders")
    return lines


__all__ = ["add_parsers", "cmd_export", "cmd_import", "cmd_status"]
