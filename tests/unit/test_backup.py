"""Backup and restore at memory's level (memory/backup.py, memory/erasure_log.py), MEMORY.md's
versions (memory/curated_versions.py) and the archive (relaybot/backup_archive.py): a copy taken
while a write is open holds what was committed; every erasure is journalled before it commits; a
restore applies again every erasure the backup lacks, from the journal alone when the replaced
database is gone, so the erased words are in no byte of the restored file; a memory_write keeps
what it replaced; a damaged, truncated or tampered archive is refused with one line."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import Config, MemoryConfig
from contract.messages import InboundMessage, Privacy
from memory import backup, commands, curated_versions, erasure_log
from memory.commands import CommandContext
from memory.erasure import erase
from memory.facade import Memory
from memory.privacy import Scope
from memory.store import MemoryStore
from relaybot import backup_archive as archive
from tests.unit.test_admin_import import say
from worker.memory_tools import memory_tools
from worker.tools import ToolRegistry
from worker.turn import memory_settings
from worker.turn_context import TurnContext

SECRET = "zanzibarquux"


@pytest.fixture
def live(tmp_path: Path) -> Path:
    return tmp_path / "home" / "memory.sqlite3"


@pytest.fixture
def store(live: Path) -> Iterator[MemoryStore]:
    with MemoryStore(live) as s:
        yield s


def raw_bytes(path: Path) -> bytes:
    return b"".join(
        Path(f"{path}{s}").read_bytes() for s in ("", "-wal") if Path(f"{path}{s}").exists()
    )


def test_a_copy_taken_while_a_write_is_open_holds_what_was_committed(
    store: MemoryStore, tmp_path: Path
) -> None:
    say(store, "committed before the copy")
    with store.transaction():
        say_rows = store.conn.execute("SELECT count(*) FROM log").fetchone()[0]
        store.conn.execute("SAVEPOINT open_write")  # the worker's batch, not committed yet
        inner = InboundMessage(
            channel="cli", session="s", conversation="cli:s", sender="ada",
            privacy=Privacy.OWNER, text="not committed yet", ts=1.0, event_id="x1",
        )  # fmt: skip
        store.append_inbound(inner, "99-0", is_owner=True)
        snap = backup.snapshot(store.path, tmp_path / "copy.sqlite3")
        store.conn.execute("RELEASE open_write")
    assert snap.log_rows == say_rows == 2  # the message and its reply; not the open one
    assert (tmp_path / "copy.sqlite3").stat().st_mode & 0o777 == 0o600
    assert b"not committed yet" not in (tmp_path / "copy.sqlite3").read_bytes()
    assert backup.check(tmp_path / "copy.sqlite3").schema_version == snap.schema_version


def test_an_erasure_is_journalled_before_it_commits_and_holds_no_text(
    store: MemoryStore, live: Path
) -> None:
    say(store, f"bob says {SECRET}")
    with store.transaction():
        erase(store, kind="conversation", target="matrix:dm-bob", reason="bob asked",
              requested_by="ada", stream_id="5-0", now=100.0)  # fmt: skip
        journal = erasure_log.read(live)  # before the commit
    (rec,) = journal.records
    assert (rec.ts, rec.target_kind, rec.target, rec.stream_id) == (
        100.0, "conversation", "matrix:dm-bob", "5-0",
    )  # fmt: skip
    assert rec.detail["log_keys"]
    path = erasure_log.journal_path(live)
    assert path.name == "memory.erasures.jsonl" and path.stat().st_mode & 0o777 == 0o600
    assert SECRET not in path.read_text()


def _later_erasure_setup(store: MemoryStore, tmp_path: Path) -> Path:
    """Memory with the secret in the log and in a MEMORY.md version, copied; then erased."""
    say(store, f"bob says {SECRET}")
    say(store, "carol stays", sender="@carol:m.org", conversation="matrix:dm-carol")
    (bobs,) = store.conn.execute("SELECT stream_id FROM log WHERE id = 1").fetchone()
    # written in the turn that answered bob (its reply is erased with him): derived
    curated_versions.keep(store.conn, f"# Ada\n- bob's word: {SECRET[::-1]}\n", "replace",
                          now=4.0, stream_id=bobs)  # fmt: skip
    curated_versions.keep(store.conn, f"# Ada\n- bob said: bob says {SECRET}\n", "hand", now=5.0)
    curated_versions.keep(store.conn, "# Ada\n- likes tea\n", "replace", now=6.0)
    copy = tmp_path / "copy.sqlite3"
    backup.snapshot(store.path, copy)
    assert SECRET.encode() in copy.read_bytes() and SECRET[::-1].encode() in copy.read_bytes()
    erase(store, kind="conversation", target="matrix:dm-bob", reason="bob asked",
          requested_by="ada", stream_id="50-0")  # fmt: skip
    return copy


@pytest.mark.parametrize("lost", [False, True], ids=["replaced-db-opens", "replaced-db-lost"])
def test_a_restore_applies_every_later_erasure_again(
    store: MemoryStore, live: Path, tmp_path: Path, lost: bool
) -> None:
    copy = _later_erasure_setup(store, tmp_path)
    store.close()
    if lost:  # the disk died: only the journal beside it knows of the erasure
        for suffix in ("", "-wal", "-shm"):
            Path(f"{live}{suffix}").unlink(missing_ok=True)
    done = backup.restore(copy, live)
    assert len(done.reapplied) == 1 and done.erasures_known == 1
    assert (done.replaced is None) == lost
    assert SECRET.encode() not in raw_bytes(live)  # no byte of the file: log, FTS, versions
    assert SECRET[::-1].encode() not in raw_bytes(live)
    with MemoryStore(live, readonly=True) as restored:
        conn = restored.conn
        texts = [t for (t,) in conn.execute("SELECT text FROM log ORDER BY id")]
        assert texts[:2] == ["", ""] and "carol stays" in texts
        assert (
            conn.execute("SELECT rowid FROM log_fts WHERE log_fts MATCH ?", (SECRET,)).fetchall()
            == []
        )
        assert conn.execute("SELECT rowid FROM log_fts WHERE log_fts MATCH 'carol'").fetchall()
        versions = [v.text for v in [curated_versions.version(conn, v.id) for v in
                    curated_versions.listing(conn)] if v]  # fmt: skip
        assert versions == ["# Ada\n- likes tea\n"]
        (tomb,) = conn.execute("SELECT target, stream_id FROM erasure").fetchall()
        assert tomb == ("matrix:dm-bob", "50-0")
    again = backup.restore(copy, live)  # the journal still knows it: applied again
    assert len(again.reapplied) == 1 and SECRET.encode() not in raw_bytes(live)


def test_the_replaced_database_is_kept_until_a_backup_holds_its_messages(
    store: MemoryStore, live: Path, tmp_path: Path
) -> None:
    say(store, "before the backup")
    copy = tmp_path / "copy.sqlite3"
    backup.snapshot(store.path, copy)
    say(store, "after the backup")
    store.close()
    done = backup.restore(copy, live)
    assert done.replaced is not None and done.replaced.exists()
    assert backup.replaced_databases(live) == [done.replaced]
    assert done.newer_rows == 2  # the message and its reply recorded after the backup
    assert backup.forget_replaced(live, copy).kept == [(done.replaced, 2)]
    assert backup.forget_replaced(live, done.replaced).deleted == [done.replaced]
    assert not done.replaced.exists() and backup.replaced_databases(live) == []


def owner_turn(tmp_path: Path, store: MemoryStore) -> TurnContext:
    cfg = Config(home=tmp_path, memory=MemoryConfig(workspace=tmp_path / "workspace"))
    msg = InboundMessage(
        channel="cli", session="cli:home", conversation="cli:home", sender="ada",
        privacy=Privacy.OWNER, text="hi", ts=1.0, event_id="e1",
    )  # fmt: skip
    return TurnContext(stream_id="1-0", msg=msg, scope=Scope("cli:home", Privacy.OWNER),
                       memory=Memory(store, memory_settings(cfg)))  # fmt: skip


def test_memory_write_keeps_every_version_and_one_can_be_restored(
    store: MemoryStore, tmp_path: Path
) -> None:
    tools = ToolRegistry(memory_tools(owner_turn(tmp_path, store)))
    tools.call("memory_write", {"content": "# Ada\n- lives in Lisbon"})
    path = tmp_path / "workspace" / "MEMORY.md"
    path.write_text("# Ada\n- lives in Lisbon\n- edited by hand\n")  # the owner's editor
    tools.call("memory_write", {"content": "# Ada\n- lives in Porto"})  # a replace
    tools.call("memory_write", {"content": "- likes tea", "mode": "append"})
    listed = curated_versions.listing(store.conn)
    assert [v.cause for v in listed] == ["replace", "hand", "replace", "append"]
    texts = [curated_versions.version(store.conn, v.id) for v in listed]
    assert [t.text for t in texts if t] == [
        "# Ada\n- lives in Lisbon\n",
        "# Ada\n- lives in Lisbon\n- edited by hand\n",
        "# Ada\n- lives in Porto\n",
        "# Ada\n- lives in Porto\n- likes tea\n",
    ]
    assert listed[0].size == len("# Ada\n- lives in Lisbon\n")
    ctx = CommandContext("9-0", store, workspace=tmp_path / "workspace")
    result = commands.apply(ctx, "curated.restore", {"version": listed[1].id})
    assert result["ok"], result
    assert path.read_text() == "# Ada\n- lives in Lisbon\n- edited by hand\n"
    now = curated_versions.listing(store.conn)
    assert [v.cause for v in now][-1] == "restore" and len(now) == 5
    missing = commands.apply(ctx, "curated.restore", {"version": 99})
    assert not missing["ok"] and "no MEMORY.md version 99" in missing["error"]


def test_an_erasure_reaches_memory_md_versions(store: MemoryStore) -> None:
    say(store, f"bob says {SECRET}")
    (bobs,) = store.conn.execute("SELECT stream_id FROM log WHERE id = 1").fetchone()
    curated_versions.keep(store.conn, f"- bob says {SECRET}\n", "hand")  # holds the text
    curated_versions.keep(store.conn, "- bob has a word\n", "replace", stream_id=bobs)  # derived
    curated_versions.keep(store.conn, "- nothing of bob\n", "replace", stream_id="1-0")
    result = erase(store, kind="conversation", target="matrix:dm-bob", reason="x",
                   requested_by="ada", stream_id="7-0")  # fmt: skip
    texts = [
        curated_versions.version(store.conn, v.id) for v in curated_versions.listing(store.conn)
    ]
    assert [v.text for v in texts if v] == ["- nothing of bob\n"]
    (detail,) = store.conn.execute("SELECT detail FROM erasure WHERE id = ?", (result["erasure"],))
    assert len(json.loads(detail[0])["curated_versions"]) == 2  # by digest: an import skips them


# -- the archive -------------------------------------------------------------------------------


def test_the_config_is_masked() -> None:
    text = (
        '[model]\napi_key = "sk-abc"\nbase_url = "https://gw.example.org/v1?key=k123"\n'
        '[redis]\nurl = "redis://:pw123@10.0.0.5:6379/0"\n[email]\nimap_password = "hunter2"\n'
        '[matrix]\naccess_token = "syt_abcdefghijkl"\nhomeserver = "https://m.org"\n'
    )
    masked = archive.mask_config(text)
    for secret in ("sk-abc", "k123", "pw123", "hunter2", "syt_abcdefghijkl"):
        assert secret not in masked
    assert 'homeserver = "https://m.org"' in masked and "10.0.0.5:6379/0" in masked


def test_an_mcp_server_s_env_headers_and_secret_arguments_are_masked() -> None:
    """Every value of an MCP server's ``env`` is a secret whatever its name (issue 29's privacy
    review: ``GH_PAT`` was archived as written), its ``headers`` too, and a command's argument
    after a secret-looking flag."""
    text = (
        '[mcp.servers.gh]\ncommand = ["mcp-gh", "--api-key", "ARG1", "--token=ARG2", "--verbose",'
        ' "/srv/notes"]\nenv = { GH_PAT = "ENV1", BRAVE = "ENV2" }\n'
        '[mcp.servers.web]\nurl = "https://w.example/mcp"\n'
        'headers = { Authorization = "Bearer HDR1", X-Plain = "HDR2" }\n'
    )
    masked = archive.mask_config(text)
    for secret in ("ARG1", "ARG2", "ENV1", "ENV2", "HDR1", "HDR2"):
        assert secret not in masked, masked
    for kept in ('"mcp-gh"', '"--api-key"', '"--verbose"', '"/srv/notes"', "GH_PAT", "X-Plain",
                 "https://w.example/mcp"):  # fmt: skip
        assert kept in masked, masked


def _archive(tmp_path: Path, store: MemoryStore) -> Path:
    say(store, "hello")
    work = tmp_path / "work"
    work.mkdir()
    backup.snapshot(store.path, work / archive.DATABASE)
    out = tmp_path / "b.tar.gz"
    archive.write_archive(out, {archive.DATABASE: work / archive.DATABASE}, {"taken_ts": 1.0})
    return out


def test_a_good_archive_is_read_and_is_0600(store: MemoryStore, tmp_path: Path) -> None:
    out = _archive(tmp_path, store)
    assert out.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(archive.PARTIAL)] == []
    into = tmp_path / "x"
    into.mkdir()
    found = archive.read_archive(out, into)
    assert set(found.files) == {archive.DATABASE} and found.manifest["format"] == archive.FORMAT


def test_a_truncated_archive_is_refused(store: MemoryStore, tmp_path: Path) -> None:
    out = _archive(tmp_path, store)
    out.write_bytes(out.read_bytes()[: out.stat().st_size // 2])
    (tmp_path / "x").mkdir()
    with pytest.raises(archive.BadArchive, match="truncated or damaged"):
        archive.read_archive(out, tmp_path / "x")


def test_a_tampered_archive_is_refused(store: MemoryStore, tmp_path: Path) -> None:
    out = _archive(tmp_path, store)
    with tarfile.open(out) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    db = bytearray(members[archive.DATABASE])
    at = db.find(b"hello")
    db[at : at + 5] = b"HELLO"
    members[archive.DATABASE] = bytes(db)
    forged = tmp_path / "forged.tar.gz"
    with tarfile.open(forged, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "x").mkdir()
    with pytest.raises(archive.BadArchive, match=r"memory\.sqlite3 fails its sha256 checksum"):
        archive.read_archive(forged, tmp_path / "x")
    manifest = json.loads(members[archive.MANIFEST])
    assert manifest["files"][archive.DATABASE]["size"] == len(db)


def test_a_killed_backup_leaves_partials_that_the_next_one_removes(tmp_path: Path) -> None:
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    stale = tmp_path / f".relaybot-x.tar.gz.{dead}{archive.PARTIAL}"
    stale.write_bytes(b"half")
    stale_dir = tmp_path / f".relaybot-backup.{dead}{archive.PARTIAL}"
    stale_dir.mkdir()
    mine = tmp_path / f".relaybot-y.tar.gz.{os.getpid()}{archive.PARTIAL}"
    mine.write_bytes(b"in progress")
    assert sorted(archive.remove_stale_partials(tmp_path)) == sorted([stale, stale_dir])
    assert mine.exists() and not stale.exists() and not stale_dir.exists()


def test_a_copy_with_a_schema_object_memory_does_not_make_is_refused(
    store: MemoryStore, live: Path, tmp_path: Path
) -> None:
    """A crafted backup (the manifest rehashed) with one more trigger, one that deletes the log:
    it was restored, and every write after it was refused for ever."""
    import sqlite3

    from memory.errors import MemoryFailure

    say(store, "ada keeps this")
    copy = tmp_path / "copy.sqlite3"
    backup.snapshot(live, copy)
    conn = sqlite3.connect(copy)
    conn.execute("ANALYZE")  # SQLite's own statistics (sqlite_stat1, as PRAGMA optimize makes)
    conn.commit()
    conn.close()
    assert backup.check(copy).log_rows == 2  # the honest copy passes (the message, its reply)
    conn = sqlite3.connect(copy)
    conn.execute("CREATE TRIGGER evil AFTER INSERT ON log BEGIN DELETE FROM log; END")
    conn.commit()
    conn.close()
    with pytest.raises(MemoryFailure, match="trigger evil"):
        backup.check(copy)
