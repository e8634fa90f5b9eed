"""``relaybot doctor``'s pure verdicts: persistence, versions, config keys, permissions, the
processes' heartbeats and what "unused" means; and that a broken probe or a stuck host costs one
check, never the whole run."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from contract.config import Config
from gateways.email.doctor import owner_auth
from relaybot import doctor
from relaybot.doctor_liveness import processes, unused
from relaybot.doctor_verdict import (
    Verdict,
    config_digest,
    disk_space,
    exit_code,
    fail,
    model_exists,
    ok,
    permissions,
    persistence,
    redis_version,
    skipped,
    tool_call,
    unknown_keys,
    warn,
)

F, W, OK = Verdict.FAIL, Verdict.WARN, Verdict.OK


@pytest.mark.parametrize(
    ("version", "appendonly", "appendfsync", "verdict"),
    [
        ("6.2.14", "yes", "always", OK),  # the embedded Redis
        ("6.2.14", "yes", "everysec", F),  # no WAITAOF: a power cut loses accepted entries
        ("7.2.4", "yes", "everysec", OK),  # WAITAOF waits for the fsync
        ("7.4.0", "yes", "no", F),  # never fsyncs: WAITAOF would never confirm
        ("7.4.0", "no", "always", F),
        ("7.4.0", None, None, W),  # a gateway's ACL user may not read CONFIG
    ],
)
def test_persistence_follows_the_readme(
    version: str, appendonly: str | None, appendfsync: str | None, verdict: Verdict
) -> None:
    check = persistence(version, appendonly, appendfsync, embedded=False)
    assert check.verdict is verdict, check
    if verdict is not OK:
        assert "deploy/README.md" in check.hint


def test_versions() -> None:
    assert redis_version("redis", "6.0.9").verdict is F  # no LMOVE
    assert redis_version("valkey", "8.0.1").verdict is OK
    assert "no WAITAOF" in redis_version("redis", "6.2.14").summary


def test_unknown_keys_name_the_key_and_the_closest_known_one() -> None:
    data = {
        "matrix": {"homserver": "x", "rooms": {"!r:hs": {"polcy": "open"}}},
        "roles": {"cli:work": {"role": "pm", "projekt": "a"}},
        "turns": {"channels": {"email": "followup"}},  # names the owner chooses: not keys
        "modle": {},
    }
    found = unknown_keys(data, Config)
    assert (("matrix", "homserver"), "homeserver") in found
    assert (("matrix", "rooms", "!r:hs", "polcy"), "policy") in found
    assert (("roles", "cli:work", "projekt"), "project") in found
    assert (("modle",), "model") in found
    assert len(found) == 4


def test_mcp_servers_are_names_the_owner_chooses_and_their_keys_are_checked() -> None:
    """``[mcp.servers.NAME]``: NAME is not a key (doctor failed config.keys on every configured
    MCP server, saying every process would refuse to start); a typo inside one is found."""
    data = {"mcp": {"result_chars": 900, "servers": {
        "files": {"command": ["srv"], "env": {"ANY_NAME": "x"}, "audiences": ["owner"]},
        "weather": {"url": "http://h:1/mcp", "headers": {"X-Key": "k"}, "timout": 3},
    }}}  # fmt: skip
    assert unknown_keys(data, Config) == [(("mcp", "servers", "weather", "timout"), "timeout")]


def test_a_config_with_a_typo_still_runs_the_other_checks(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[model]\nbase_url = "http://m/v1"\nmodle = "x"\n')
    checks, cfg, digest = doctor.load(tmp_path, {"RELAYBOT_MODEL": "llama"})
    assert [c.verdict for c in checks] == [OK, F]
    assert "model.modle (did you mean model.model?)" in checks[1].summary
    assert cfg is not None and cfg.model.model == "llama"  # the environment still applies
    assert digest == config_digest((tmp_path / "config.toml").read_bytes())

    (tmp_path / "config.toml").write_text('[model]\ntimeout = "soon"\n')
    checks, cfg, _ = doctor.load(tmp_path, {})
    assert cfg is None and checks[-1].id == "config.values" and checks[-1].verdict is F


def test_permissions_put_memory_first_and_say_how_to_fix(tmp_path: Path) -> None:
    home = tmp_path / "home"
    modes = {
        home: stat.S_IFDIR | 0o700,
        home / "logs" / "worker.log": stat.S_IFREG | 0o640,
        home / "memory.sqlite3": stat.S_IFREG | 0o644,
        home / "config.toml": stat.S_IFREG | 0o600,
    }
    check = permissions(home, modes)
    assert check.verdict is F
    assert check.summary.startswith(f"readable by others: {home / 'memory.sqlite3'} (-rw-r--r--)")
    assert check.hint == f"chmod -R go-rwx {home}"
    elsewhere = {**modes, Path("/srv/mem.sqlite3"): stat.S_IFREG | 0o604}
    assert permissions(home, elsewhere).hint == f"chmod -R go-rwx /srv/mem.sqlite3 {home}"
    tight = {p: m & ~0o077 for p, m in modes.items()}
    assert permissions(home, tight).verdict is OK


def test_disk_space_thresholds(tmp_path: Path) -> None:
    gib = 1024**3
    assert disk_space(tmp_path, 100 * 1024**2, 100 * gib).verdict is F
    assert disk_space(tmp_path, gib // 2, 100 * gib).verdict is W
    assert disk_space(tmp_path, 3 * gib, 100 * gib).verdict is W  # under 5 %
    assert disk_space(tmp_path, 30 * gib, 100 * gib).verdict is OK


def test_processes_show_their_config_and_whether_it_is_current() -> None:
    now = time.time()
    beats = {
        "worker": {"ts": now, "pid": 1, "host": "h", "config": "aaaaaaaaaaaa"},
        "gateway:matrix": {"ts": now, "pid": 2, "host": "h", "config": "bbbbbbbbbbbb"},
        "gateway:email": {"ts": now, "pid": 3, "host": "h", "config": "aaaaaaaaaaaa",
                          "restart_needed": True},
        "jobs": {"ts": now - 120, "pid": 4, "host": "h"},
        "gateway:cli:ada": {"ts": now, "pid": 5, "host": "h"},  # before the config field
    }  # fmt: skip
    beats["gateway:matrix:standby"] = {"ts": now, "pid": 6, "host": "vps", "config": "cccccccccccc"}
    by_id = {c.id: c for c in processes(beats, now, "aaaaaaaaaaaa", "h")}
    assert by_id["processes.worker"].verdict is OK
    assert "aaaaaaaaaaaa (current)" in by_id["processes.worker"].summary
    assert by_id["processes.gateway:matrix"].verdict is W
    assert "runs an older config" in by_id["processes.gateway:matrix"].summary
    assert "restart gateway:matrix" in by_id["processes.gateway:matrix"].hint
    assert by_id["processes.gateway:email"].verdict is W  # says it needs a restart
    assert by_id["processes.jobs"].verdict is W and "120 s ago" in by_id["processes.jobs"].summary
    assert by_id["processes.gateway:cli:ada"].verdict is OK
    other_host = by_id["processes.gateway:matrix:standby"]  # its own host's config.toml
    assert other_host.verdict is OK and "not compared" in other_host.summary
    assert [c.id for c in processes({}, now, "x", "h")] == ["processes.worker"]  # a warning


def test_unused_sections(tmp_path: Path) -> None:
    now = time.time()
    cfg = Config.model_validate(
        {
            "home": tmp_path,
            "matrix": {"homeserver": "https://hs", "user_id": "@bot:hs"},
            "email": {"smtp_host": "smtp.example.org"},  # no imap_host: stays off
            "model": {"base_url": "http://m/v1"},  # no model
        }
    )
    check = unused(cfg, {"worker": {"ts": now}}, now)
    assert check.verdict is W
    assert "[matrix] is configured but no matrix gateway runs" in check.summary
    assert "[email] has settings but no imap_host" in check.summary
    assert "[model] has no model" in check.summary
    idle = {"gateway:matrix": {"ts": now, "state": "not configured"}}
    assert "its gateway idles" in unused(cfg, idle, now).summary
    fine = Config.model_validate({"home": tmp_path, "matrix": {"owners": ["@ada:hs"]}})
    assert unused(fine, {}, now).verdict is OK  # matrix.owners are owner aliases, used anyway


def test_model_verdicts() -> None:
    missing = model_exists("llama3.1", ["llama3.1:8b", "qwen2.5"])
    assert missing.verdict is F and missing.hint.startswith('set [model] model = "llama3.1:8b"')
    called = {"choices": [{"message": {"tool_calls": [
        {"function": {"name": "report_status", "arguments": '{"status": "ok"}'}}]}}]}  # fmt: skip
    assert tool_call("report_status", called).verdict is OK
    text = {"choices": [{"message": {"content": "ok!"}}]}
    assert tool_call("report_status", text).verdict is W


def test_exit_code_fails_only_on_failures() -> None:
    assert exit_code([ok("a.b", "x"), warn("a.c", "y", "z")]) == 0
    assert exit_code([ok("a.b", "x"), fail("a.c", "y", "z")]) == 1


def test_a_stuck_or_broken_group_is_one_failed_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead host must not hang doctor, and one broken probe must not stop the others."""
    import threading

    from gateways.email import doctor as email_doctor
    from gateways.matrix import doctor as matrix_doctor

    release = threading.Event()

    def stuck(cfg: Config, timeout: float, add: object) -> None:
        release.wait(30)

    def broken(cfg: Config, timeout: float, add: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(matrix_doctor, "matrix_group", stuck)
    monkeypatch.setattr(email_doctor, "email_group", broken)
    monkeypatch.setitem(doctor.BUDGET, "matrix", 0.2)  # x timeout: the stuck one gives up soon
    try:
        report = doctor.diagnose(tmp_path, timeout=1.0, env={})
    finally:
        release.set()
    by_id = {c.id: c for c in report.checks}
    assert by_id["matrix.timeout"].verdict is F
    assert by_id["email.error"].verdict is F and "boom" in by_id["email.error"].summary
    assert by_id["disk.space"].verdict is not Verdict.SKIPPED  # the others ran
    assert by_id["model.configured"].verdict is W  # not configured


def test_render_and_json(tmp_path: Path) -> None:
    report = doctor.Report(tmp_path, "abc")
    report.checks = [
        ok("redis.reachable", "answered"),
        fail("redis.acl", "refused XADD", "give the user its keys"),
        skipped("model.tools", "no model"),
    ]
    text = doctor.render(report)
    assert f"RELAYBOT_HOME {tmp_path}" in text.splitlines()[0]
    assert "  FAIL  redis.acl        refused XADD" in text
    assert "-> give the user its keys" in text
    assert text.endswith("1 ok, 0 warning(s), 1 failure(s), 1 skipped (exit 1)")
    out = doctor.as_json(report)
    assert out["exit_code"] == 1 and out["config_digest"] == "abc"
    assert out["checks"][1] == {
        "id": "redis.acl", "group": "redis", "verdict": "fail", "summary": "refused XADD",
        "hint": "give the user its keys", "details": {},
    }  # fmt: skip


def test_a_memory_database_linked_to_a_readable_file_is_found(tmp_path: Path) -> None:
    from contract.config import Config
    from relaybot.doctor import modes

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    elsewhere = tmp_path / "shared" / "memory.sqlite3"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"")
    elsewhere.chmod(0o644)
    (home / "memory.sqlite3").symlink_to(elsewhere)
    found = modes(Config(home=home))
    assert stat.S_IMODE(found[home / "memory.sqlite3"]) == 0o644
    assert permissions(home, found).verdict == "fail"


