"""The channel registry (contract/channels.py): one list of channels, read by every central
table, and a channel none of them knows is an error, never a default (issue 25)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import fakeredis
import pytest

from contract import channels as registry
from contract.channels import Channel, UnknownChannel
from contract.config import Config, ConfigError, env_overrides, parse_config
from contract.config_watch import gateway_uses, worker_uses
from contract.keys import Keys
from deploy import acl
from gateways.lease import account_of
from gateways.runner import Runtime, watcher
from relaybot.doctor_redis import role_probes, roles_of
from tests.support.channels import write_dist

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_channels_are_registered_through_entry_points() -> None:
    assert registry.names() == ("cli", "matrix", "email")
    assert all(isinstance(ch, Channel) for ch in registry.channels())
    assert registry.channel("matrix").section is not None


def test_an_unknown_channel_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(UnknownChannel, match=r"'telegram': the channels are cli, matrix, email"):
        registry.channel("telegram")


def test_role_probes_of_an_unknown_channel_is_an_error_not_the_workers() -> None:
    keys = Keys()
    assert role_probes(keys, "matrix") != role_probes(keys, "worker")
    with pytest.raises(UnknownChannel):
        role_probes(keys, "telegram")


def test_roles_of_an_unknown_channels_user_is_an_error_not_every_role(tmp_path: Path) -> None:
    cfg = Config(home=tmp_path)
    assert roles_of("relaybot-matrix", cfg) == ["matrix"]
    assert roles_of("relaybot-jobs", cfg) == ["jobs"]
    assert roles_of("default", cfg) == ["worker", "jobs", "cli"]  # nothing else configured
    with pytest.raises(UnknownChannel):
        roles_of("relaybot-telegram", cfg)


def test_the_workers_acl_probe_reads_every_registered_channels_stream(
    fake_channel: Channel,
) -> None:
    keys = Keys()
    (script,) = [p for p in role_probes(keys, "worker") if p[0] == "EVAL"]
    streams = script[3:]
    assert streams == (
        keys.inbound,
        *(keys.inbound_of(c) for c in ("cli", "matrix", "email", "fake")),
    )


def test_the_config_watcher_refuses_an_unknown_channel(tmp_path: Path) -> None:
    assert gateway_uses("email")[0] == ("redis", "delivery", "owner.aliases", "email")
    with pytest.raises(UnknownChannel):
        gateway_uses("telegram")
    cfg = Config(home=tmp_path)
    rt = Runtime("telegram", fakeredis.FakeRedis(), cfg.keys)
    with pytest.raises(UnknownChannel):
        watcher(rt, cfg, None)


def test_an_unknown_section_stays_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="telegram"):
        parse_config(b"[telegram]\ntoken = 'x'\n", tmp_path, {})


def test_the_channels_sections_and_variables_come_from_their_specs(tmp_path: Path) -> None:
    cfg = parse_config(b"[matrix]\nowners = ['@ada:hs']\n", tmp_path, {})
    assert cfg.matrix.owners == ["@ada:hs"]  # type: ignore[attr-defined]
    assert ("RELAYBOT_MATRIX_USER_ID", "matrix", "user_id") in env_overrides()
    assert "matrix.owners" in worker_uses()
    assert any(a.channel == "matrix" for a in cfg.owner_aliases if not isinstance(a, str))


def test_a_lease_is_per_channel_and_per_account(tmp_path: Path) -> None:
    one = parse_config(b"[matrix]\nuser_id = '@a:hs'\n", tmp_path, {})
    two = parse_config(b"[matrix]\nuser_id = '@b:hs'\n", tmp_path, {})
    keys = Keys()
    assert keys.gateway_lease("matrix", account_of(one, "matrix")) != keys.gateway_lease(
        "matrix", account_of(two, "matrix")
    )
    with pytest.raises(UnknownChannel):
        account_of(one, "telegram")
    with pytest.raises(ValueError, match="names no account"):
        account_of(one, "cli")  # the terminal takes no lease


def test_the_shipped_acl_file_is_the_generated_one() -> None:
    """deploy/redis/users.acl is `python -m deploy.acl` (regenerate it after changing a spec)."""
    assert (ROOT / "deploy" / "redis" / "users.acl").read_text() == acl.render()


def test_a_registered_channel_gets_its_acl_line(fake_channel: Channel) -> None:
    assert "relaybot-fake" not in acl.render()  # it has no ACL rules
    assert registry.names()[-1] == "fake"


def test_loading_the_registry_imports_no_platform_client() -> None:
    code = (
        "import sys; from contract import channels as c; from contract.config import Config; "
        "c.channels(); Config; "
        "print(sorted(m for m in ('nio', 'aioimaplib', 'aiosmtplib', 'gateways.matrix.gateway', "
        "'gateways.email.gateway') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# -- a package that is broken, or would replace a channel (the adversarial review of issue 25) --

EVIL = Channel(name="matrix", title="another matrix", account=lambda _section: "x")
NAMED_WRONG = Channel(name="cli", title="a spec naming another channel")


def _raises() -> None:
    raise RuntimeError("boom at import")


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Callable[[str, dict[str, str]], None]]:
    """Install packages of channels for one test (sys.path first, as PYTHONPATH would)."""
    added: list[str] = []

    def install(dist: str, entries: dict[str, str]) -> None:
        where = write_dist(tmp_path / dist, dist, entries)
        sys.path.insert(0, str(where))
        added.append(str(where))
        registry.forget()

    yield install
    for where in added:
        sys.path.remove(where)
    registry.forget()


@pytest.mark.parametrize(
    ("entries", "said"),
    [
        ({"telegram": "relaybot_telegram_missing:CHANNEL"}, "ModuleNotFoundError"),
        ({"telegram": f"{__name__}:NO_SUCH_SPEC"}, "AttributeError"),
        ({"telegram": f"{__name__}:_raises"}, "is not a contract.channels.Channel"),
        ({"telegram": f"{__name__}:NAMED_WRONG"}, "declares the channel 'cli'"),
        ({"bad:name": f"{__name__}:NAMED_WRONG"}, "not a channel name"),
    ],
)
def test_a_broken_package_is_left_out_and_said_and_the_rest_still_work(
    installed: Callable[[str, dict[str, str]], None], entries: dict[str, str], said: str
) -> None:
    installed("broken", entries)
    assert registry.names() == ("cli", "matrix", "email")
    (reason,) = registry.refused()
    assert said in reason and next(iter(entries)) in reason
    with pytest.raises(UnknownChannel, match=said if "telegram" in entries else "unknown"):
        registry.channel(next(iter(entries)))


def test_a_package_cannot_replace_one_of_relaybots_channels(
    installed: Callable[[str, dict[str, str]], None],
) -> None:
    installed("shadow", {"matrix": f"{__name__}:EVIL"})
    assert registry.channel("matrix").title != EVIL.title
    assert registry.channel("matrix").gateway.startswith("gateways.matrix.")
    (reason,) = registry.refused()
    assert "'matrix'" in reason and "declared more than once" in reason and "shadow" in reason


def test_a_channel_two_packages_declare_is_left_out(
    installed: Callable[[str, dict[str, str]], None],
) -> None:
    installed("one", {"fake": "tests.support.channels:FAKE"})
    installed("two", {"fake": f"{__name__}:FAKE_TWO"})
    assert "fake" not in registry.names()
    assert len(registry.refused()) == 2
    with pytest.raises(UnknownChannel, match="declared more than once"):
        registry.channel("fake")


FAKE_TWO = Channel(name="fake", title="another fake")


def test_relaybot_version_and_help_work_with_a_broken_package(tmp_path: Path) -> None:
    where = write_dist(tmp_path / "site", "broken", {"telegram": "relaybot_missing:CHANNEL"})
    env = {**os.environ, "PYTHONPATH": str(where), "RELAYBOT_DOTENV": ""}
    for args in (["--version"], ["--help"]):
        proc = subprocess.run(
            [sys.executable, "-m", "relaybot", *args], env=env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("prefix", ["", "my bot:"])
def test_the_acl_generator_refuses_a_prefix_no_key_pattern_can_hold(
    prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        acl.main(["--prefix", prefix])
    assert exit_.value.code == 2
    assert "no whitespace" in capsys.readouterr().err


def test_doctor_says_which_package_was_left_out(
    installed: Callable[[str, dict[str, str]], None], tmp_path: Path
) -> None:
    from relaybot import doctor

    installed("shadow", {"matrix": f"{__name__}:EVIL"})
    checks, _cfg, _digest = doctor.load(tmp_path, {})
    (check,) = [c for c in checks if c.id == "channels.packages"]
    assert check.verdict.value == "fail" and "'matrix'" in check.summary
