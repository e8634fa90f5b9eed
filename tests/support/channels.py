"""Installing a channel in a test the way a package is installed: an entry point in the group
``relaybot.channels`` of a ``<name>-0.dist-info`` directory on ``sys.path`` (or PYTHONPATH, for a
process the test starts), found by importlib.metadata like any installed distribution's."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from contract import channels as registry
from contract.channels import Channel

# a channel with no section, no platform, no ACL line: what the runner and lease tests drive
FAKE = Channel(name="fake", title="a fake channel", account=lambda _section: "fake")


def write_dist(where: Path, dist: str, entries: Mapping[str, str]) -> Path:
    """``where/<dist>-0.dist-info`` declaring ``entries`` (channel name -> ``module:attr``)."""
    info = where / f"{dist}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0\n")
    lines = "".join(f"{name} = {ref}\n" for name, ref in entries.items())
    (info / "entry_points.txt").write_text(f"[{registry.GROUP}]\n{lines}")
    return where


@pytest.fixture
def fake_channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Channel]:
    """The channel ``fake`` (:data:`FAKE`) registered for one test."""
    where = write_dist(tmp_path_factory.mktemp("site"), "fake", {"fake": f"{__name__}:FAKE"})
    sys.path.insert(0, str(where))
    registry.forget()
    try:
        yield FAKE
    finally:
        sys.path.remove(str(where))
        registry.forget()
