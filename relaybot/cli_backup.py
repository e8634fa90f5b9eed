"""`relaybot backup` and `relaybot restore`.

``backup`` takes a consistent copy of memory while the worker runs (memory/backup.py), packs it
with MEMORY.md, the erasure journal and config.toml (secrets masked unless ``--with-secrets``)
under a manifest of sha256 checksums (relaybot/backup_archive.py), mode 0600, by default to
``$RELAYBOT_HOME/backups/relaybot-<UTC time>.tar.gz``; ``--out`` never replaces anything, never
points into RELAYBOT_HOME but its backups/, and makes no directory. Then it deletes each database
a restore kept that the backup holds every message of (and names the others).

``restore FILE`` checks the archive (one line and exit 1 for a damaged, truncated or tampered
file, or a member larger than the manifest says), refuses another relaybot's backup (another
home or Redis prefix) unless ``--other-instance``, asks unless ``--yes``, and takes the worker
lease for as long as it runs, so that no worker writes memory meanwhile: while a worker holds
it, restore refuses and says how to stop it (it never stops a worker itself: that one may run
under systemd, honcho, or on another terminal). It then puts the copy in place with every
erasure made after the backup applied again, keeps the replaced database (a new
``<memory>.replaced-<UTC time>.sqlite3``, never over an earlier one) until a backup holds its
messages, and puts back MEMORY.md (what it replaces is kept as one of its versions). Redis is
left as it is (README, "Backup and restore": what a restore does not bring back, and how to).
Exit codes: 0 done, 1 refused or failed (or done while an erasure may be missing: a cut journal
line and no replaced database to read), 2 configuration error (a Redis account that may not
take the worker lease).
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
EXIT_CONFIG = 2


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
    restore.add_argument(
        "--other-instance",
        action="store_true",
        help="restore a backup another relaybot took (another home or Redis prefix)",
    )
    restore.set_defaults(func=cmd_restore)


def cmd_backup(args: argparse.Namespace, cfg: Config) -> int:
    from memory import backup
    from memory.errors import MemoryFailure
    from relaybot import backup_archive as archive

    now = datetime.now(UTC)
    taken_at = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    out: Path = args.out or cfg.home / "backups" / archive.default_name(taken_at)
    out = out.expanduser().absolute()
    refused = _refused_out(out, cfg, explicit=args.out is not None)
    if refused:
        echo(f"relaybot: {refused}", file=sys.stderr)
        return EXIT_FAILED
    try:
        if args.out is None:  # only the default directory is made
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
            "home": str(cfg.home.expanduser().absolute()),
            "redis_prefix": cfg.redis.prefix,
        }
        digest = archive.write_archive(out, files, manifest)
        forgotten = backup.forget_replaced(cfg.memory_path, files[archive.DATABASE])
    except archive.OutExists:
        echo(f"relaybot: {out} exists: a backup never replaces a file; name a new one",
             file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
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
    for path in forgotten.deleted:
        echo(f"  deleted {path}, a database a restore replaced: every message of it is in this "
             "backup")  # fmt: skip
    for path, missing in forgotten.kept:
        why = "it did not open" if missing < 0 else f"{missing} message(s) of it are not in it"
        echo(
            f"  kept {path}, a database a restore replaced: {why}; "
            f"{_bring_back(path) if missing > 0 else 'delete it yourself once you know'}"
        )
    return 0


def _bring_back(path: Path) -> str:
    return (
        f"to bring them back: RELAYBOT_MEMORY_PATH={path} relaybot memory export --out "
        "newer.jsonl && relaybot memory import newer.jsonl"
    )


def _refused_out(out: Path, cfg: Config, *, explicit: bool) -> str | None:
    """Why the archive cannot be written at ``out`` (None: it can): it never replaces anything,
    never goes into RELAYBOT_HOME but its backups/ directory, and an explicit --out's directory
    must exist."""
    if os.path.lexists(out):
        kind = "a directory" if out.is_dir() else "a file" if out.is_file() else "not a file"
        return f"{out} exists ({kind}): a backup never replaces a file; name a new one (--out FILE)"
    parent = out.parent
    if explicit and not parent.is_dir():
        return f"{parent} is not a directory: --out FILE must name a file in an existing one"
    home = cfg.home.expanduser().resolve()
    where = parent.resolve() if parent.exists() else parent
    if where.is_relative_to(home) and not where.is_relative_to(home / "backups"):
        return (
            f"{out} is inside RELAYBOT_HOME ({home}), where relaybot keeps its own files: write "
            f"the backup in {home / 'backups'} or outside {home}"
        )
    return None


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
    foreign = _foreign(manifest, cfg)
    if foreign and not args.other_instance:
        echo(f"relaybot: {args.file.name} was taken by another relaybot ({foreign}): restoring it "
             "puts that one's memory in place of this one's; run again with --other-instance to "
             "do so", file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    with _WorkerLease(cfg) as lease:  # taken before asking: a running worker is said at once
        if lease.problem:
            echo(f"relaybot: {lease.problem}", file=sys.stderr)
            return lease.exit_code
        question = f"Replace memory at {cfg.memory_path} with {what}? [y/N] "
        if not args.yes and not _confirm(question):
            echo("relaybot: nothing restored (run again with --yes to restore without asking)",
                 file=sys.stderr)  # fmt: skip
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
    if foreign:
        echo(f"  the backup came from another relaybot ({foreign})")
    echo(f"  re-applied {len(done.reapplied)} erasure(s) the backup did not hold "
         f"(of {done.erasures_known} known)")  # fmt: skip
    _erasure_sources(done)
    if done.replaced is not None:
        echo(f"  the replaced database is kept at {done.replaced} until a backup holds every "
             "message of it")  # fmt: skip
    later = "not in the backup" if foreign else "recorded after the backup, not in it"
    if done.newer_rows and done.replaced is not None:
        echo(f"  {done.newer_rows} message(s) of it are {later}; {_bring_back(done.replaced)}")
    for path, missing in done.earlier:
        if missing:
            why = "it did not open" if missing < 0 else f"{missing} message(s) not in this memory"
            hint = _bring_back(path) if missing > 0 else "it is kept"
            echo(f"  an earlier restore's replaced database {path} holds {why}; {hint}")
    if done.curated_error:
        echo(f"  MEMORY.md was not put back: {done.curated_error}")
    elif curated:
        echo("  MEMORY.md is the backup's again (what it held is kept: relaybot memory curated "
             "list)")  # fmt: skip
    return EXIT_FAILED if done.erasures_incomplete else 0


def _erasure_sources(done: Any) -> None:
    """One true line on where the erasures came from when a source could not be read."""
    cut = done.journal_unreadable
    if done.erasures_incomplete:
        gone = (
            f"the replaced database did not open ({done.replaced_unreadable})"
            if done.replaced is not None
            else "there was no database to replace"
        )
        echo(f"relaybot: {cut} line(s) of the erasure journal did not parse (a write cut short) "
             f"and {gone}: an erasure made after the backup may not have been applied again; "
             "erase again what you erased since then (relaybot memory erase)",
             file=sys.stderr)  # fmt: skip
    elif cut:
        echo(f"  {cut} line(s) of the erasure journal did not parse (a write cut short): the "
             "replaced database's tombstones were applied too")  # fmt: skip
    elif done.replaced_unreadable:
        echo(f"  the replaced database did not open ({done.replaced_unreadable}): erasures came "
             "from the journal only")  # fmt: skip


def _foreign(manifest: dict[str, Any], cfg: Config) -> str | None:
    """How the backup's relaybot differs from this one (home, Redis prefix), or None (the same,
    or a backup that does not say)."""
    here = {"home": str(cfg.home.expanduser().absolute()), "redis_prefix": cfg.redis.prefix}
    names = {"home": "home", "redis_prefix": "Redis prefix"}
    diff = [
        f"{names[k]} {manifest[k]!r}, this one {v!r}"
        for k, v in here.items()
        if isinstance(manifest.get(k), str) and manifest[k] != v
    ]
    if not diff:
        return None
    return f"on {manifest.get('host', '?')}: " + "; ".join(diff)


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


def _acquire(lease: Any, ttl: float) -> bool:
    """The lease; when a worker of this host that is gone still holds it (stopped together with
    its Redis: honcho stops both at once, so it could not release it), its lease runs out within
    ``ttl`` seconds: waited for, and said."""
    from contract.liveness import gone_from_this_host

    deadline = time.monotonic() + ttl + 1
    said = False
    while not lease.try_acquire():
        holder = lease.holder()
        if holder is None:
            continue  # it ran out just now
        if not gone_from_this_host(holder) or time.monotonic() > deadline:
            return False
        if not said:
            echo(f"relaybot: the worker that held the lease ({holder}) is gone; its lease runs "
                 f"out within {ttl:.0f} s", file=sys.stderr)  # fmt: skip
            said = True
        time.sleep(0.2)
    return True


class _WorkerLease:
    """The worker lease, held by the restore while it runs (no worker may start meanwhile);
    ``problem`` says why it could not be taken."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.problem: str | None = None
        self.exit_code = EXIT_FAILED
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
            if not _acquire(lease, cfg.worker.lease_seconds):
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
            self.exit_code = EXIT_CONFIG  # a refused account is a configuration error
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
