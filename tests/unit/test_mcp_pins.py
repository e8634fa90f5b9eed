"""The pins of MCP servers as files (worker/mcp_pins.py): written whole and private, read back
as written, and a file that is not a readable pin of that server is a PinError, never None
(which the hub would take for a first sight and overwrite)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from worker.mcp_pins import PinStore
from worker.mcp_rules import ListedTool, Pin, PinError, listing_digest, pin_of

TOOLS = [
    ListedTool("echo", "Says the text back.", {"type": "object", "properties": {"text": {}}}),
    ListedTool("send", "Sends the text.", {"type": "object"}),
]


def test_no_file_is_no_pin_and_a_written_pin_reads_back(tmp_path: Path) -> None:
    store = PinStore(tmp_path / "mcp" / "pins")
    assert store.read("files") is None
    pin = pin_of("files", TOOLS)
    store.write(pin)  # the folder is made on the first write
    assert store.read("files") == pin
    path = tmp_path / "mcp" / "pins" / "files.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == ["files.json"]  # no temporary file left behind


def test_a_write_replaces_the_pin_whole(tmp_path: Path) -> None:
    store = PinStore(tmp_path)
    store.write(pin_of("files", TOOLS))
    store.write(pin_of("files", TOOLS[:1]))
    assert store.read("files") == pin_of("files", TOOLS[:1])
    assert sorted(os.listdir(tmp_path)) == ["files.json"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"{not json", "not JSON"),
        (b'{"version": 9, "server": "files", "tools": {}}', "not a version 1 pin"),
        (b'{"version": 1, "server": "files", "tools": {"echo": 3}}', "not text"),
        (b'{"version": 1, "server": "mail", "tools": {}}', "the pin of another server"),
        (b"\xff\xfe not utf-8", "cannot be read"),
    ],
)
def test_a_file_that_is_not_a_pin_of_that_server_is_an_error_not_none(
    tmp_path: Path, content: bytes, words: str
) -> None:
    (tmp_path / "files.json").write_bytes(content)
    with pytest.raises(PinError, match=words):
        PinStore(tmp_path).read("files")


def test_a_pin_folder_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "files.json").mkdir()  # a directory where the pin should be
    with pytest.raises(PinError, match="cannot be read"):
        PinStore(tmp_path).read("files")


def test_a_name_that_is_not_a_server_name_never_becomes_a_path(tmp_path: Path) -> None:
    store = PinStore(tmp_path / "pins")
    for name in ("../escape", "a/b", "", "UPPER"):
        with pytest.raises(ValueError, match=r"server name|name is empty"):
            store.read(name)
        with pytest.raises(ValueError, match=r"server name|name is empty"):
            store.write(Pin(name, {}))
    assert not (tmp_path / "escape.json").exists()


def test_the_listing_digest_ignores_order_and_sees_a_change() -> None:
    assert listing_digest(TOOLS) == listing_digest(list(reversed(TOOLS)))
    changed = [TOOLS[0], ListedTool("send", "Sends the text. And a copy.", {"type": "object"})]
    assert listing_digest(changed) != listing_digest(TOOLS)
    assert len(listing_digest(TOOLS)) == 64
