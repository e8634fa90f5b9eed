"""``relaybot doctor`` against real servers: Redis, our model server, pymap, aiosmtpd, Synapse;
healthy, then broken (wrong passwords, the model missing, Redis down, a world-readable memory,
an unknown config key, an ACL user without its keys, a Redis that does not persist)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from redis.backoff import NoBackoff
from redis.retry import Retry

from contract.config import Config
from contract.keys import Keys
from contract.liveness import beat
from gateways.email import doctor as email_doctor
from gateways.matrix import doctor as matrix_doctor
from relaybot import doctor_model, doctor_redis
from relaybot.doctor_verdict import Check, config_digest
from tests.support.fakemodel import FakeModelServer
from tests.support.mailservers import (
    ImapServer,
    SmtpServer,
    email_config,
    make_message,
    self_signed_cert,
)
from tests.support.procs import (
    Procs,
    relaybot_env,
    run_relaybot,
    wait_for_heartbeat,
    wait_until,
    write_config,
)
from tests.support.servers import RedisServer, acl_redis_binary, free_port
from tests.support.synapse import SynapseServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SMTP_USER, SMTP_PASSWORD = "bot", "smtp-secret"


class _Collect:
    async def handle_DATA(self, _server: Any, _session: Any, _envelope: Any) -> str:
        raise AssertionError("doctor must not send mail")


def _authenticator(_server: Any, _session: Any, _envelope: Any, mechanism: str, auth: Any) -> Any:
    good = isinstance(auth, LoginPassword) and (auth.login, auth.password) == (
        SMTP_USER.encode(),
        SMTP_PASSWORD.encode(),
    )
    return AuthResult(success=good, handled=False)  # handled=False: aiosmtpd answers 535


@pytest.fixture
def smtp_auth() -> Iterator[int]:
    """aiosmtpd with AUTH (over plain text: a loopback test server) that refuses any DATA."""
    port = free_port()
    controller = Controller(
        _Collect(), hostname="127.0.0.1", port=port, authenticator=_authenticator,
        auth_require_tls=False,
    )  # fmt: skip
    controller.start()
    yield port
    controller.stop()


def _config(imap: ImapServer, smtp_port: int, *, imap_password: str, smtp_password: str) -> str:
    return f"""
[owner]
name = "Ada"

