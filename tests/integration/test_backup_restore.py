"""`relaybot backup` and `relaybot restore` as the owner runs them: a real Redis, the worker as
its own process writing while the backup is taken, the command line as another.

Proves: the backup is consistent while messages are in flight, 0600, its config masked, its
manifest's checksums right; a restore is refused while a worker holds the lease, and refuses a
truncated or tampered archive with one line, leaving memory as it was; a restore applies again
every erasure made after the backup (the erased words are in no byte of the restored database,
its full-text index included, and no search finds them; MEMORY.md's versions that held them are
gone), keeps the replaced database until a backup holds its messages, and the worker goes on on
it; a second restore keeps the first one's replaced database; a backup killed with SIGKILL leaves
nothing at its final path; a restore under another Redis account than the worker's exits 2.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.keys import Keys
from memory.store import MemoryStore
from tests.integration.test_memory_cli import make_env, tell
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    REPO,
    Procs,
    chat,
    memory_rows,
    run_relaybot,
    wait_for_replies,
    wait_until,
    write_config,
)
from tests.support.servers import RedisServer, redis_with_acl
from tests.unit.test_admin_import import say

pytestmark = pytest.mark.integration

SECRET = "zanzibarquux"
API_KEY = "sk-backup-secret-123"


def relaybot(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_relaybot(list(args), env, timeout=120)


def home(env: dict[str, str]) -> Path:
    return Path(env["RELAYBOT_HOME"])


def raw_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        out: dict[str, bytes] = {}
        for m in tar.getmembers():
            data = tar.extractfile(m)
            assert data is not None
            out[m.name] = data.read()
        return out


class Writer(threading.Thread):
    """Carol's messages, one every few milliseconds, while the backup is taken."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        super().__init__(daemon=True)
        self.r, self.keys, self.sent = r, keys, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            tell(self.r, self.keys, f"filler {self.sent}", sender="@carol:m.org",
                 conversation="matrix:dm-carol")  # fmt: skip
            self.sent += 1
            time.sleep(0.005)


