"""A backup archive: what is in it, packing it, and checking one before it is restored.

``relaybot-<UTC time>.tar.gz``, mode 0600, holds:

- ``memory.sqlite3``: the consistent copy of memory (memory/backup.py);
- ``MEMORY.md``: the owner's curated memory, when there is one;
- ``memory.erasures.jsonl``: the erasure journal (ids and stream ids, never text), when there is
  one;
- ``config.toml``: the configuration, its secrets masked (``***``: :func:`mask_config`) unless
  ``--with-secrets``;
- ``manifest.json``: the format and version, when it was taken (``taken_at``, UTC, and
  ``taken_ts``), where (``host``, ``home``, ``redis_prefix``), relaybot's version, the schema
  version, the counts, whether secrets are in it, and each file's size and sha256.

It is written to a hidden ``.<name>.<pid>.partial`` beside the final path, fsynced, then linked
to the final path, which it never replaces (:class:`OutExists`):
a backup killed half-way never leaves a file at the final path (the next backup removes the
partial files of processes that are gone). :func:`read_archive` refuses, with one line saying
why, a file that is not a complete archive (truncated, damaged), lacks the manifest, holds a
file the manifest does not name (or a path), holds a file larger than the manifest says (checked
before a byte is written; never read past that size) or too large for the free space, or fails
a checksum. The checksums find damage and
truncation; they are not a signature: keep backups where only you can write.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import shutil
import tarfile
import tomllib
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
    r"pass|secret|token|credential|auth|cookie|headers?$|apikey|privatekey|(?:^|[_.-])keys?(?:$|[_.-])"
    r"|^env$",  # an MCP server's env table: every value a secret (contract/mcp_config.py)
    re.I,
)
_URL_QUERY = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s\"'?#]*)[?#][^\s\"']*", re.I)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
MASK = "***"
UNPARSED = "# config.toml did not parse as TOML: not archived (it may hold secrets)\n"


class BadArchive(Exception):
    """Not a backup that can be restored; the message is the one line to show."""


class OutExists(Exception):
    """Something is at the archive's path already: a backup never replaces it."""


