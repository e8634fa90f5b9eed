"""`relaybot memory curated list|show|restore`: MEMORY.md's versions.

Every write of MEMORY.md by the worker (the model's ``memory_write``, a restore) is recorded in
memory's database, and so is a hand edit found before one (memory/curated_versions.py). ``list``
and ``show`` read them read-only; ``restore N`` asks the worker (an owner command,
``curated.restore``) to make version N the file again (a new version).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json

if TYPE_CHECKING:
    from contract.config import Config

EXIT_FAILED = 1


def add_parsers(sub: Any) -> None:  # argparse's subparsers action has no public type
    p = sub.add_parser("curated", help="MEMORY.md's versions: list, show, restore")
    csub = p.add_subparsers(dest="curated_command", required=True, metavar="COMMAND")
    one = csub.add_parser("list", help="every version, oldest first")
    one.add_argument("--json", action="store_true", help="machine-readable output")
    one.set_defaults(func=cmd_list)
    one = csub.add_parser("show", help="print one version's text")
    one.add_argument("version", type=int, help="its number (curated list)")
    one.set_defaults(func=cmd_show)
    one = csub.add_parser("restore", help="make a version MEMORY.md again (through the worker)")
    one.add_argument("version", type=int, help="its number (curated list)")
    one.set_defaults(func=cmd_restore)


def cmd_list(args: argparse.Namespace, cfg: Config) -> int:
    from contract.timezone import owner_zone
    from memory.errors import MemoryFailure
    from memory.view import stamp
    from relaybot.cli_shared import open_memory

    view = open_memory(cfg)
    if view is None:
        return EXIT_FAILED
    try:
        with view:
            found = view.curated_versions()
    except MemoryFailure as exc:
        echo(f"relaybot: cannot read MEMORY.md's versions: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        for v in found:
            echo_json(v.record())
        return 0
    if not found:
        echo("no versions of MEMORY.md yet (one is recorded at each write by the worker)")
    zone = owner_zone(cfg.owner.timezone)
    for v in found:
        echo(f"#{v.id} {stamp(v.ts, zone)} {v.size} bytes, replaced by {v.cause}")
    return 0


def cmd_show(args: argparse.Namespace, cfg: Config) -> int:
    from memory.errors import MemoryFailure
    from relaybot.cli_shared import open_memory

    view = open_memory(cfg)
    if view is None:
        return EXIT_FAILED
    try:
        with view:
            found = view.curated_version(args.version)
    except MemoryFailure as exc:
        echo(f"relaybot: cannot read MEMORY.md's versions: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if found is None:
        echo(f"relaybot: no MEMORY.md version {args.version} (relaybot memory curated list)",
             file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    sys.stdout.write(found.text)
    return 0


def cmd_restore(args: argparse.Namespace, cfg: Config) -> int:
    from relaybot.cli_shared import send_command

    def describe(result: dict[str, Any]) -> str:
        return (f"MEMORY.md is version {result.get('version')} again ({result.get('bytes')} "
                "bytes); what it held is kept as a version")  # fmt: skip

    return send_command(cfg, "curated.restore", {"version": args.version}, as_json=False,
                        describe=describe)  # fmt: skip


__all__ = ["add_parsers", "cmd_list", "cmd_restore", "cmd_show"]