def test_backup_while_the_worker_writes_and_a_restore_that_keeps_later_erasures(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    env, keys = make_env(tmp_path, "home", redis_server, model_server)
    write_config(home(env), f'[owner]\nname = "Ada"\n\n[model]\napi_key = "{API_KEY}"\n')
    worker = procs.worker(env, r=real_redis, keys=keys)
    early = '[[tool:memory_write:{"content": "# Ada\\n- an early note"}]]'
    assert chat(env, early, session="first").returncode == 0  # before bob: nothing of his
    tell(real_redis, keys, SECRET, sender="@bob:m.org", conversation="matrix:dm-bob")
    wait_for_replies(real_redis, keys, "matrix:dm-bob", 1)
    # MEMORY.md, written twice more by the model: the first of these holds bob's word
    write = '[[tool:memory_write:{"content": "# Ada\\n- bob told me ' + SECRET + '"}]]'
    assert chat(env, write, session="mine").returncode == 0
    again = '[[tool:memory_write:{"content": "# Ada\\n- likes tea"}]]'
    assert chat(env, again, session="later").returncode == 0
    db = home(env) / "memory.sqlite3"
    assert len(memory_rows(db, "SELECT id FROM curated_version")) == 3

    writer = Writer(real_redis, keys)
    writer.start()
    try:
        wait_until(lambda: writer.sent >= 20, timeout=30, message="messages in flight")
        (tmp_path / "b").mkdir()  # an explicit --out's directory must exist
        made = relaybot(env, "backup", "--out", str(tmp_path / "b" / "backup.tar.gz"))
    finally:
        writer.done.set()
        writer.join()
    assert made.returncode == 0, made.stdout + made.stderr
    archive = tmp_path / "b" / "backup.tar.gz"
    assert f"backup: {archive} (mode 0600" in made.stdout
    assert archive.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in archive.parent.iterdir()] == ["backup.tar.gz"]
    files = members(archive)
    manifest = json.loads(files["manifest.json"])
    assert set(files) == {"manifest.json", "memory.sqlite3", "MEMORY.md", "config.toml"}
    for name, want in manifest["files"].items():
        assert hashlib.sha256(files[name]).hexdigest() == want["sha256"], name
    assert manifest["taken_at"].endswith("Z") and manifest["secrets"] == "masked"
    assert (
        API_KEY not in files["config.toml"].decode()
        and 'api_key = "***"' in files["config.toml"].decode()
    )
    copy = tmp_path / "copy.sqlite3"
    copy.write_bytes(files["memory.sqlite3"])
    conn = sqlite3.connect(copy)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    in_backup = {r for (r,) in conn.execute("SELECT text FROM log WHERE text LIKE 'filler %'")}
    conn.close()
    assert manifest["log_rows"] > 0 and in_backup  # some of carol's, written while it ran
    assert SECRET.encode() in files["memory.sqlite3"]  # erased only after the backup

    # after the backup: bob's conversation and the owner's that copied his word are erased
    for conversation in ("matrix:dm-bob", "cli:mine"):
        erased = relaybot(env, "memory", "erase", "--conversation", conversation, "--reason",
                          "asked", "--yes")  # fmt: skip
        assert erased.returncode == 0, erased.stdout + erased.stderr
    tell(real_redis, keys, "after the backup", sender="@carol:m.org", conversation="matrix:new")
    wait_for_replies(real_redis, keys, "matrix:new", 1)
    journal = (home(env) / "memory.erasures.jsonl").read_text()
    assert journal.count('"type":"erasure"') == 2 and SECRET not in journal

    # a worker holds the lease: refused, in one line, and memory is as it was
    before = raw_bytes(db)
    refused = relaybot(env, "restore", str(archive), "--yes")
    assert refused.returncode == 1
    assert "a worker holds the worker lease" in refused.stderr
    assert "systemctl stop relaybot-worker" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert SECRET.encode() not in before and memory_rows(db, "SELECT count(*) AS n FROM erasure")

    versions_before = memory_rows(db, "SELECT sha256 FROM curated_version ORDER BY id")
    worker.stop()
    done = relaybot(env, "restore", str(archive), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "re-applied 2 erasure(s)" in done.stdout
    (replaced,) = home(env).glob("memory.replaced-*.sqlite3")
    assert f"kept at {replaced} until a backup holds every message" in done.stdout
    assert "are recorded after the backup, not in it" in done.stdout

    # the erased word: in no byte of the file, no search, no version of MEMORY.md
    assert SECRET.encode() not in raw_bytes(db)
    assert memory_rows(db, "SELECT rowid FROM log_fts WHERE log_fts MATCH ?", SECRET) == []
    found = relaybot(env, "memory", "search", SECRET, "--json")
    assert found.returncode == 0 and found.stdout.strip() == "", found.stdout + found.stderr
    versions = relaybot(env, "memory", "curated", "list", "--json")
    assert versions.returncode == 0, versions.stderr
    listed = [json.loads(x) for x in versions.stdout.splitlines()]
    for v in listed:
        shown = relaybot(env, "memory", "curated", "show", str(v["id"]))
        assert shown.returncode == 0 and SECRET not in shown.stdout
    # the same versions as memory kept after the erasures (those written by a turn whose reply
    # an erasure took are gone too: derived)
    assert [{"sha256": v["sha256"]} for v in listed] == versions_before
    assert len(listed) == 1 and relaybot(env, "memory", "curated", "show", str(listed[0]["id"])
                                         ).stdout == "# Ada\n- an early note\n"  # fmt: skip
    texts = {r["text"] for r in memory_rows(db, "SELECT text FROM log")}
    assert in_backup <= texts and "after the backup" not in texts
    assert (home(env) / "workspace" / "MEMORY.md").read_text() == "# Ada\n- likes tea\n"

    # the worker goes on on the restored memory
    procs.worker(env, r=real_redis, keys=keys)
    assert chat(env, "hello again after the restore", session="back").returncode == 0
    hit = relaybot(env, "memory", "search", "restore", "--json")
    assert "hello again after the restore" in hit.stdout

    # what was recorded after the backup comes back from the kept database, as restore says
    newer = tmp_path / "newer.jsonl"
    exported = relaybot({**env, "RELAYBOT_MEMORY_PATH": str(replaced)}, "memory", "export",
                        "--out", str(newer))  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    imported = relaybot(env, "memory", "import", str(newer))
    assert imported.returncode == 0, imported.stdout + imported.stderr
    texts = {r["text"] for r in memory_rows(db, "SELECT text FROM log")}
    assert "after the backup" in texts and SECRET.encode() not in raw_bytes(db)

    # the next backup deletes the database the restore kept: it holds every message of it now
    nextone = relaybot(env, "backup")
    assert nextone.returncode == 0, nextone.stdout + nextone.stderr
    assert f"deleted {replaced}" in nextone.stdout and not replaced.exists()
    (default,) = (home(env) / "backups").iterdir()
    assert default.name.startswith("relaybot-") and default.name.endswith("Z.tar.gz")


def _memory(env: dict[str, str], texts: list[str]) -> Path:
    db = home(env) / "memory.sqlite3"
    with MemoryStore(db) as store:
        for text in texts:
            say(store, text)
    return db


def test_a_truncated_or_tampered_backup_is_refused_and_memory_is_untouched(
    tmp_path: Path, redis_server: RedisServer, model_server: FakeModelServer
) -> None:
    env, _ = make_env(tmp_path, "home", redis_server, model_server)
    db = _memory(env, ["the original memory"])
    archive = tmp_path / "b.tar.gz"
    assert relaybot(env, "backup", "--out", str(archive)).returncode == 0
    before = raw_bytes(db)

    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    cut = relaybot(env, "restore", str(truncated), "--yes")
    assert cut.returncode == 1 and "truncated or damaged" in cut.stderr
    assert len(cut.stderr.strip().splitlines()) == 1, cut.stderr

    files = members(archive)
    files["memory.sqlite3"] = files["memory.sqlite3"].replace(b"the original", b"THE FORGED  ")
    forged = tmp_path / "forged.tar.gz"
    with tarfile.open(forged, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    bad = relaybot(env, "restore", str(forged), "--yes")
    assert bad.returncode == 1
    assert "memory.sqlite3 fails its sha256 checksum (tampered with or damaged)" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr

    unasked = relaybot(env, "restore", str(archive))  # no terminal, no --yes
    assert unasked.returncode == 1 and "--yes" in unasked.stderr
    assert raw_bytes(db) == before and not list(home(env).glob("memory.replaced*"))


def test_a_backup_killed_half_way_leaves_nothing_at_its_path(
    tmp_path: Path, redis_server: RedisServer, model_server: FakeModelServer
) -> None:
    env, _ = make_env(tmp_path, "home", redis_server, model_server)
    _memory(env, ["a message"])
    workspace = home(env) / "workspace"
    workspace.mkdir()
    (workspace / "MEMORY.md").write_bytes(os.urandom(48 << 20))  # slow to compress
    out = tmp_path / "b" / "backup.tar.gz"
    out.parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaybot", "backup", "--out", str(out)], env=env, cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    partial = out.parent / f".{out.name}.{proc.pid}.partial"

    def writing() -> Any:
        if proc.poll() is not None:
            raise AssertionError("the backup ended before it could be killed")
        return partial.exists() and partial.stat().st_size > 0

    wait_until(writing, timeout=60, interval=0.005, message="the archive being written")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # never a partial archive at the final path
    left = sorted(p.name for p in out.parent.iterdir())
    assert left == sorted([partial.name, f".relaybot-backup.{proc.pid}.partial"])
    made = relaybot(env, "backup", "--out", str(out))
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["backup.tar.gz"]  # stale ones gone


def test_a_restore_needs_the_workers_redis_account(
    tmp_path: Path, redis_server: RedisServer, model_server: FakeModelServer
) -> None:
    passwords = {"worker": "w-secret", "cli": "c-secret"}
    acl = (REPO / "deploy" / "redis" / "users.acl").read_text()
    with redis_with_acl(tmp_path, acl, passwords) as port:
        env, _ = make_env(tmp_path, "home", redis_server, model_server)
        _memory(env, ["kept"])
        url = f"redis://relaybot-{{}}:{{}}@127.0.0.1:{port}/0"
        as_cli = {
            **env,
            "REDIS_URL": url.format("cli", "c-secret"),
            "RELAYBOT_REDIS_PREFIX": "relaybot:",
        }
        archive = tmp_path / "b.tar.gz"
        assert relaybot(as_cli, "backup", "--out", str(archive)).returncode == 0
        refused = relaybot(as_cli, "restore", str(archive), "--yes")
        assert refused.returncode == 2  # a refused account: a configuration error
        assert "it needs the worker's account" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        as_worker = {**as_cli, "REDIS_URL": url.format("worker", "w-secret")}
        done = relaybot(as_worker, "restore", str(archive), "--yes")
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_second_restore_loses_nothing_and_says_where_the_newer_messages_are(
    tmp_path: Path, redis_server: RedisServer, model_server: FakeModelServer
) -> None:
    env, _ = make_env(tmp_path, "home", redis_server, model_server)
    db = _memory(env, ["before"])
    archive = tmp_path / "b.tgz"
    assert relaybot(env, "backup", "--out", str(archive)).returncode == 0
    _memory(env, ["after-precious"])
    first = relaybot(env, "restore", str(archive), "--yes")
    assert first.returncode == 0, first.stdout + first.stderr
    second = relaybot(env, "restore", str(archive), "--yes")  # retried
    assert second.returncode == 0, second.stdout + second.stderr
    kept = sorted(home(env).glob("memory.replaced-*.sqlite3"))
    holding = [p for p in kept if "after-precious" in
               {r["text"] for r in memory_rows(p, "SELECT text FROM log")}]  # fmt: skip
    assert len(kept) == 2 and len(holding) == 1, kept
    assert (
        f"an earlier restore's replaced database {holding[0]} holds 2 message(s)" in second.stdout
    )
    assert f"RELAYBOT_MEMORY_PATH={holding[0]} relaybot memory export" in second.stdout
    assert {r["text"] for r in memory_rows(db, "SELECT text FROM log")} == {"before", "ok"}