def test_the_owners_mail_refused_as_unauthenticated_is_a_warning_with_the_fix() -> None:
    """Issue 24, item 1: doctor shows the last mail from the owner's addresses that the e-mail
    gateway did not take as the owner's (the record it keeps in Redis), until it is fixed."""
    now = 10_000.0
    record = {
        "at": now - 7200, "sender": "ada@example.org", "reason": "untrusted",
        "detail": "no Authentication-Results header from a trusted authserv-id",
        "seen": ["mx2.example.org"], "message_id": "<m@example.org>",
    }  # fmt: skip
    check = owner_auth(record, trusted=["mx.example.org"], trust_mailbox=False, hint="H", now=now)
    assert check.verdict is Verdict.WARN and check.hint == "H"
    assert "ada@example.org (2 h ago)" in check.summary and "mx2.example.org" in check.summary
    fixed = owner_auth(record, trusted=["mx2.example.org"], trust_mailbox=False, hint="H", now=now)
    assert fixed.verdict is Verdict.OK and "fixed since" in fixed.summary
    assert owner_auth(None, trusted=["mx"], trust_mailbox=False, hint="", now=now).verdict is (
        Verdict.OK
    )
    nobody = owner_auth(None, trusted=[], trust_mailbox=False, hint="", now=now)
    assert nobody.verdict is Verdict.WARN and "trusted_authserv_ids" in nobody.hint
    no_owner_mail = owner_auth(
        None, trusted=[], trust_mailbox=False, hint="", now=now, owner_addresses=False
    )
    assert no_owner_mail.verdict is Verdict.OK
    failed = {**record, "reason": "failed", "seen": ["mx2.example.org"]}
    still = owner_auth(failed, trusted=["mx2.example.org"], trust_mailbox=False, hint="H", now=now)
    assert still.verdict is Verdict.WARN  # a failed check is not fixed by trusting the server


def test_a_process_whose_config_toml_does_not_load_keeps_its_last_good_one_not_restart() -> None:
    """Its heartbeat carries ``config_error`` (issue 26): doctor does not tell to restart it (a
    restart would refuse to start), it says the process runs its last good config, and why."""
    from relaybot.doctor_liveness import processes

    now = 1_000.0
    error = "/x/config.toml is a directory, not a file: move it"
    beat = {"ts": now - 1, "pid": 1, "host": "h", "config": "3f2a9c1d7b60",
            "restart_needed": False, "restart_keys": [], "config_error": error}  # fmt: skip
    beats = {"worker": beat}
    [check] = [c for c in processes(beats, now, "none", "h") if c.id == "processes.worker"]
    assert check.verdict.value == "warn"
    assert "config 3f2a9c1d7b60 (its last good config; config.toml does not load: /x/config" in (
        check.summary
    )
    assert "restart worker" not in check.hint and "refuse to start" in check.hint
