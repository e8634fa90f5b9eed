"""The owner's name written by `relaybot onboard` reaches the model's system prompt (issue 13)."""

from __future__ import annotations

from pathlib import Path

import fakeredis

from contract.config import DEFAULT_SYSTEM_PROMPT, Config, load_config
from contract.messages import InboundMessage, Privacy
from memory.store import MemoryStore
from tests.support.fakes import InstantModel
from tests.support.worker import handle_entries
from worker.main import assemble
from worker.tools import default_tools
from worker.turn import Turns


def test_the_owner_name_is_appended_to_the_default_prompt(tmp_path: Path) -> None:
    cfg = Config.model_validate({"home": tmp_path, "owner": {"name": "Ada Lovelace"}})
    assert cfg.system_prompt.startswith(DEFAULT_SYSTEM_PROMPT)
    assert "The owner's name is Ada Lovelace" in cfg.system_prompt


def test_a_placeholder_places_the_name_and_the_default_name_adds_nothing(tmp_path: Path) -> None:
    cfg = Config.model_validate(
        {
            "home": tmp_path,
            "owner": {"name": "Ada"},
            "worker": {"system_prompt": "Serve {owner_name}."},
        }
    )
    assert cfg.system_prompt == "Serve Ada."
    assert Config(home=tmp_path).system_prompt == DEFAULT_SYSTEM_PROMPT


def test_a_turn_sends_the_name_written_in_config_toml_to_the_model(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[owner]\nname = "Ada"\n[redis]\nprefix = "rb:"\n')
    cfg = load_config(tmp_path, env={})
    r = fakeredis.FakeRedis()
    model = InstantModel()
    store = MemoryStore(tmp_path / "memory.sqlite3")
    try:
        consumer = assemble(cfg, r, Turns(cfg, store, model, default_tools()))
        assert consumer.acquire(wait=False)
        consumer.reader.ensure_group()
        msg = InboundMessage.model_validate(
            dict(
                channel="cli",
                session="cli:t",
                conversation="cli:t",
                sender="ada",
                privacy=Privacy.OWNER,
                text="who am I?",
                ts=1.0,
                event_id="ev-1",
            )
        )
        r.xadd(cfg.keys.inbound, msg.to_fields())  # type: ignore[arg-type]
        while entries := consumer.reader.read(block_ms=None):  # type: ignore[arg-type]
            handle_entries(consumer, entries)
        consumer.lease.release()
    finally:
        store.close()
    assert model.seen, "the model was not asked"
    system = model.seen[0][0]
    assert system["role"] == "system"
    assert "The owner's name is Ada" in system["content"]