def mask_config(text: str) -> str:
    """config.toml with its secrets masked, as valid TOML: it is parsed and written again, so a
    secret in any form of TOML (multi-line or literal strings, inline tables, dotted keys,
    arrays) is masked. Every value under a secret-looking key becomes ``"***"``, and in every
    other string passwords in URLs and URL queries (a gateway key in ``base_url``) do. Comments
    are not kept (they may hold secrets too); a file that does not parse is not archived."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return UNPARSED
    lines = ["# config.toml, its secrets masked (***) by relaybot backup; comments not kept"]
    _emit_table(lines, [], _masked(data))
    return "\n".join(lines) + "\n"


def _masked(value: Any, secret: bool = False, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _masked(v, secret or bool(_SECRET_KEY.search(k)), k) for k, v in value.items()}
    if isinstance(value, list):
        if key == "command" and not secret:  # an MCP server's program and its arguments
            return _masked_argv(value)
        return [_masked(v, secret) for v in value]
    if secret:
        return MASK
    if isinstance(value, str):
        return mask_text(_URL_QUERY.sub(lambda m: f"{m[1]}?{MASK}", value))
    return value


def _masked_argv(argv: list[Any]) -> list[Any]:
    """A command's arguments with the value of a secret-looking flag masked: ``--api-key X``
    and ``--api-key=X`` keep the flag, not X."""
    out: list[Any] = []
    after_flag = False
    for arg in argv:
        if after_flag:
            out.append(MASK)
            after_flag = False
            continue
        if not isinstance(arg, str):
            out.append(_masked(arg))
            continue
        name, eq, _ = arg.partition("=")
        flag = arg.startswith("-") and bool(_SECRET_KEY.search(name.lstrip("-")))
        if flag and eq:
            out.append(f"{name}={MASK}")
        else:
            out.append(_masked(arg))
            after_flag = flag
    return out


def _emit_table(lines: list[str], path: list[str], table: dict[str, Any]) -> None:
    """``table`` as TOML lines: its plain values, then its tables and arrays of tables."""
    nested = {k: v for k, v in table.items() if isinstance(v, dict) or _tables(v)}
    for key, value in table.items():
        if key not in nested:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in nested.items():
        header = ".".join(_key(k) for k in [*path, key])
        for item in value if isinstance(value, list) else [value]:
            lines += ["", f"[[{header}]]" if isinstance(value, list) else f"[{header}]"]
            _emit_table(lines, [*path, key], item)


def _tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    return str(value.isoformat())  # dates and times


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
        _publish(partial, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    _fsync_dir(out.parent)
    return sha256_file(out)


def _publish(partial: Path, out: Path) -> None:
    """``partial`` at ``out``, never over anything there (:class:`OutExists`): a hard link
    fails when ``out`` exists, atomically (a file system without hard links: checked, renamed)."""
    try:
        os.link(partial, out, follow_symlinks=False)
    except FileExistsError:
        raise OutExists(str(out)) from None
    except OSError:
        if os.path.lexists(out):
            raise OutExists(str(out)) from None
        os.replace(partial, out)


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


MANIFEST_MAX = 1 << 20  # a manifest names a few files
SMALL_MAX = 256 << 20  # MEMORY.md, the journal, config.toml: far smaller than this
SPARE = 64 << 20  # left free on the disk after what the restore writes


def read_archive(path: Path, into: Path) -> Archive:
    """Extract ``path`` into the directory ``into`` and check it against its manifest; raises
    :class:`BadArchive` with the reason. Each member's size is checked against the manifest
    (and the free space beside ``into``: the restore writes the database twice) before a byte
    of it is written, and no more than that is read."""
    name = path.name
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            found = tar.getmembers()
            members = {m.name: m for m in found}
            if len(members) != len(found):
                raise BadArchive(f"{name} holds a file twice, which no backup does")
            manifest = _manifest(name, tar, members)
            listed: dict[str, Any] = manifest["files"]
            _check_sizes(name, members, listed, into)
            for member, want in listed.items():  # every checksum before a byte is written
                digest = hashlib.sha256()
                _read_member(name, tar, members[member], int(want["size"]), digest.update)
                _check_digest(name, member, digest.hexdigest(), want)
            archive = Archive(manifest)
            for member, want in listed.items():
                target = into / member
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    _read_member(name, tar, members[member], int(want["size"]), out.write)
                _check_digest(name, member, sha256_file(target), want)  # as written
                archive.files[member] = target
            return archive
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, FileNotFoundError) and not path.exists():
            raise BadArchive(f"{path}: no such file") from None
        raise BadArchive(
            f"{name} is truncated or damaged ({type(exc).__name__}: {exc}); nothing was restored"
        ) from None


def _manifest(name: str, tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo]) -> Any:
    """The archive's manifest, checked: its format, version, and the files it names."""
    for member in members.values():
        if member.name not in (MANIFEST, *MEMBERS) or not member.isfile():
            raise BadArchive(f"{name} holds {member.name!r}, which no backup holds")
    if MANIFEST not in members:
        raise BadArchive(f"{name} is not a relaybot backup: it has no {MANIFEST}")
    if members[MANIFEST].size > MANIFEST_MAX:
        raise BadArchive(f"{name}: its manifest is {members[MANIFEST].size} bytes: not a backup's")
    source = tar.extractfile(members[MANIFEST])
    try:
        manifest = json.loads(source.read() if source else b"")
    except ValueError as exc:
        raise BadArchive(f"{name}: its manifest is not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadArchive(f"{name} is not a relaybot backup (its manifest names no {FORMAT})")
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        raise BadArchive(f"{name} is a backup format this relaybot does not know: upgrade it")
    listed = manifest.get("files")
    if not isinstance(listed, dict) or DATABASE not in listed:
        raise BadArchive(f"{name}: its manifest names no {DATABASE}")
    for member, want in listed.items():
        if member not in MEMBERS or member not in members:
            raise BadArchive(f"{name}: {member} is in its manifest but not in the archive")
        size = want.get("size") if isinstance(want, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadArchive(f"{name}: its manifest gives {member} no size")
    for extra in set(members) - {MANIFEST, *listed}:
        raise BadArchive(f"{name} holds {extra}, which its manifest does not name")
    return manifest


def _check_sizes(
    name: str, members: dict[str, tarfile.TarInfo], listed: dict[str, Any], into: Path
) -> None:
    """Each member as large as its manifest says, the small ones small, and room for them."""
    for member, want in listed.items():
        size = int(want["size"])
        if members[member].size != size:
            raise BadArchive(
                f"{name}: {member} is {members[member].size} bytes, its manifest says {size} "
                "(tampered with or damaged); nothing was restored"
            )
        if member != DATABASE and size > SMALL_MAX:
            raise BadArchive(f"{name}: its {member} is {size} bytes, more than any backup's")
    needed = sum(int(w["size"]) for w in listed.values()) + int(listed[DATABASE]["size"])
    free = shutil.disk_usage(into).free
    if needed + SPARE > free:
        raise BadArchive(
            f"{name}: restoring it needs {_mb(needed + SPARE)} free beside memory, and "
            f"{_mb(free)} is; nothing was restored"
        )


def _mb(size: int) -> str:
    return f"{size / (1 << 20):.0f} MB"


def _check_digest(name: str, member: str, digest: str, want: dict[str, Any]) -> None:
    if digest != want.get("sha256"):
        raise BadArchive(
            f"{name}: {member} fails its sha256 checksum (tampered with or damaged); "
            "nothing was restored"
        )


def _read_member(
    name: str, tar: tarfile.TarFile, member: tarfile.TarInfo, size: int, sink: Any
) -> None:
    """The member's ``size`` bytes, block by block, to ``sink``; never more."""
    source = tar.extractfile(member)
    if source is None:
        raise BadArchive(f"{name}: {member.name} cannot be read")
    left = size
    while left and (block := source.read(min(left, 1 << 20))):
        sink(block)
        left -= len(block)
    if left or source.read(1):
        raise BadArchive(f"{name}: {member.name} is not the size its manifest says")