[email]
imap_host = "127.0.0.1"
imap_port = {imap.port}
imap_tls = "plain"
imap_user = "{imap.user}"
imap_password = "{imap_password}"
smtp_host = "127.0.0.1"
smtp_port = {smtp_port}
smtp_tls = "plain"
smtp_user = "{SMTP_USER}"
smtp_password = "{smtp_password}"
addresses = ["bot@example.org"]
"""


def _doctor(env: dict[str, str]) -> tuple[int, dict[str, dict[str, Any]]]:
    done = run_relaybot(["doctor", "--json", "--timeout", "3"], env, timeout=60)
    assert done.stdout, done.stderr
    out = json.loads(done.stdout)
    return done.returncode, {c["id"]: c for c in out["checks"]}


def _verdicts(checks: dict[str, Any]) -> dict[str, str]:
    return {cid: c["verdict"] for cid, c in checks.items()}


def test_doctor_healthy_then_broken(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    imap: ImapServer,
    smtp_auth: int,
    procs: Procs,
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    cfg_file = write_config(
        home, _config(imap, smtp_auth, imap_password=imap.password, smtp_password=SMTP_PASSWORD)
    )
    cfg_file.chmod(0o600)
    env = relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )
    keys = Keys(prefix)
    r = redis_server.client()
    gateway = procs.start("email", ["gateway", "email"], env)  # a real process, its heartbeat
    wait_for_heartbeat(r, keys, "gateway:email", pid=gateway.pid)
    digest = config_digest(cfg_file.read_bytes())
    beat(r, keys, "worker")
    beat(r, keys, "jobs", config=digest, restart_needed=False)  # as processes report it

    code, checks = _doctor(env)
    verdicts = _verdicts(checks)
    assert code == 0, [c for c in checks.values() if c["verdict"] != "ok"]
    assert {v for cid, v in verdicts.items() if not cid.startswith("matrix.")} == {"ok"}, [
        c for c in checks.values() if c["verdict"] != "ok"
    ]
    assert verdicts["matrix.login"] == "skipped"  # no [matrix]
    assert "called the tool" in checks["model.tools"]["summary"]
    assert f"pid {gateway.pid}" in checks["processes.gateway:email"]["summary"]
    assert f"config {digest} (current)" in checks["processes.jobs"]["summary"]
    assert model_server.requests[-1]["tools"], "the round trip offered a tool"

    # broken: wrong passwords, a model that is not served, a world-readable memory, a typo in
    # the config, a worker that runs an older config; then Redis down
    cfg_file.write_text(
        _config(imap, smtp_auth, imap_password="wrong", smtp_password="wrong")
        + '\n[matrix]\nhomserver = "http://127.0.0.1:1"\n'
    )
    (home / "memory.sqlite3").write_bytes(b"")
    (home / "memory.sqlite3").chmod(0o644)
    env["RELAYBOT_MODEL"] = "no-such-model"
    code, checks = _doctor(env)
    verdicts = _verdicts(checks)
    assert code == 1
    assert verdicts["email.imap"] == "fail" and "login refused" in checks["email.imap"]["summary"]
    assert verdicts["email.smtp"] == "fail" and "login refused" in checks["email.smtp"]["summary"]
    assert verdicts["model.exists"] == "fail"
    assert "fake-model" in checks["model.exists"]["summary"]
    assert checks["model.exists"]["hint"].startswith('set [model] model = "fake-model"')
    assert verdicts["model.tools"] == "skipped"
    assert verdicts["disk.permissions"] == "fail"
    assert "memory.sqlite3 (-rw-r--r--)" in checks["disk.permissions"]["summary"]
    assert checks["disk.permissions"]["hint"] == f"chmod -R go-rwx {home}"
    assert verdicts["config.keys"] == "fail"
    assert "matrix.homserver (did you mean matrix.homeserver?)" in checks["config.keys"]["summary"]
    assert verdicts["processes.jobs"] == "warn"
    # before its watcher saw the typo: an older config; after: its last good one, and why
    jobs_said = checks["processes.jobs"]["summary"]
    assert "runs an older config" in jobs_said or "config.toml does not load" in jobs_said
    assert verdicts["redis.reachable"] == "ok"  # the rest was checked in spite of the typo

    env["REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    code, checks = _doctor(env)
    verdicts = _verdicts(checks)
    assert code == 1
    assert verdicts["redis.reachable"] == "fail"
    assert verdicts["redis.version"] == verdicts["processes"] == "skipped"
    assert verdicts["model.reachable"] == "ok"  # independent of Redis
    assert verdicts["disk.space"] == "ok"


def test_model_that_ignores_tools_is_a_warning(tmp_path: Path) -> None:
    found: list[Check] = []
    with FakeModelServer(ignore_tools=True) as server:
        cfg = Config.model_validate(
            {"home": tmp_path, "model": {"base_url": server.base_url, "model": "fake-model"}}
        )
        doctor_model.model_group(cfg, 3.0, found.append)
    verdicts = {c.id: c.verdict for c in found}
    assert verdicts == {
        "model.configured": "ok",
        "model.reachable": "ok",
        "model.exists": "ok",
        "model.tools": "warn",
    }
    assert "tool calling" in found[-1].hint


@pytest.fixture
def acl_port(tmp_path: Path) -> Iterator[int]:
    """redis-server with deploy/redis/users.acl (the default user off) and no persistence."""
    text = (ROOT / "deploy" / "redis" / "users.acl").read_text()
    for user, password in PASSWORDS.items():
        text = text.replace(f">CHANGE-ME-{user}", f">{password}")
    (tmp_path / "users.acl").write_text(text)
    port = free_port()
    proc = subprocess.Popen(
        [acl_redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--dir", str(tmp_path), "--aclfile", str(tmp_path / "users.acl")],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            redis.Redis(
                port=port, username="relaybot-cli", password="x", retry=Retry(NoBackoff(), 0)
            ).ping()
        except redis.AuthenticationError:
            break  # up, and refusing bad credentials
        except redis.ConnectionError:
            time.sleep(0.02)
    yield port
    proc.terminate()
    proc.wait(10)


PASSWORDS = {"worker": "w", "jobs": "j", "cli": "c", "matrix": "m", "email": "e"}


def _redis_checks(tmp_path: Path, url: str, prefix: str = "relaybot:") -> dict[str, Check]:
    cfg = Config.model_validate({"home": tmp_path, "redis": {"url": url, "prefix": prefix}})
    found: list[Check] = []
    doctor_redis.redis_group(cfg, 3.0, found.append)
    return {c.id: c for c in found}


def test_redis_acl_and_persistence(tmp_path: Path, acl_port: int) -> None:
    def url(user: str) -> str:
        return f"redis://relaybot-{user}:{PASSWORDS[user]}@127.0.0.1:{acl_port}/0"

    for user in PASSWORDS:  # every user of the template may do its job
        assert _redis_checks(tmp_path, url(user))["redis.acl"].verdict == "ok", user
    gateway = _redis_checks(tmp_path, url("matrix"))
    assert gateway["redis.version"].verdict == "ok"  # HELLO: every user may ask
    assert gateway["redis.persistence"].verdict == "warn"  # a gateway has no CONFIG
    assert "unverified" in gateway["redis.persistence"].summary
    other = _redis_checks(tmp_path, url("cli"), prefix="other:")  # keys the ACL does not grant
    assert other["redis.acl"].verdict == "fail"
    assert "XADD other:inbound:cli" in other["redis.acl"].summary
    admin = redis.Redis(port=acl_port, username="relaybot-worker", password=PASSWORDS["worker"])
    assert admin.dbsize() == 0  # the probes wrote nothing

    plain = RedisServer(tmp_path / "plain", persistence=("--appendonly", "no")).start()
    try:
        found = _redis_checks(tmp_path, plain.url)
        assert found["redis.persistence"].verdict == "fail"
        assert "appendonly no" in found["redis.persistence"].summary
        assert found["redis.acl"].verdict == "ok"  # the default user may do anything
    finally:
        plain.stop()


def test_matrix_login_and_crypto_store(tmp_path: Path, synapse_server: SynapseServer) -> None:
    from gateways.matrix.login import login

    user = synapse_server.register(f"doc{os.getpid()}", "pw")
    store = tmp_path / "matrix"

    def run(**matrix: Any) -> dict[str, Check]:
        settings = {"homeserver": synapse_server.url, "user_id": user.user_id, **matrix}
        cfg = Config.model_validate({"home": tmp_path, "matrix": settings})
        found: list[Check] = []
        matrix_doctor.matrix_group(cfg, 5.0, found.append)
        return {c.id: c for c in found}

    fresh = run(password="pw")  # the gateway never ran: the password works, no store yet
    assert fresh["matrix.login"].verdict == "ok", fresh
    assert fresh["matrix.crypto_store"].verdict == "skipped"

    wrong = run(password="not-it")
    assert wrong["matrix.login"].verdict == "fail"
    assert "M_FORBIDDEN" in wrong["matrix.login"].summary

    cfg = Config.model_validate(
        {"home": tmp_path, "matrix": {"homeserver": synapse_server.url,
                                      "user_id": user.user_id, "password": "pw"}}
    )  # fmt: skip
    client = asyncio.run(_login_and_close(login, cfg, store))
    healthy = run(password="pw")
    assert healthy["matrix.login"].verdict == "ok", healthy
    assert "saved session" in healthy["matrix.login"].summary
    assert healthy["matrix.crypto_store"].verdict == "ok", healthy
    assert client in healthy["matrix.crypto_store"].summary

    # the store of another device (a copied directory, a reset session): fail, with the fix
    db = store / f"{user.user_id}_{client}.db"
    db.rename(store / f"{user.user_id}_OTHERDEVICE.db")
    moved = run(password="pw")
    assert moved["matrix.crypto_store"].verdict == "fail"
    assert "OTHERDEVICE" in moved["matrix.crypto_store"].summary


async def _login_and_close(login: Any, cfg: Config, store: Path) -> str:
    client = await login(cfg.matrix, store)
    try:
        return str(client.device_id)
    finally:
        await client.close()


def test_email_over_starttls(tmp_path: Path) -> None:
    """IMAP and SMTP with STARTTLS and a self-signed CA (ca_file): the paths a real server takes."""
    cert, key = self_signed_cert(tmp_path / "tls")
    imap = ImapServer(tmp_path / "imap", tls=(cert, key)).start()
    smtp = SmtpServer(tls=(cert, key)).start()
    try:
        settings = {
            "imap_host": "127.0.0.1", "imap_port": imap.port, "imap_tls": "starttls",
            "imap_user": imap.user, "imap_password": imap.password,
            "smtp_host": "127.0.0.1", "smtp_port": smtp.port, "smtp_tls": "starttls",
            "addresses": ["bot@example.org"], "ca_file": str(cert),
        }  # fmt: skip
        cfg = Config.model_validate({"home": tmp_path, "email": settings})
        found: list[Check] = []
        email_doctor.email_group(cfg, 5.0, found.append)
        assert [(c.id, c.verdict) for c in found] == [
            ("email.imap", "ok"),
            ("email.smtp", "ok"),
            ("email.owner_auth", "skipped"),  # no Redis runs for this home: nothing to read
        ]
        assert "(starttls)" in found[0].summary and "IDLE" in found[0].summary
        assert not smtp.messages()

        untrusted = Config.model_validate(
            {"home": tmp_path, "email": {**settings, "ca_file": None}}
        )  # the server's certificate is not trusted without its CA: refused, and said so
        found = []
        email_doctor.email_group(untrusted, 5.0, found.append)
        assert [c.verdict for c in found] == ["fail", "fail", "skipped"]
        assert "CERTIFICATE_VERIFY_FAILED" in found[0].summary
    finally:
        imap.stop()
        smtp.stop()


def test_no_config_file_is_the_same_config_and_broken_toml_still_shows_the_processes(
    tmp_path: Path, redis_server: RedisServer, prefix: str
) -> None:
    """A process started without config.toml reports ``config none``; doctor without the file
    must call that current (it said "config.toml is now e3b0c44298fc", the digest of no bytes).
    With a config.toml that is not TOML, the processes still run: their heartbeats are read from
    the Redis the environment names."""
    from relaybot.doctor import diagnose

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = relaybot_env(home, redis_url=redis_server.url, prefix=prefix)
    keys = Keys(prefix)
    r = redis_server.client()
    beat(r, keys, "worker", config="none", restart_needed=False)

    def processes() -> dict[str, Check]:
        report = diagnose(home, timeout=3, env=env)
        return {c.id: c for c in report.checks if c.id.startswith("processes")}

    worker = processes()["processes.worker"]
    assert worker.verdict.value == "ok" and "config none (current)" in worker.summary, worker

    (home / "config.toml").write_text("[model\nbroken = ", encoding="utf-8")
    found = processes()
    assert "processes.worker" in found, found  # not skipped because the file does not load
    assert "runs an older config" in found["processes.worker"].summary  # it keeps the last good


def test_doctor_shows_the_owners_mail_refused_as_unauthenticated_with_the_fix(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    imap: ImapServer,
    smtp: SmtpServer,
    procs: Procs,
) -> None:
    """Issue 24, item 1: the owner's server writes another authserv-id than the one configured
    (``mx.test``), so the owner's own mail is a stranger's. The gateway says so in its log, once
    an hour per reason, and doctor shows the last such refusal with the fix; Redis is what both
    read, as the gateway may run on another host. Once the owner's mail is authenticated again,
    doctor is content."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    config = email_config(imap, smtp, bot="bot@example.org", owner="owner@example.org")
    config = config.replace("trust_unauthenticated = true", 'trusted_authserv_ids = ["mx.test"]')
    write_config(home, config).chmod(0o600)
    env = relaybot_env(home, redis_url=redis_server.url, prefix=prefix)
    gateway = procs.start("email", ["gateway", "email"], env)
    gateway.wait_for_log("email.ready", timeout=20)
    _code, checks = _doctor(env)
    assert checks["email.owner_auth"]["verdict"] == "ok", checks["email.owner_auth"]

    for n in (1, 2):
        msg = make_message(message_id=f"<own-{n}@example.org>")
        verdict = "mx2.test; dmarc=pass header.from=example.org"  # the server's real id
        msg._headers.insert(0, ("Authentication-Results", verdict))
        imap.append(msg)
    wait_until(lambda: len(gateway.events("email.published")) == 2, message="both mails published")
    [logged] = gateway.events("email.owner_unauthenticated")  # once, not once per mail
    assert logged["authserv_ids"] == ["mx2.test"] and logged["reason"] == "untrusted"

    code, checks = _doctor(env)
    check = checks["email.owner_auth"]
    assert check["verdict"] == "warn" and code == 0, check
    assert "owner@example.org" in check["summary"] and "mx2.test" in check["summary"]
    assert '"mx2.test"' in check["hint"] and "trusted_authserv_ids" in check["hint"]
    shown = run_relaybot(["doctor", "--timeout", "3"], env, timeout=60).stdout
    assert "WARN  email.owner_auth" in shown and "add it to [email] trusted_authserv_ids" in shown

    good = make_message(message_id="<own-3@example.org>")
    verdict = "mx.test; dmarc=pass header.from=example.org"
    good._headers.insert(0, ("Authentication-Results", verdict))
    imap.append(good)
    wait_until(lambda: len(gateway.events("email.published")) == 3, message="the third mail")
    _code, checks = _doctor(env)
    assert checks["email.owner_auth"]["verdict"] == "ok", checks["email.owner_auth"]
