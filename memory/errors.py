"""memory's own errors: what a caller outside memory catches (it never imports ``sqlite3``).

Two families:

- *memory failed* (:class:`MemoryFailure`): the database cannot be opened, read or written
  (:class:`MemoryUnavailable`, :class:`MemoryBusy` when another connection holds it), the writer
  lost the lease (:class:`FencedOut`, :class:`StaleToken`), a turn's record could not be made
  durable (:class:`MemoryUnwritable`), a database of an unknown schema (:class:`SchemaError`);
- *memory refused what it was asked* (:class:`MemoryRefused`, a ``ValueError``): a bad command
  (:class:`CommandError`), search (:class:`SearchError`), note (:class:`NoteError`), MEMORY.md
  write (:class:`CuratedError`), import file (:class:`FormatError`) or scheduled item
  (:class:`ScheduleLimit`).

An error from SQLite leaves memory's public API as a :class:`MemoryUnavailable` with the same
message (what the user reads does not change) and the SQLite error as its ``__cause__``
(:func:`translated`). :class:`MemoryUnavailable` is also a ``sqlite3.OperationalError``, so memory's
own code, which catches ``sqlite3.Error`` inside, treats it as it always did.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class MemoryFailure(Exception):
    """Memory failed: the base of every "memory could not do it" error."""


class MemoryUnavailable(MemoryFailure, sqlite3.OperationalError):
    """The memory database could not be opened, read or written (SQLite's error, same text)."""


class MemoryBusy(MemoryUnavailable):
    """Another connection held the database longer than memory waits (locked, busy)."""


class SchemaError(MemoryUnavailable):
    """The database's schema is newer than this code, or not memory's."""


class MemoryUnwritable(MemoryFailure):
    """Memory could not durably record what a turn must record (disk full, locked, an I/O
    error): the entry is not answered now; the worker keeps it pending and tries again."""


class FencedOut(MemoryFailure):
    """Memory refused a write: another worker took the lease since (memory/fence.py)."""


class StaleToken(MemoryFailure, RuntimeError):
    """A fencing token lower than one memory has already seen: the lease was taken since (or
    Redis lost the counter: :attr:`held` is what memory holds)."""

    def __init__(self, message: str, held: int) -> None:
        super().__init__(message)
        self.held = held


class MemoryRefused(ValueError):
    """Memory refused what it was asked (the caller's input, not a failure of memory)."""


class CommandError(MemoryRefused):
    """An owner command that cannot be applied (bad arguments, unknown entity, ...)."""


class SearchError(MemoryRefused):
    """A search that cannot run (its text or filters); the message says what to change."""


class NoteError(MemoryRefused):
    """A note that cannot be written (its text, type, scope, ...); the message says why."""


class CuratedError(MemoryRefused):
    """A MEMORY.md write that cannot be made (too long, a bad mode, ...)."""


class FormatError(MemoryRefused):
    """An import file that is not what it claims to be (the message names the line)."""


class ScheduleLimit(MemoryRefused):
    """A scheduled item memory does not store (its text too long, a bad late policy, ...): one
    line that says what to change."""


def unavailable(exc: sqlite3.Error) -> MemoryUnavailable:
    """SQLite's error as memory's: :class:`MemoryBusy` when the database was locked or busy."""
    if isinstance(exc, MemoryUnavailable):
        return exc
    text = str(exc)
    busy = "locked" in text or "busy" in text
    return (MemoryBusy if busy else MemoryUnavailable)(text)


@contextmanager
def translated() -> Iterator[None]:
    """Raise what SQLite raises in the block as :func:`unavailable`."""
    try:
        yield
    except MemoryUnavailable:
        raise
    except sqlite3.Error as exc:
        raise unavailable(exc) from exc


def translating(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` with :func:`translated` around it (an entry point of memory's public API)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with translated():
            return fn(*args, **kwargs)

    return wrapper


def translating_iter(it: Iterator[T]) -> Iterator[T]:
    """``it`` with :func:`translated` around each step (an export read lazily)."""
    with translated():
        yield from it
