"""``[owner] timezone`` (issue 26): the model's context and the clock tool show the owner's
time, with its offset, not UTC while the terminal shows local time. The zone is the configured
one, else the system's (TZ, the /etc/localtime symlink, /etc/timezone, else UTC), and doctor says
which."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract import timezone
from contract.config import Config, ConfigError, load_config
from contract.messages import InboundMessage, Privacy
from memory.store import MemoryStore
from relaybot.doctor import diagnose
from tests.support.worker import handle_entries
from worker.main import TurnTools, assemble
from worker.model import Completion, ToolCall
from worker.tools import ToolRegistry, clock_tool
from worker.turn import Turns

WINTER = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
SUMMER = 1_784_000_000.0  # 2026-07-14 03:33:20 UTC


def test_a_time_is_shown_with_its_offset() -> None:
    berlin = timezone.zone_info("Europe/Berlin")
    assert timezone.stamp(WINTER, berlin) == "2026-11-18 12:06 +01:00"
    assert timezone.stamp(SUMMER, berlin) == "2026-07-14 05:33 +02:00"
    assert timezone.stamp(WINTER, timezone.zone_info("America/St_Johns")) == (
        "2026-11-18 07:36 -03:30"
    )
    assert timezone.stamp(WINTER) == "2026-11-18 11:06 UTC"  # as before
    assert timezone.stamp(WINTER, timezone.zone_info("Etc/UTC")) == "2026-11-18 11:06 UTC"
    assert timezone.stamp(1e300, berlin) == "unknown time"


def test_the_zone_comes_from_config_then_tz_then_the_system(tmp_path: Path) -> None:
    link = tmp_path / "localtime"
    link.symlink_to("../usr/share/zoneinfo/America/Chicago")
    named = tmp_path / "timezone"
    named.write_text("Asia/Tokyo\n")
    none = tmp_path / "absent"

    def zone(configured: str | None, env: dict[str, str], lt: Path, tzf: Path) -> tuple[str, str]:
        z = timezone.resolve(configured, env, localtime=lt, timezone_file=tzf)
        return z.name, z.source

    assert zone("Europe/Lisbon", {"TZ": "Asia/Tokyo"}, link, named) == ("Europe/Lisbon", "config")
    assert zone(None, {"TZ": ":Europe/Paris"}, link, named) == ("Europe/Paris", "TZ")
    assert zone(None, {}, link, named) == ("America/Chicago", str(link))
    assert zone(None, {}, none, named) == ("Asia/Tokyo", str(named))
    assert zone(None, {}, none, none) == ("UTC", "default")
    odd = timezone.resolve(None, {"TZ": "CET-1CEST"}, localtime=link, timezone_file=none)
    assert (odd.name, odd.source) == ("America/Chicago", str(link))
    assert "TZ='CET-1CEST' is not an IANA zone name" in odd.describe()
    posix = tmp_path / "posix"
    posix.symlink_to("/usr/share/zoneinfo/posix/Europe/Oslo")
    assert zone(None, {}, posix, none) == ("Europe/Oslo", str(posix))


def test_an_unknown_zone_is_a_one_line_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[owner]\ntimezone = "Europe/Berln"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, env={})
    text = str(caught.value)
    assert "owner.timezone" in text and "unknown time zone 'Europe/Berln'" in text
    assert "did you mean 'Europe/Berlin'?" in text and "\n" not in text
    with pytest.raises(ConfigError, match="an IANA name such as"):
        load_config(tmp_path, env={"RELAYBOT_TIMEZONE": "Nowhere/At_All"})
    (tmp_path / "config.toml").write_text("")
    assert load_config(tmp_path, env={"RELAYBOT_TIMEZONE": "Asia/Tokyo"}).owner.timezone == (
        "Asia/Tokyo"
    )


def test_doctor_says_which_zone_and_where_from(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[owner]\ntimezone = "Asia/Tokyo"\n')
    report = diagnose(tmp_path, timeout=0.5, env={"RELAYBOT_DOTENV": ""})
    [check] = [c for c in report.checks if c.id == "config.timezone"]
    assert check.summary == "times are shown in Asia/Tokyo (from [owner] timezone)"
    (tmp_path / "config.toml").write_text("")
    report = diagnose(tmp_path, timeout=0.5, env={"TZ": "Europe/Paris"})
    [check] = [c for c in report.checks if c.id == "config.timezone"]
    assert check.summary == "times are shown in Europe/Paris (from TZ)"


def test_the_clock_answers_in_the_owners_zone() -> None:
    fixed = datetime(2025, 1, 15, 12, 30, 45, tzinfo=UTC)
    clock = ToolRegistry([clock_tool(lambda: fixed, owner_zone=timezone.zone_info("Asia/Tokyo"))])
    assert clock.call("clock", {}) == (
        "2025-01-15T21:30:45+09:00 (Wednesday, Asia/Tokyo); UTC 2025-01-15T12:30:45+00:00"
    )
    assert clock.call("clock", {"timezone": "UTC"}).startswith("2025-01-15T12:30:45+00:00")
    utc = ToolRegistry([clock_tool(lambda: fixed, owner_zone=timezone.zone_info("UTC"))])
    assert utc.call("clock", {}) == "2025-01-15T12:30:45+00:00 (Wednesday, UTC)"


class ClockThenEcho:
    """Asks for the clock once, then answers with what the system message and the tool said."""

    name = "clock-then-echo"

    def __init__(self) -> None:
        self.seen: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        self.seen.append(messages)
        if messages[-1]["role"] != "tool":
            return Completion(tool_calls=[ToolCall(id="c1", name="clock")])
        return Completion(content="ok", finish_reason="stop")

    def close(self) -> None:
        pass


def test_the_context_and_the_clock_of_a_turn_use_the_owners_zone(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[owner]\ntimezone = "Asia/Tokyo"\n')
    cfg = load_config(tmp_path, env={})
    r = fakeredis.FakeRedis()
    model = ClockThenEcho()
    store = MemoryStore(tmp_path / "memory.sqlite3")
    try:
        consumer = assemble(cfg, r, Turns(cfg, store, model, TurnTools()))
        assert consumer.acquire(wait=False)
        consumer.reader.ensure_group()
        for n, ts in enumerate((WINTER, WINTER + 60)):
            msg = InboundMessage(
                channel="cli", session="cli:t", conversation="cli:t", sender="ada",
                privacy=Privacy.OWNER, text=f"message {n}", ts=ts, event_id=f"ev-{n}",
            )  # fmt: skip
            r.xadd(cfg.keys.inbound, msg.to_fields())  # type: ignore[arg-type]
            while entries := consumer.reader.read(block_ms=None):  # type: ignore[arg-type]
                handle_entries(consumer, entries)
        consumer.lease.release()
    finally:
        store.close()
    last = model.seen[-1]  # the second turn, after its clock call
    system, user = last[0]["content"], last[1]["content"]
    assert "[cli / owner] 2026-11-18 20:06 +09:00: message 0" in system
    assert user == "[cli / owner] 2026-11-18 20:07 +09:00: message 1"
    assert "UTC:" not in system
    assert ", Asia/Tokyo); UTC " in last[-1]["content"]


def test_utc_is_unchanged(tmp_path: Path) -> None:
    cfg = Config.model_validate({"home": tmp_path, "owner": {"timezone": "UTC"}})
    assert timezone.resolve(cfg.owner.timezone).info is UTC
