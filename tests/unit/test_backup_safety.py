"""What an adversarial review of backup and restore found, each a test: a second restore keeps
the database the first one replaced (and a backup deletes a kept database only when it holds
every message of it); ``backup --out`` never replaces anything, never writes into RELAYBOT_HOME
but its backups/ directory, and makes no directory but that one; no secret of config.toml, in any
TOML form, is in an archive, and the archived config.toml parses; an archive's members are
checked against the manifest's sizes (and the free space) before a byte is written; a backup of
another relaybot is restored only with --other-instance; a cut journal line with no replaced
database to read says one thing, and exits 1."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import Config, MemoryConfig, RedisConfig
from memory import backup
from memory.store import MemoryStore
from relaybot import backup_archive as archive
from relaybot import cli_backup
from tests.unit.test_admin_import import say


def config(home: Path, prefix: str = "relaybot:") -> Config:
    return Config(home=home, memory=MemoryConfig(workspace=home / "workspace"),
                  redis=RedisConfig(prefix=prefix))  # fmt: skip


def run_backup(cfg: Config, out: Path | None = None, with_secrets: bool = False) -> int:
    return cli_backup.cmd_backup(argparse.Namespace(out=out, with_secrets=with_secrets), cfg)


def run_restore(cfg: Config, file: Path, other_instance: bool = False) -> int:
    ns = argparse.Namespace(file=file, yes=True, other_instance=other_instance)
    return cli_backup.cmd_restore(ns, cfg)


class NoWorker:
    """The worker lease, taken (no Redis in a unit test)."""

    problem = None
    exit_code = 1

    def __init__(self, cfg: Config) -> None:
        pass

    def __enter__(self) -> NoWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setattr(cli_backup, "_WorkerLease", NoWorker)
    home = tmp_path / "home"
    home.mkdir()
    return config(home)


def texts(db: Path) -> list[str]:
    with MemoryStore(db, readonly=True) as store:
        return [t for (t,) in store.conn.execute("SELECT text FROM log WHERE direction = 'in'")]


# -- 1. a second restore -----------------------------------------------------------------------


def test_a_second_restore_keeps_what_the_first_one_replaced(
    cfg: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = cfg.memory_path
    with MemoryStore(live) as store:
        say(store, "before")
    b = tmp_path / "b.tgz"
    assert run_backup(cfg, b) == 0
    with MemoryStore(live) as store:
        say(store, "after-precious")
    capsys.readouterr()
    assert run_restore(cfg, b) == 0
    first = capsys.readouterr().out
    assert "2 message(s) of it are recorded after the backup" in first, first
    assert run_restore(cfg, b) == 0  # retried
    second = capsys.readouterr().out
    kept = backup.replaced_databases(live)
    assert len(kept) == 2, kept
    assert [t for p in kept for t in texts(p)].count("after-precious") == 1
    assert "an earlier restore's replaced database" in second and "2 message(s) not in" in second
    assert f"RELAYBOT_MEMORY_PATH={kept[0]} relaybot memory export" in second, second
    assert run_backup(cfg, tmp_path / "c.tgz") == 0  # deletes only what it holds every row of
    out = capsys.readouterr().out
    assert backup.replaced_databases(live) == [kept[0]]
    assert f"deleted {kept[1]}" in out and f"kept {kept[0]}" in out and "2 message(s)" in out


def test_a_backup_deletes_a_kept_database_once_its_messages_are_back(
    store: MemoryStore, tmp_path: Path
) -> None:
    live = store.path
    say(store, "before")
    copy = tmp_path / "copy.sqlite3"
    backup.snapshot(live, copy)
    say(store, "after")
    store.close()
    done = backup.restore(copy, live)
    assert done.replaced is not None and done.newer_rows == 2
    assert done.replaced.name.startswith("memory.replaced-") and done.replaced.exists()
    now = tmp_path / "now.sqlite3"
    backup.snapshot(live, now)
    assert backup.forget_replaced(live, now).kept == [(done.replaced, 2)]
    assert done.replaced.exists()
    again = tmp_path / "again.sqlite3"
    backup.snapshot(done.replaced, again)  # as if its messages were imported back
    assert backup.forget_replaced(live, again).deleted == [done.replaced]
    assert not done.replaced.exists()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "h" / "memory.sqlite3") as s:
        yield s


# -- 2. backup --out ---------------------------------------------------------------------------


def test_backup_out_never_replaces_anything(
    cfg: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MemoryStore(cfg.memory_path) as store:
        say(store, "hello")
    before = cfg.memory_path.read_bytes()
    there = tmp_path / "there.tgz"
    there.write_text("mine")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    for out in (cfg.memory_path, there, fifo, link, tmp_path):
        capsys.readouterr()
        assert run_backup(cfg, out) == 1, out
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "exists" in err, err
    assert cfg.memory_path.read_bytes() == before and there.read_text() == "mine"
    assert fifo.is_fifo() and link.is_symlink() and not (tmp_path / "nowhere").exists()


def test_backup_out_refuses_a_missing_directory_and_relaybot_home(
    cfg: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MemoryStore(cfg.memory_path) as store:
        say(store, "hello")
    assert run_backup(cfg, tmp_path / "nonexistent" / "dir" / "x.tgz") == 1
    assert "is not a directory" in capsys.readouterr().err
    assert not (tmp_path / "nonexistent").exists()
    for inside in (cfg.home / "x.tgz", cfg.home / "workspace" / "x.tgz"):
        inside.parent.mkdir(exist_ok=True)
        assert run_backup(cfg, inside) == 1
        assert "inside RELAYBOT_HOME" in capsys.readouterr().err and not inside.exists()
    assert run_backup(cfg) == 0  # the default: the one directory it makes
    (made,) = (cfg.home / "backups").iterdir()
    assert (cfg.home / "backups").stat().st_mode & 0o777 == 0o700
    assert run_backup(cfg, cfg.home / "backups" / "named.tgz") == 0
    assert made.exists()


def test_an_archive_is_never_renamed_over_a_file(store: MemoryStore, tmp_path: Path) -> None:
    say(store, "hello")
    work = tmp_path / "work"
    work.mkdir()
    backup.snapshot(store.path, work / archive.DATABASE)
    out = tmp_path / "raced.tgz"
    out.write_text("appeared meanwhile")
    with pytest.raises(archive.OutExists):
        archive.write_archive(out, {archive.DATABASE: work / archive.DATABASE}, {"taken_ts": 1})
    assert out.read_text() == "appeared meanwhile"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(archive.PARTIAL)] == []


# -- 3. secrets in config.toml -----------------------------------------------------------------

SECRETS = ["MULTI", "LINE-7777", "lit-secret-1", "inline-pw-2", "dotted-pw-3", "arr-tok-4",
           "arr-tok-5", "urlpw-6", "qkey-7", "tabled-8", "esc-9"]  # fmt: skip
CONFIG = '''# my old password was hunter2-in-a-comment
[matrix]
homeserver = "https://m.org"
password = """MULTI
LINE-7777"""
recovery_key = \'\'\'
lit-secret-1\'\'\'
[email]
imap = {host = "imap.example.org", password = "inline-pw-2"}
smtp.password = "dotted-pw-3"
[telegram]
tokens = ["arr-tok-4", """arr-tok-5"""]
[model]
base_url = "https://user:urlpw-6@gw.example.org/v1?key=qkey-7"
[model.auth]
value = "tabled-8"
[[extra]]
client_secret = "es\\u0063-9"
'''


def test_no_secret_in_any_toml_form_reaches_the_archive(cfg: Config, tmp_path: Path) -> None:
    masked = archive.mask_config(CONFIG)
    parsed = tomllib.loads(masked)  # valid TOML
    assert parsed["matrix"]["homeserver"] == "https://m.org"
    assert parsed["matrix"]["password"] == "***" and parsed["email"]["imap"]["password"] == "***"
    assert parsed["email"]["imap"]["host"] == "imap.example.org"
    assert parsed["model"]["base_url"].startswith("https://user:***@gw.example.org/v1")
    for secret in [*SECRETS, "hunter2"]:
        assert secret not in masked, secret
    with MemoryStore(cfg.memory_path) as store:
        say(store, "hello")
    cfg.config_file.write_text(CONFIG)
    out = tmp_path / "b.tgz"
    assert run_backup(cfg, out) == 0
    raw = gzip.decompress(out.read_bytes())
    for secret in [*SECRETS, "hunter2"]:
        assert secret.encode() not in raw, secret
    with tarfile.open(out) as tar:
        member = tar.extractfile(archive.CONFIG)
        assert member is not None
        tomllib.loads(member.read().decode())
    assert archive.mask_config("not = = toml") == archive.UNPARSED


# -- 4a. members larger than the manifest says -------------------------------------------------


def forged(tmp_path: Path, data: bytes, declared: int) -> Path:
    manifest = {"format": archive.FORMAT, "version": archive.VERSION, "taken_ts": 1,
                "files": {archive.DATABASE: {"sha256": "0" * 64, "size": declared}}}  # fmt: skip
    path = tmp_path / "forged.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, body in ((archive.MANIFEST, json.dumps(manifest).encode()),
                           (archive.DATABASE, data)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


def test_a_member_larger_than_its_manifest_says_is_refused_before_it_is_written(
    tmp_path: Path,
) -> None:
    bomb = forged(tmp_path, bytes(8 << 20), declared=4096)
    into = tmp_path / "x"
    into.mkdir()
    with pytest.raises(archive.BadArchive, match="its manifest says 4096"):
        archive.read_archive(bomb, into)
    assert list(into.iterdir()) == []


def test_an_archive_larger_than_the_free_space_is_refused_before_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = forged(tmp_path, bytes(8 << 20), declared=8 << 20)
    usage = archive.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(archive.shutil, "disk_usage", lambda _: usage._replace(free=32 << 20))
    into = tmp_path / "x"
    into.mkdir()
    with pytest.raises(archive.BadArchive, match="free beside memory"):
        archive.read_archive(bomb, into)
    assert list(into.iterdir()) == []


def test_a_tampered_member_of_the_right_size_is_refused_before_it_is_written(
    tmp_path: Path,
) -> None:
    forged_db = forged(tmp_path, bytes(1 << 20), declared=1 << 20)  # its sha256 is not "0"*64
    into = tmp_path / "x"
    into.mkdir()
    with pytest.raises(archive.BadArchive, match="fails its sha256 checksum"):
        archive.read_archive(forged_db, into)
    assert list(into.iterdir()) == []


# -- 4b. another relaybot's backup -------------------------------------------------------------


def test_another_relaybots_backup_needs_other_instance(
    cfg: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other_home = tmp_path / "other"
    other = config(other_home, prefix="other:")
    with MemoryStore(other.memory_path) as store:
        say(store, "the other one's")
    assert run_backup(other, tmp_path / "o.tgz") == 0
    with MemoryStore(cfg.memory_path) as store:
        say(store, "mine")
    capsys.readouterr()
    assert run_restore(cfg, tmp_path / "o.tgz") == 1
    err = capsys.readouterr().err
    assert "taken by another relaybot" in err and "'other:'" in err and "--other-instance" in err
    assert texts(cfg.memory_path) == ["mine"]
    assert run_restore(cfg, tmp_path / "o.tgz", other_instance=True) == 0
    out = capsys.readouterr().out
    assert "came from another relaybot" in out and "recorded after the backup" not in out
    assert "2 message(s) of it are not in the backup" in out
    assert texts(cfg.memory_path) == ["the other one's"]


# -- 4c. a cut journal line and no replaced database to read -----------------------------------


def test_a_cut_journal_line_and_an_unreadable_database_say_one_thing_and_exit_1(
    cfg: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MemoryStore(cfg.memory_path) as store:
        say(store, "kept")
    assert run_backup(cfg, tmp_path / "b.tgz") == 0
    with backup.journal_path(cfg.memory_path).open("ab") as fh:
        fh.write(b'{"ts": 12')  # a write cut short
    for suffix in ("-wal", "-shm"):
        Path(f"{cfg.memory_path}{suffix}").unlink(missing_ok=True)
    cfg.memory_path.write_bytes(b"not a database" * 100)  # the disk died
    capsys.readouterr()
    assert run_restore(cfg, tmp_path / "b.tgz") == 1
    captured = capsys.readouterr()
    assert "may not have been applied again" in captured.err
    assert "were applied" not in captured.out and "from the journal only" not in captured.out
    assert texts(cfg.memory_path) == ["kept"]  # the restore itself is done
