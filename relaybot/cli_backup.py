"""`relaybot backup` and `relaybot restore`.

``backup`` takes a consistent copy of memory while the worker runs (memory/backup.py), packs it
with MEMORY.md, the erasure journal and config.toml (secrets masked unless ``--with-secrets``)
under a manifest of sha256 checksums (relaybot/backup_archive.py), mode 0600, by default to
``$RELAYBOT_HOME/backups/relaybot-<UTC time>.tar.gz``; then it deletes the database the last
restore kept.

``restore FILE`` checks the archive (one line and exit 1 for a damaged, truncated or tampered
file), asks unless ``--yes``, and takes the worker lease for as long as it runs, so that no
worker writes memory meanwhile: while a worker holds it, restore refuses and says how to stop
it (it never stops a worker itself: that one may run under systemd, honcho, or on another
terminal). It then puts the copy in place with every erasure made after the backup applied
again, keeps the replaced database (``<memory>.replaced.sqlite3``) until the next backup, and
puts back MEMORY.md (what it replaces is kept as one of its versions). Redis is left as it is
(README, "Backup and restore": what a restore does not bring back, and how to).
Exit codes: 0 done, 1 refused or failed, 2 configuration error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.terminal import echo

if TYPE_CHECKING:
    from contract.config import Config

EXIT_FAILED = 1


def add_arguments(backup: argparse.ArgumentParser, restore: argparse.ArgumentParser) -> None:
    """The arguments of ``relaybot backup`` and ``relaybot restore`` (relaybot/cli.py adds the
    commands; their arguments only when one of them is named)."""
    backup.add_argument(
        "--out",
        type=Path,
        help="the archive (default: $RELAYBOT_HOME/backups/relaybot-<UTC time>.tar.gz)",
    )
    backup.add_argument(
        "--with-secrets", action="store_true", help="keep the config's secrets (default: masked)"
    )
    backup.set_defaults(func=cmd_backup)
    restore.add_argument("file", type=Path, help="a relaybot backup (.tar.gz)")
    restore.add_argument("--yes", action="store_true", help="do not ask before replacing memory")
    restore.set_defaults(func=cmd_restore)


def cmd_backup(args: argparse.Namespace, cfg: Config) -> int:
    from memory import backup
    from memory.errors import MemoryFailure
    from relaybot import backup_archive as archive

    now = datetime.now(UTC)
    taken_at = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    out: Path = args.out or cfg.home / "backups" / archive.default_name(taken_at)
    out = out.expanduser().absolute()
    if out.is_dir():
        echo(f"relaybot: {out} is a directory: name the archive (--out FILE)", file=sys.stderr)
        return EXIT_FAILED
    try:
        out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        archive.remove_stale_partials(out.parent)
        work = archive.work_dir(out.parent)
    except OSError as exc:
        echo(f"relaybot: cannot write the backup in {out.parent}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        files: dict[str, Path] = {archive.DATABASE: work / archive.DATABASE}
        snap = backup.snapshot(cfg.memory_path, files[archive.DATABASE])
        journal = backup.journal_path(cfg.memory_path)  # read after the copy: it lacks none
        for name, source in (
            (archive.CURATED, cfg.workspace_dir / "MEMORY.md"),
            (archive.JOURNAL, journal),
        ):
            if source.is_file():
                shutil.copyfile(source, work / name)
                files[name] = work / name
        if cfg.config_file.is_file():
            text = cfg.config_file.read_text(encoding="utf-8", errors="replace")
            (work / archive.CONFIG).write_text(
                text if args.with_secrets else archive.mask_config(text), encoding="utf-8"
            )
            files[archive.CONFIG] = work / archive.CONFIG
        manifest = {
            "taken_at": taken_at,
            "taken_ts": now.timestamp(),
            "relaybot": _version(),
            "schema_version": snap.schema_version,
            "log_rows": snap.log_rows,
            "erasures": snap.erasures,
            "secrets": "included" if args.with_secrets else "masked",
            "host": socket.gethostname(),
        }
        digest = archive.write_archive(out, files, manifest)
    except MemoryFailure as exc:
        hint = "" if cfg.memory_path.exists() else " (the worker creates it when it first starts)"
        echo(f"relaybot: cannot copy the memory database: {exc}{hint}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        echo(f"relaybot: the backup failed, nothing was written to {out}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        shutil.rmtree(work, ignore_errors=True)
    secrets = "with its secrets" if args.with_secrets else "its secrets masked"
    echo(f"backup: {out} (mode 0600, sha256 {digest})")
    echo(f"  taken {taken_at}: {snap.log_rows} messages, schema {snap.schema_version}, "
         f"MEMORY.md {'included' if archive.CURATED in files else 'absent'}, "
         f"config.toml {secrets if archive.CONFIG in files else 'absent'}")  # fmt: skip
    kept = backup.forget_replaced(cfg.memory_path)
    if kept is not None:
        echo(f"  deleted {kept}, the database the last restore replaced")
    return 0


def cmd_restore(args: argparse.Namespace, cfg: Config) -> int:
    from relaybot import backup_archive as archive

    live = cfg.memory_path
    try:
        live.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        archive.remove_stale_partials(live.parent)
        work = archive.work_dir(live.parent, "restore")
    except OSError as exc:
        echo(f"relaybot: cannot prepare the restore beside {live}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        try:
            found = archive.read_archive(args.file, work)
        except archive.BadArchive as exc:
            echo(f"relaybot: {exc}", file=sys.stderr)
            return EXIT_FAILED
        return _restore(args, cfg, found)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _restore(args: argparse.Namespace, cfg: Config, found: Any) -> int:
    from memory import backup
    from memory.errors import MemoryFailure
    from relaybot import backup_archive as archive

    manifest = found.manifest
    try:
        snap = backup.check(found.files[archive.DATABASE])
    except MemoryFailure as exc:
        echo(f"relaybot: {args.file.name}: its database is not usable: {exc}", file=sys.stderr)
        return EXIT_FAILED
    what = f"the backup taken {manifest.get('taken_at', '?')} ({snap.log_rows} messages)"
    if not args.yes and not _confirm(f"Replace memory at {cfg.memory_path} with {what}? [y/N] "):
        echo("relaybot: nothing restored (run again with --yes to restore without asking)",
             file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    with _WorkerLease(cfg) as lease:
        if lease.problem:
            echo(f"relaybot: {lease.problem}", file=sys.stderr)
            return EXIT_FAILED
        curated = found.files.get(archive.CURATED)
        try:
            done = backup.restore(
                found.files[archive.DATABASE],
                cfg.memory_path,
                curated=(cfg.workspace_dir / "MEMORY.md", curated.read_text()) if curated else None,
                journal=found.files.get(archive.JOURNAL),
            )
        except MemoryFailure as exc:
            echo(f"relaybot: the restore failed; memory at {cfg.memory_path} is as it was: {exc}",
                 file=sys.stderr)  # fmt: skip
            return EXIT_FAILED
    echo(f"restored {cfg.memory_path} from {what}")
    echo(f"  re-applied {len(done.reapplied)} erasure(s) the backup did not hold "
         f"(of {done.erasures_known} known)")  # fmt: skip
    if done.journal_unreadable:
        echo(f"  {done.journal_unreadable} line(s) of the erasure journal did not parse (a write "
             "cut short): erasures in the replaced database were applied")  # fmt: skip
    if done.replaced_unreadable:
        echo(f"  the replaced database did not open ({done.replaced_unreadable}): erasures came "
             "from the journal only")  # fmt: skip
    if done.replaced is not None:
        echo(f"  the replaced database is kept at {done.replaced} until the next backup")
    if done.newer_rows:
        echo(f"  {done.newer_rows} message(s) recorded after the backup are not in it; to bring "
             f"them back: RELAYBOT_MEMORY_PATH={done.replaced} relaybot memory export --out "
             "newer.jsonl && relaybot memory import newer.jsonl")  # fmt: skip
    if done.curated_error:
        echo(f"  MEMORY.md was not put back: {done.curated_error}")
    elif curated:
        echo("  MEMORY.md is the backup's again (what it held is kept: relaybot memory curated "
             "list)")  # fmt: skip
    return 0


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("relaybot")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    try:
        return input(question).strip().casefold() in ("y", "yes")
    except EOFError:
        return False


class _WorkerLease:
    """The worker lease, held by the restore while it runs (no worker may start meanwhile);
    ``problem`` says why it could not be taken."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.problem: str | None = None
        self._runtime: Any = None
        self._lease: Any = None

    def __enter__(self) -> _WorkerLease:
        import redis

        from contract.bus import connect, redis_url
        from contract.liveness import Lease
        from contract.logs import redact
        from deploy import embedded
        from relaybot.runtime import Runtime, RuntimeProblem

        cfg = self.cfg
        try:
            if cfg.embedded_redis and not embedded.ping(cfg) and not embedded.supervised(cfg):
                self._runtime = Runtime(cfg, start_worker=False).__enter__()
                r = self._runtime.r
            else:
                r = connect(cfg)
            token = f"restore:{socket.gethostname()}:{os.getpid()}:{time.time():.0f}"
            lease = Lease(r, cfg.keys.lease, token, cfg.worker.lease_seconds)
            if not lease.try_acquire():
                holder = lease.holder() or "a worker"
                self.problem = (
                    f"a worker holds the worker lease ({holder}), so memory is in use: stop it "
                    "first (systemctl stop relaybot-worker, Ctrl-C on honcho start, or end the "
                    "relaybot chat that started it), then run the restore again"
                )
                return self
            lease.start_renewing()
            self._lease = lease
        except redis.exceptions.NoPermissionError as exc:
            self.problem = (
                f"Redis at {redact(redis_url(cfg))} refused: {exc}: a restore takes the worker "
                "lease, so it needs the worker's account (REDIS_URL as the worker has it)"
            )
        except (redis.RedisError, RuntimeProblem, OSError) as exc:
            self.problem = (
                f"cannot reach Redis at {redact(redis_url(cfg))} to make sure no worker runs "
                f"({exc}): start it and run the restore again"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lease is not None:
            self._lease.release()
        if self._runtime is not None:
            self._runtime.__exit__(None, None, None)


__all__ = ["add_arguments", "cmd_backup", "cmd_restore"]
