"""MEMORY.md: atomic replace (never a partial file), tolerant bounded reads, owner-only use."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import Config, MemoryConfig
from contract.messages import InboundMessage, Privacy
from memory import curated
from memory.curated import (
    CuratedError,
    CuratedFile,
    curated_path,
    memory_write,
    read_curated,
    write_curated,
)
from memory.facade import Memory
from memory.privacy import Scope
from memory.store import MemoryStore
from worker.memory_tools import curated_tools, memory_tools
from worker.tools import ToolRegistry
from worker.turn import memory_settings
from worker.turn_context import TurnContext

OLD = "# Memory\n- the owner likes tea\n"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    p = curated_path(tmp_path / "workspace")
    p.parent.mkdir()
    p.write_text(OLD, encoding="utf-8")
    return p


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != "MEMORY.md")


def test_write_replaces_the_whole_file(path: Path) -> None:
    size = write_curated(path, "# Memory\n- coffee now")
    assert path.read_text(encoding="utf-8") == "# Memory\n- coffee now\n"
    assert size == len("# Memory\n- coffee now\n")
    assert leftovers(path.parent) == []


@pytest.mark.parametrize("failing", ["fsync", "replace", "write"])
def test_a_failed_write_leaves_the_old_content_and_no_temporary_file(
    path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    real_fdopen = os.fdopen

    class HalfWriter:
        """Writes half the data, then the disk is full."""

        def __init__(self, fh: Any) -> None:
            self.fh = fh

        def __enter__(self) -> HalfWriter:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

        def write(self, data: bytes) -> int:
            self.fh.write(data[: len(data) // 2])
            self.fh.flush()
            raise OSError(28, "No space left on device")

    def boom(*_a: object, **_k: object) -> None:
        raise OSError(5, "Input/output error")

    if failing == "fsync":
        monkeypatch.setattr(os, "fsync", boom)
    elif failing == "replace":
        monkeypatch.setattr(os, "replace", boom)
    else:
        monkeypatch.setattr(os, "fdopen", lambda fd, mode: HalfWriter(real_fdopen(fd, mode)))
    with pytest.raises(CuratedError, match="could not write"):
        write_curated(path, "# Memory\n" + "new line\n" * 10_000)
    assert path.read_text(encoding="utf-8") == OLD
    assert leftovers(path.parent) == []


def test_no_reader_ever_sees_a_partial_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Until the rename the old file is whole; right after it the new one is whole."""
    real_replace = os.replace
    observed: list[str] = []

    def replace(src: str, dst: Any) -> None:
        observed.append(Path(dst).read_text(encoding="utf-8"))  # what a reader sees before
        assert Path(src).read_bytes().endswith(b"end\n")  # the new data is complete, synced
        real_replace(src, dst)
        observed.append(Path(dst).read_text(encoding="utf-8"))

    monkeypatch.setattr(os, "replace", replace)
    new = "# Memory\n" + "x" * 200_000 + "\nend\n"
    write_curated(path, new)
    assert observed == [OLD, new]


def test_write_keeps_the_file_mode_and_writes_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "memory.md"
    real.parent.mkdir()
    real.write_text(OLD)
    os.chmod(real, 0o640)
    link = tmp_path / "MEMORY.md"
    link.symlink_to(real)
    write_curated(link, "linked")
    assert link.is_symlink()
    assert real.read_text() == "linked\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


def test_reading_tolerates_missing_unreadable_and_huge_files(tmp_path: Path) -> None:
    assert read_curated(tmp_path / "nope.md").text == ""
    directory = tmp_path / "dir.md"
    directory.mkdir()
    broken = read_curated(directory)
    assert broken.text == ""
    assert broken.error is not None
    huge = tmp_path / "huge.md"
    huge.write_bytes(("line of memory ü\n" * 100_000).encode())
    got = read_curated(huge, max_bytes=10_000)
    assert got.truncated
    assert len(got.text.encode()) < 10_000 + 200
    assert got.text.endswith("only the first 9990 are read; the owner can shorten it]")
    assert "ü\n[... MEMORY.md continues: it has 1800000 bytes" in got.text  # whole lines
    binary = tmp_path / "binary.md"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    assert read_curated(binary).text == "\ufffd\ufffdgarbage\n"


def test_curated_file_rereads_only_when_the_file_changes(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = CuratedFile(path)
    reads: list[Path] = []
    real = curated.read_curated

    def counting(p: Path, **kw: Any) -> curated.Curated:
        reads.append(p)
        return real(p, **kw)

    monkeypatch.setattr(curated, "read_curated", counting)
    assert file.read().text == OLD
    assert file.read().text == OLD
    assert len(reads) == 1
    file.write("edited")  # a new inode: seen at once
    assert file.read().text == "edited\n"
    assert len(reads) == 2
    path.unlink()
    assert file.read().text == ""


def test_memory_write_append_and_limits(path: Path) -> None:
    file = CuratedFile(path)
    assert memory_write(file, "- likes green tea", mode="append").startswith("MEMORY.md updated")
    assert path.read_text() == OLD + "- likes green tea\n"
    with pytest.raises(CuratedError, match="at most"):
        memory_write(file, "x" * (curated.MAX_WRITE_CHARS + 1))
    with pytest.raises(CuratedError, match="mode"):
        memory_write(file, "x", mode="overwrite")
    path.write_bytes(b"y" * (curated.MAX_READ_BYTES + 10))
    with pytest.raises(CuratedError, match="cannot be appended"):
        memory_write(file, "more", mode="append")
    assert memory_write(file, "# fresh").startswith("MEMORY.md replaced")


# -- owner only ----------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def turn(tmp_path: Path, store: MemoryStore, privacy: Privacy) -> TurnContext:
    cfg = Config(home=tmp_path, memory=MemoryConfig(workspace=tmp_path / "workspace"))
    conversation = "cli:home" if privacy is Privacy.OWNER else f"matrix:{privacy.value}"
    msg = InboundMessage(
        channel=conversation.split(":", maxsplit=1)[0],
        session=conversation,
        conversation=conversation,
        sender="someone",
        privacy=privacy,
        text="hi",
        ts=1.0,
        event_id="e1",
    )
    return TurnContext(
        stream_id="1-0",
        msg=msg,
        scope=Scope(conversation, privacy),
        memory=Memory(store, memory_settings(cfg)),
    )


def test_memory_write_is_offered_only_in_the_owners_conversations(
    tmp_path: Path, store: MemoryStore, path: Path
) -> None:
    owner = ToolRegistry(memory_tools(turn(tmp_path, store, Privacy.OWNER)))
    assert "memory_write" in owner
    assert owner.call("memory_write", {"content": "# Memory\n- owner is in Lisbon"}).startswith(
        "MEMORY.md replaced"
    )
    assert path.read_text() == "# Memory\n- owner is in Lisbon\n"
    for privacy in (Privacy.DIRECT, Privacy.GROUP):
        names = ToolRegistry(memory_tools(turn(tmp_path, store, privacy))).names
        assert "memory_write" not in names
        assert {"remember", "recall"} <= set(names)
        assert curated_tools(turn(tmp_path, store, privacy)) == []
