"""`relaybot memory ...` subcommands (this module's part)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parsers(sub: Any) -> None:  # argparse's subparsers action has no public type
    """Add this module's subcommands; each sets `func(args, cfg) -> exit code`."""
    del sub


__all__ = ["add_parsers", "argparse"]
