"""The Matrix gateway when the homeserver refuses the session, is down, or answers errors."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import Procs, relaybot_env
from tests.support.servers import RedisServer, free_port
from tests.support.synapse import SynapseServer

pytestmark = pytest.mark.integration


def _env(tmp_path: Path, redis_server: RedisServer, prefix: str, **matrix: str) -> dict[str, str]:
    return relaybot_env(
        tmp_path / "home",
        redis_url=redis_server.url,
        prefix=prefix,
        **{f"RELAYBOT_MATRIX_{k.upper()}": v for k, v in matrix.items()},
    )


@pytest.mark.parametrize("with_device", [False, True])
def test_unknown_token_stops_with_a_clear_error(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    procs: Procs,
    synapse_server: SynapseServer,
    with_device: bool,
) -> None:
    extra = {"device_id": "NOSUCHDEV"} if with_device else {}
    env = _env(
        tmp_path, redis_server, prefix, homeserver=synapse_server.url,
        user_id="@ghost:localhost", access_token="syt_not_a_token", **extra,
    )  # fmt: skip
    gateway = procs.start("gateway-matrix", ["gateway", "matrix"], env)
    assert gateway.wait(timeout=20) == 2
    fatal = gateway.wait_for_log("matrix.fatal")
    assert "M_UNKNOWN_TOKEN" in fatal["error"]
    assert "syt_not_a_token" not in gateway.log_text()


class _Failing(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _fail(self) -> None:
        body = json.dumps({"errcode": "M_UNKNOWN", "error": "scripted failure"}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _fail


@pytest.mark.parametrize("server", ["down", "errors"])
def test_network_errors_and_error_values_back_off(
    tmp_path: Path, redis_server: RedisServer, prefix: str, procs: Procs, server: str
) -> None:
    httpd: ThreadingHTTPServer | None = None
    if server == "errors":
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
    else:
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    try:
        env = _env(
            tmp_path, redis_server, prefix, homeserver=url, user_id="@bot:localhost",
            access_token="syt_x", device_id="DEV1",
        )  # fmt: skip
        gateway = procs.start("gateway-matrix", ["gateway", "matrix"], env)
        event = "matrix.sync_failed" if server == "down" else "matrix.sync_error"
        gateway.wait_for_log(event, timeout=15)
        time.sleep(3.5)
        failures = gateway.events(event)
        assert gateway.returncode is None  # still running, backing off
        assert 2 <= len(failures) <= 4, failures  # 1 s, 2 s, 4 s ...: never a tight loop
        delays = [f["retry_in"] for f in failures]
        assert delays == sorted(delays)
        assert delays[1] == 2 * delays[0]
        assert gateway.stop() == 0
    finally:
        if httpd is not None:
            httpd.shutdown()


def test_without_matrix_config_it_idles_for_honcho(
    tmp_path: Path, redis_server: RedisServer, prefix: str, procs: Procs
) -> None:
    env = relaybot_env(tmp_path / "home", redis_url=redis_server.url, prefix=prefix)
    gateway = procs.start("gateway-matrix", ["gateway", "matrix"], env)
    gateway.wait_for_log("matrix.not_configured")
    assert gateway.returncode is None
    assert gateway.stop() == 0


def test_password_login_keeps_its_device_across_restarts(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    procs: Procs,
    synapse_server: SynapseServer,
) -> None:
    bot = synapse_server.register(f"pwbot{prefix[1:7]}", password="s3cret-pw")
    env = _env(
        tmp_path, redis_server, prefix, homeserver=synapse_server.url, user_id=bot.user_id,
        password="s3cret-pw",
    )  # fmt: skip
    first = procs.start("gateway-matrix", ["gateway", "matrix"], env)
    device = first.wait_for_log("matrix.logged_in", timeout=20)["device_id"]
    first.wait_for_log("matrix.backlog_skipped", timeout=20)
    assert first.stop() == 0
    session = json.loads((tmp_path / "home" / "matrix" / "session.json").read_text())
    assert session["device_id"] == device
    assert (tmp_path / "home" / "matrix" / "session.json").stat().st_mode & 0o077 == 0
    second = procs.start("gateway-matrix", ["gateway", "matrix"], env)
    assert second.wait_for_log("matrix.logged_in", timeout=20)["device_id"] == device
    assert "s3cret-pw" not in first.log_text() + second.log_text()
    assert session["access_token"] not in first.log_text() + second.log_text()
