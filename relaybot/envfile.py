"""``.env`` in the current directory, read exactly as honcho reads it for the Procfile's processes.

``honcho start`` gives its processes the variables of ``./.env``; every ``relaybot`` command reads
the same file with honcho's own parser (``honcho.environ.parse``: honcho is a runtime dependency,
for the Procfile), so ``relaybot chat`` in a second terminal of the same directory finds the same
``RELAYBOT_HOME``, Redis and worker, whatever the file holds: ``#`` inside a value, spaces,
backslashes and quotes mean what they mean to honcho (``A=/tmp/h#x`` is ``/tmp/h``; ``A=a b`` is
``ab``; ``A=`` and ``export A=1`` set nothing). A line honcho takes nothing from is said on
stderr, as it is most likely a mistake. The file wins over a variable already set in the
environment, as it does for honcho's processes (so a stale ``export`` in one terminal cannot
send ``relaybot chat`` to another home than honcho's); a value it replaces is said on stderr.

A file honcho cannot read (not UTF-8, an unclosed quote: ``honcho start`` dies on it) is an
:class:`EnvFileError` naming the file and the line, never a silent fall-back to another home.

``RELAYBOT_DOTENV`` names another file, or, set empty, none (the test suite sets it so that a
developer's own ``.env`` in the clone never reaches a test's processes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from honcho import environ

DOTENV = ".env"
CHOICE = "RELAYBOT_DOTENV"  # another file; empty: none


class EnvFileError(Exception):
    """The ``.env`` file cannot be read as honcho reads it."""


def parse(path: Path) -> tuple[dict[str, str], list[int]]:
    """The variables of ``path`` as honcho gives them to its processes, and the numbers of the
    lines honcho takes nothing from (neither blank nor a comment)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise EnvFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        number = raw.count(b"\n", 0, exc.start) + 1
        raise EnvFileError(f"{path} line {number}: not UTF-8 text ({exc.reason})") from exc
    if "\x00" in text:  # no environment variable can hold it
        number = text.count("\n", 0, text.index("\x00")) + 1
        raise EnvFileError(f"{path} line {number}: a NUL byte")
    values: dict[str, str] = {}
    ignored: list[int] = []
    # honcho parses the text line by line (str.splitlines): so does this, to name the bad line
    for number, line in enumerate(text.splitlines(), 1):
        try:
            found = environ.parse(line)
        except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
            raise EnvFileError(f"{path} line {number}: {exc}") from exc
        if not found and line.strip() and not line.lstrip().startswith("#"):
            ignored.append(number)
        values.update(found)
    return values, ignored


def load_dotenv_here(directory: Path | None = None) -> Path | None:
    """Put the variables of ``<directory or cwd>/.env`` (or of ``$RELAYBOT_DOTENV``) into the
    environment, over what is set there (as honcho does); the file read, or None when there is
    none. Raises
    :class:`EnvFileError` (and sets nothing) when honcho could not read it either."""
    chosen = os.environ.get(CHOICE)
    if chosen is not None and not chosen.strip():
        return None
    path = Path(chosen).expanduser() if chosen else (directory or Path.cwd()) / DOTENV
    if not path.is_file():
        if chosen:  # named on purpose: a typo must not start relaybot without its settings
            what = "is not a file" if path.exists() else "does not exist"
            raise EnvFileError(
                f"{CHOICE}={chosen}: {path} {what} (set {CHOICE} empty to read no .env file)"
            )
        return None
    values, ignored = parse(path)
    for number in ignored:
        sys.stderr.write(
            f"relaybot: {path} line {number} sets nothing (honcho reads NAME=value lines; "
            "an empty value or an `export` prefix is ignored)\n"
        )
    for name, value in values.items():
        before = os.environ.get(name)
        if before is not None and before != value:
            sys.stderr.write(
                f"relaybot: {path} sets {name}, over the value this shell has (as honcho does)\n"
            )
        os.environ[name] = value
    return path
