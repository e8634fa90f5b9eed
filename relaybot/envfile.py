"""``.env`` in the current directory, read the way honcho reads it for the Procfile's processes.

``honcho start`` gives its processes the variables of ``./.env``; every ``relaybot`` command reads
the same file (python-dotenv), so ``relaybot chat`` in a second terminal of the same directory
finds the same ``RELAYBOT_HOME``, Redis and worker. A variable already set in the environment wins
over the file (a one-off ``RELAYBOT_HOME=... relaybot status`` does what it says). Values are taken
literally (no ``${VAR}`` expansion), as honcho does, so both see the same password.

``RELAYBOT_DOTENV`` names another file, or, set empty, none (the test suite sets it so that a
developer's own ``.env`` in the clone never reaches a test's processes).
"""

from __future__ import annotations

import os
from pathlib import Path

from dotenv import load_dotenv

DOTENV = ".env"
CHOICE = "RELAYBOT_DOTENV"  # another file; empty: none


def load_dotenv_here(directory: Path | None = None) -> Path | None:
    """Put the variables of ``<directory or cwd>/.env`` (or of ``$RELAYBOT_DOTENV``) that are
    not set yet into the environment; the file read, or None when there is none."""
    chosen = os.environ.get(CHOICE)
    if chosen is not None and not chosen.strip():
        return None
    path = Path(chosen).expanduser() if chosen else (directory or Path.cwd()) / DOTENV
    if not path.is_file():
        return None
    load_dotenv(path, override=False, interpolate=False, encoding="utf-8")
    return path
