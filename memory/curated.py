"""MEMORY.md: the owner's curated memory, a plain Markdown file in the workspace.

The owner edits it with any editor; the model rewrites it with the ``memory_write`` tool. It is
the owner's: it goes into the context, and the tool is offered, only in the owner's own
conversations (DESIGN.md, the privacy rule).

Writes are atomic: the new text goes to a temporary file in the same directory, which is flushed
and fsynced and then moved over MEMORY.md with ``os.replace``; the directory is fsynced so the
rename itself is durable. A reader (the worker, the owner's editor) sees the old file or the new
one, never a half-written one; a write that fails leaves the old content and no temporary file.
A symlinked MEMORY.md (dotfiles) is written through: its target is replaced, the link stays.

Reading never fails a turn: a missing file reads as empty; an unreadable one (permissions, a
directory, an I/O error) reads as empty and is logged; a huge one is read only up to
:data:`MAX_READ_BYTES`, with a note saying so (logged). :class:`CuratedFile` re-reads the file
only when its size, mtime or inode changed, so a turn costs one ``stat``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from memory.errors import CuratedError as CuratedError  # noqa: PLC0414 (its old home)

log = structlog.get_logger(__name__)

FILENAME = "MEMORY.md"
MAX_READ_BYTES = 128 * 1024  # what is read of MEMORY.md at most (the context takes less)
MAX_WRITE_CHARS = 32_000  # what the model may write at once
KEEP_MAX_BYTES = 4 * 1024 * 1024  # what is kept of MEMORY.md as a version before a write


@dataclass(frozen=True)
class Curated:
    """What was read: the text (with a note at the end if the file was cut), the size on disk,
    whether it was cut, and the reason it could not be read (then the text is empty)."""

    text: str = ""
    size: int = 0
    truncated: bool = False
    error: str | None = None


def curated_path(workspace: Path) -> Path:
    return workspace / FILENAME


def read_curated(path: Path, *, max_bytes: int = MAX_READ_BYTES) -> Curated:
    """Read MEMORY.md, bounded; never raises (see the module docstring)."""
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            raw = fh.read(max_bytes + 1)
    except FileNotFoundError:
        return Curated()
    except (OSError, ValueError) as exc:
        log.warning("curated.unreadable", path=str(path), error=str(exc))
        return Curated(error=f"{type(exc).__name__}: {exc}")
    truncated = len(raw) > max_bytes
    if truncated:
        raw = raw[:max_bytes]
        cut = raw.rfind(b"\n")
        if cut > max_bytes // 2:
            raw = raw[: cut + 1]
    text = raw.decode("utf-8", errors="replace").replace("\x00", "")
    if truncated:
        size = max(size, len(raw) + 1)
        log.warning("curated.truncated", path=str(path), size=size, read=len(raw))
        text = (
            text.rstrip("\n")
            + f"\n[... MEMORY.md continues: it has {size} bytes and only the first {len(raw)} "
            "are read; the owner can shorten it]"
        )
    return Curated(text=text, size=size, truncated=truncated)


class CuratedFile:
    """MEMORY.md at ``path``, re-read only when it changed on disk. ``on_write(before, after,
    cause, stream_id)`` is told of each write (memory/curated_versions.py records it)."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = MAX_READ_BYTES,
        on_write: Callable[[str, str, str, str | None], object] | None = None,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.on_write = on_write
        self._key: tuple[int, int, int, int] | None = None
        self._value = Curated()

    def read(self) -> Curated:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._key, self._value = None, Curated()
            return self._value
        except OSError as exc:
            log.warning("curated.unreadable", path=str(self.path), error=str(exc))
            return Curated(error=f"{type(exc).__name__}: {exc}")
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key != self._key:
            self._value = read_curated(self.path, max_bytes=self.max_bytes)
            self._key = key if self._value.error is None else None
        return self._value

    def write(self, text: str, cause: str = "replace", stream_id: str | None = None) -> int:
        if self.on_write is not None:
            before = read_curated(self.path, max_bytes=KEEP_MAX_BYTES)
            after = text if not text or text.endswith("\n") else text + "\n"
            self.on_write(before.text if before.error is None else "", after, cause, stream_id)
        return write_curated(self.path, text)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported here (e.g. Windows): the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_curated(path: Path, text: str) -> int:
    """Replace MEMORY.md with ``text`` atomically; returns the bytes written.

    Raises CuratedError (the old file is untouched) if anything fails on the way.
    """
    if "\x00" in text:
        raise CuratedError("MEMORY.md is text: NUL characters are not allowed")
    if text and not text.endswith("\n"):
        text += "\n"
    data = text.encode("utf-8", errors="replace")
    target = path.resolve() if path.is_symlink() else path
    directory = target.parent
    tmp: str | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            mode: int | None = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            mode = None
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
        tmp = None
        _fsync_dir(directory)
    except OSError as exc:
        log.error("curated.write_failed", path=str(target), error=str(exc))
        raise CuratedError(f"could not write {target}: {exc}") from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    log.info("curated.written", path=str(target), bytes=len(data))
    return len(data)


def memory_write(
    file: CuratedFile, content: str, *, mode: str = "replace", stream_id: str | None = None
) -> str:
    """The ``memory_write`` tool's work: replace MEMORY.md with ``content`` or append it.

    Returns the text for the model; ``stream_id`` is the turn's (the version it records names
    it). Appending to a file that is too large to be read whole is
    refused, since the rewrite would lose its end.
    """
    if len(content) > MAX_WRITE_CHARS:
        raise CuratedError(
            f"content has {len(content)} characters; MEMORY.md takes at most {MAX_WRITE_CHARS} "
            "at once: keep it short (curated facts, not transcripts)"
        )
    if mode == "append":
        current = read_curated(file.path, max_bytes=file.max_bytes)
        if current.error is not None or current.truncated:
            raise CuratedError(
                "MEMORY.md cannot be appended to now (it is unreadable or too large); "
                "replace it with a shorter version instead"
            )
        base = current.text.rstrip("\n")
        content = f"{base}\n{content}" if base else content
        if len(content) > MAX_WRITE_CHARS * 4:
            raise CuratedError("MEMORY.md would grow too large: replace it with a shorter version")
    elif mode != "replace":
        raise CuratedError("mode must be 'replace' or 'append'")
    size = file.write(content, mode, stream_id)
    return f"MEMORY.md {'updated' if mode == 'append' else 'replaced'}: {size} bytes now."
