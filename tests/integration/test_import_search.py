"""After a zero-config ``relaybot memory import``, ``relaybot memory search`` finds the imported
messages at once (issue 26): the import indexes its rows for full-text search in its own
transaction, on the worker (the one writer), before the command answers. It used to leave that to
the worker's next idle moment, which a zero-config import, stopping its worker at once, never
reached: search found nothing until the next worker run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.procs import relaybot_env, run_relaybot

pytestmark = pytest.mark.integration


def line(role: str, content: str, ts: str, sender: str) -> str:
    return json.dumps({"role": role, "content": content, "timestamp": ts, "channel": "cli",
                       "sender_id": sender})  # fmt: skip


def test_a_zero_config_import_is_searchable_at_once(tmp_path: Path) -> None:
    env = relaybot_env(tmp_path / "home")  # no Redis, no model: the embedded Redis, started
    history = tmp_path / "history.jsonl"
    history.write_text(
        line("user", "the zebra crossing on Elm street is closed", "2026-02-24T10:00:00Z", "ada")
        + "\n"
        + line("assistant", "noted: take the bridge", "2026-02-24T10:00:05Z", "squidbot")
        + "\n",
        encoding="utf-8",
    )
    imported = run_relaybot(["memory", "import", str(history)], env, timeout=90)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert "added:           log 2" in imported.stdout
    found = run_relaybot(["memory", "search", "zebra", "--json"], env, timeout=60)
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)
    texts = json.dumps(hits)
    assert "the zebra crossing on Elm street is closed" in texts, found.stdout
    found = run_relaybot(["memory", "search", "bridge"], env, timeout=60)
    assert "noted: take the bridge" in found.stdout, found.stdout
