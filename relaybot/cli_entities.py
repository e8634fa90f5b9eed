"""`relaybot entities ...` and `relaybot onboard`."""

from __future__ import annotations

from typing import Any


def add_parsers(sub: Any) -> None:  # argparse's subparsers action has no public type
    """Add the entities subcommands; each sets `func(args, cfg) -> exit code`."""
    del sub


def add_onboard_parser(sub: Any) -> None:
    del sub
