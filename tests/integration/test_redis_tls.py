"""TLS to Redis (issue 26): ``[redis] ca_file`` / ``cert_file`` / ``key_file`` (or
``RELAYBOT_REDIS__CA_FILE`` ...) reach redis-py, and what waiting cannot cure stops the process
with one line saying what to do, exit 2: a certificate that does not verify, ``rediss://``
against a plain server, a CA file that is not there. Before: "waiting for Redis" every 10 s,
forever (the worker, jobs, each gateway), or a traceback.

Debian's redis-server (built with TLS) with the shipped deploy/redis/tls.conf and users.acl."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from deploy.acl import render
from tests.support.procs import relaybot_env, run_relaybot
from tests.support.servers import RedisServer, free_port
from tests.support.tlsredis import Pki, TlsRedis, make_pki, redis_conf

pytestmark = pytest.mark.integration

PASSWORD = "worker-secret"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Pki]]:
    d = tmp_path_factory.mktemp("tlsredis")
    pki = make_pki(d / "pki", ["127.0.0.1"])
    acl = d / "users.acl"
    acl.write_text(render().replace(">CHANGE-ME-worker", f">{PASSWORD}"), "utf-8")
    port = free_port()
    conf = redis_conf(d / "srv", pki, acl, bind="127.0.0.1", port=port)

    def ready() -> bool:
        client = redis.Redis(
            port=port, ssl=True, ssl_ca_certs=str(pki.ca), username="relaybot-worker",
            password=PASSWORD, socket_timeout=2,
        )  # fmt: skip
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False
        finally:
            client.close()

    server = TlsRedis(conf).start(ready)
    yield port, pki
    server.stop()


def _env(home: Path, url: str, **extra: str) -> dict[str, str]:
    return relaybot_env(home, redis_url=url, model_url=None, **extra)


def _one_line_exit_2(done: object, *words: str) -> str:
    rc, err = done.returncode, done.stderr  # type: ignore[attr-defined]
    assert rc == 2, (rc, err)
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if "configuration error" in ln]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_certificate_that_does_not_verify_stops_the_worker_with_what_to_do(
    tls_redis: tuple[int, Pki], tmp_path: Path
) -> None:
    port, pki = tls_redis
    url = f"rediss://relaybot-worker:{PASSWORD}@127.0.0.1:{port}/0"
    env = _env(tmp_path / "home", url, RELAYBOT_REDIS__CA_FILE=str(pki.rogue_ca))
    line = _one_line_exit_2(run_relaybot(["worker"], env, timeout=30), "does not verify", "ca_file")
    assert PASSWORD not in line
    # the same for a one-shot command (the chat)
    _one_line_exit_2(run_relaybot(["chat", "-m", "hi"], env, timeout=30), "does not verify")


def test_the_right_ca_file_connects(tls_redis: tuple[int, Pki], tmp_path: Path) -> None:
    port, pki = tls_redis
    url = f"rediss://relaybot-worker:{PASSWORD}@127.0.0.1:{port}/0"
    env = _env(tmp_path / "home", url, RELAYBOT_REDIS__CA_FILE=str(pki.ca))
    done = run_relaybot(["status", "--json"], env, timeout=30)
    assert done.returncode == 0, done.stderr


def test_a_missing_ca_file_is_a_configuration_error(
    tls_redis: tuple[int, Pki], tmp_path: Path
) -> None:
    port, _pki = tls_redis
    url = f"rediss://relaybot-worker:{PASSWORD}@127.0.0.1:{port}/0"
    env = _env(tmp_path / "home", url, RELAYBOT_REDIS__CA_FILE=str(tmp_path / "nope.pem"))
    _one_line_exit_2(run_relaybot(["worker"], env, timeout=30), "ca_file", "does not exist")


def test_a_ca_file_that_holds_no_certificate_is_a_configuration_error(
    tls_redis: tuple[int, Pki], tmp_path: Path
) -> None:
    """The server's key given as the CA, or junk: the worker waited for Redis for ever
    ("NO_CERTIFICATE_OR_CRL_FOUND"), status called it an outage (exit 1)."""
    port, _pki = tls_redis
    url = f"rediss://relaybot-worker:{PASSWORD}@127.0.0.1:{port}/0"
    junk = tmp_path / "junk.pem"
    junk.write_text("junk\n")
    env = _env(tmp_path / "home", url, RELAYBOT_REDIS__CA_FILE=str(junk))
    for args in (["worker"], ["status"]):
        _one_line_exit_2(run_relaybot(args, env, timeout=30), "ca_file", "no CA certificate")


def test_rediss_against_a_plain_server_says_so(redis_server: RedisServer, tmp_path: Path) -> None:
    url = redis_server.url.replace("redis://", "rediss://")
    env = _env(tmp_path / "home", url)
    _one_line_exit_2(
        run_relaybot(["gateway", "email"], env, timeout=30), "does not speak TLS", "redis://"
    )


def test_a_plain_url_against_the_tls_port_says_so(
    tls_redis: tuple[int, Pki], tmp_path: Path
) -> None:
    """redis:// at a port that speaks only TLS: the server closes each plain connection, which
    waiting never cures (it was "waiting for Redis" every 10 s, forever)."""
    port, _pki = tls_redis
    env = _env(tmp_path / "home", f"redis://relaybot-worker:{PASSWORD}@127.0.0.1:{port}/0")
    for args in (["worker"], ["gateway", "email"], ["status"]):
        line = _one_line_exit_2(run_relaybot(args, env, timeout=30), "speaks TLS", "rediss://")
        assert PASSWORD not in line


def test_tls_files_with_a_plain_url_are_refused(tmp_path: Path) -> None:
    env = _env(tmp_path / "home", "redis://127.0.0.1:1/0", RELAYBOT_REDIS__CA_FILE=str(tmp_path))
    _one_line_exit_2(run_relaybot(["worker"], env, timeout=30), "rediss://")


def test_doctor_uses_the_ca_file_and_says_what_a_bad_certificate_means(
    tls_redis: tuple[int, Pki], tmp_path: Path
) -> None:
    port, pki = tls_redis
    url = f"rediss://relaybot-worker:{PASSWORD}@127.0.0.1:{port}/0"

    def reachable(ca: Path) -> dict[str, object]:
        env = _env(tmp_path / "home", url, RELAYBOT_REDIS__CA_FILE=str(ca))
        done = run_relaybot(["doctor", "--json", "--timeout", "3"], env, timeout=60)
        checks = json.loads(done.stdout)["checks"]
        return dict(next(c for c in checks if c["id"] == "redis.reachable"))

    assert reachable(pki.ca)["verdict"] == "ok"
    bad = reachable(pki.rogue_ca)
    assert bad["verdict"] == "fail" and "does not verify" in str(bad["summary"]), bad
