"""A backup archive: what is in it, packing it, and checking one before it is restored.

``relaybot-<UTC time>.tar.gz``, mode 0600, holds:

- ``memory.sqlite3``: the consistent copy of memory (memory/backup.py);
- ``MEMORY.md``: the owner's curated memory, when there is one;
- ``memory.erasures.jsonl``: the erasure journal (ids and stream ids, never text), when there is
  one;
- ``config.toml``: the configuration, its secrets masked (``***``) unless ``--with-secrets``;
- ``manifest.json``: the format and version, when it was taken (``taken_at``, UTC, and
  ``taken_ts``), relaybot's version, the schema version, the counts, whether secrets are in it,
  and each file's size and sha256.

It is written to a hidden ``.<name>.<pid>.partial`` beside the final path, fsynced, then renamed:
a backup killed half-way never leaves a file at the final path (the next backup removes the
partial files of processes that are gone). :func:`read_archive` refuses, with one line saying
why, a file that is not a complete archive (truncated, damaged), lacks the manifest, holds a
file the manifest does not name (or a path), or fails a checksum. The checksums find damage and
truncation; they are not a signature: keep backups where only you can write.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.logs import mask_text

FORMAT = "relaybot-backup"
VERSION = 1
MANIFEST = "manifest.json"
DATABASE = "memory.sqlite3"
CURATED = "MEMORY.md"
JOURNAL = "memory.erasures.jsonl"
CONFIG = "config.toml"
MEMBERS = (DATABASE, CURATED, JOURNAL, CONFIG)
PARTIAL = ".partial"

_SECRET_KEY = re.compile(
    r"^(\s*[\"']?[\w.-]*(?:pass(?:word)?|secret|token|api_?key|credential)[\w.-]*[\"']?\s*=\s*)"
    r"(.+)$",
    re.I | re.M,
)
_URL_QUERY = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s\"'?#]*)[?#][^\s\"']*", re.I)


class BadArchive(Exception):
    """Not a backup that can be restored; the message is the one line to show."""


def mask_config(text: str) -> str:
    """config.toml with its secrets masked: the values of secret-looking keys, passwords in
    URLs and URL queries (a gateway key in ``base_url``) become ``***``."""
    text = _SECRET_KEY.sub(lambda m: f'{m[1]}"***"', text)
    text = _URL_QUERY.sub(lambda m: f"{m[1]}?***", text)
    return mask_text(text)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_name(taken_at: str) -> str:
    """``relaybot-20261129T041500Z.tar.gz`` for ``2026-11-29T04:15:00Z``."""
    return f"relaybot-{taken_at.replace('-', '').replace(':', '')}.tar.gz"


def write_archive(out: Path, files: dict[str, Path], manifest: dict[str, Any]) -> str:
    """Pack ``files`` (member name -> path) and the manifest (their checksums added) into
    ``out``, atomically and 0600; returns the archive's sha256."""
    entries = {}
    for name, path in files.items():
        entries[name] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    manifest = {**manifest, "format": FORMAT, "version": VERSION, "files": entries}
    body = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    partial = out.with_name(f".{out.name}.{os.getpid()}{PARTIAL}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz") as tar:
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mode, info.mtime = len(body), 0o600, int(manifest["taken_ts"])
                tar.addfile(info, io.BytesIO(body))
                for name, path in files.items():
                    tar.add(path, arcname=name, recursive=False, filter=_private)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(partial, 0o600)
        os.replace(partial, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    _fsync_dir(out.parent)
    return sha256_file(out)


def _private(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mode, info.uid, info.gid, info.uname, info.gname = 0o600, 0, 0, "", ""
    return info


def work_dir(directory: Path, kind: str = "backup") -> Path:
    """This process's private directory (0700) in ``directory`` for what goes into (or comes out
    of) an archive: ``.relaybot-<kind>.<pid>.partial``, removed by the caller (or, when it was
    killed, by the next backup or restore: :func:`remove_stale_partials`)."""
    path = directory / f".relaybot-{kind}.{os.getpid()}{PARTIAL}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    return path


def remove_stale_partials(directory: Path) -> list[Path]:
    """Partial archives and work directories in ``directory`` whose writer is gone (a backup
    killed half-way)."""
    gone: list[Path] = []
    for path in directory.glob(f".*{PARTIAL}"):
        pid = path.name[: -len(PARTIAL)].rsplit(".", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            gone.append(path)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Archive:
    manifest: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)  # member name -> extracted path


def read_archive(path: Path, into: Path) -> Archive:
    """Extract ``path`` into the directory ``into`` and check it against its manifest; raises
    :class:`BadArchive` with the reason."""
    _extract(path, into)
    name = path.name
    try:
        manifest = json.loads((into / MANIFEST).read_text())
    except ValueError as exc:
        raise BadArchive(f"{name}: its manifest is not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadArchive(f"{name} is not a relaybot backup (its manifest names no {FORMAT})")
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        raise BadArchive(f"{name} is a backup format this relaybot does not know: upgrade it")
    listed = manifest.get("files")
    if not isinstance(listed, dict) or DATABASE not in listed:
        raise BadArchive(f"{name}: its manifest names no {DATABASE}")
    archive = Archive(manifest)
    for member, want in listed.items():
        target = into / str(member)
        if member not in MEMBERS or not isinstance(want, dict) or not target.exists():
            raise BadArchive(f"{name}: {member} is in its manifest but not in the archive")
        if sha256_file(target) != want.get("sha256"):
            raise BadArchive(
                f"{name}: {member} fails its sha256 checksum (tampered with or damaged); "
                "nothing was restored"
            )
        archive.files[str(member)] = target
    for extra in set(MEMBERS) - set(listed):
        if (into / extra).exists():
            raise BadArchive(f"{name} holds {extra}, which its manifest does not name")
    return archive


def _extract(path: Path, into: Path) -> None:
    """Every member of the archive at ``path`` into ``into`` (files of known names only)."""
    name = path.name
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            members = tar.getmembers()
            if MANIFEST not in [m.name for m in members]:
                raise BadArchive(f"{name} is not a relaybot backup: it has no {MANIFEST}")
            for member in members:
                if member.name not in (MANIFEST, *MEMBERS) or not member.isfile():
                    raise BadArchive(f"{name} holds {member.name!r}, which no backup holds")
                source = tar.extractfile(member)
                if source is None:
                    raise BadArchive(f"{name}: {member.name} cannot be read")
                fd = os.open(into / member.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    while block := source.read(1 << 20):
                        out.write(block)
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, FileNotFoundError) and not path.exists():
            raise BadArchive(f"{path}: no such file") from None
        raise BadArchive(
            f"{name} is truncated or damaged ({type(exc).__name__}: {exc}); nothing was restored"
        ) from None
