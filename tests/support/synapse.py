"""A real Synapse homeserver on 127.0.0.1 for integration tests.

The config is written here (no ``--generate-config``: it would bind 0.0.0.0 and keep the default
rate limits): one client listener on a free port, SQLite, ``bcrypt_rounds: 4``, no trusted key
servers, every ``rc_*`` limit raised, registration by shared secret only. Users are registered
through the admin endpoint (``/_synapse/admin/v1/register``, HMAC-SHA1 over the nonce).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.support.servers import free_port

SERVER_NAME = "localhost"
SHARED_SECRET = "relaybot-test-shared-secret"

_LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
_LIMIT = {"per_second": 1000, "burst_count": 1000}
_CONFIG: dict[str, Any] = {
    "server_name": SERVER_NAME,
    "report_stats": False,
    "bcrypt_rounds": 4,
    "trusted_key_servers": [],
    "suppress_key_server_warning": True,
    "enable_registration": False,
    "registration_shared_secret": SHARED_SECRET,
    "presence": {"enabled": False},
    "url_preview_enabled": False,
    "enable_metrics": False,
    "rc_message": _LIMIT,
    "rc_registration": _LIMIT,
    "rc_login": {"address": _LIMIT, "account": _LIMIT, "failed_attempts": _LIMIT},
    "rc_joins": {"local": _LIMIT, "remote": _LIMIT},
    "rc_joins_per_room": _LIMIT,
    "rc_invites": {"per_room": _LIMIT, "per_user": _LIMIT, "per_issuer": _LIMIT},
    "rc_admin_redaction": _LIMIT,
    "rc_3pid_validation": _LIMIT,
    "rc_key_requests": _LIMIT,
    "rc_room_creation": _LIMIT,
    "rc_presence": {"per_user": _LIMIT},
    "rc_delayed_event_mgmt": _LIMIT,
}


@dataclass(frozen=True)
class MatrixUser:
    user_id: str
    password: str
    access_token: str
    device_id: str


class SynapseServer:
    """``python -m synapse.app.homeserver`` with a config of our own, stopped by :meth:`stop`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        signing_key = self.workdir / "signing.key"
        log_config = self.workdir / "log.yaml"
        log_config.write_text(
            json.dumps(
                {
                    "version": 1,
                    "formatters": {"f": {"format": _LOG_FORMAT}},
                    "handlers": {
                        "file": {
                            "class": "logging.FileHandler",
                            "filename": str(self.workdir / "homeserver.log"),
                            "formatter": "f",
                        }
                    },
                    "root": {"level": "WARNING", "handlers": ["file"]},
                    "disable_existing_loggers": False,
                }
            )
        )
        config = {
            **_CONFIG,
            "pid_file": str(self.workdir / "homeserver.pid"),
            "signing_key_path": str(signing_key),
            "media_store_path": str(data / "media"),
            "log_config": str(log_config),
            "macaroon_secret_key": "test-macaroon-secret",
            "form_secret": "test-form-secret",
            "database": {
                "name": "sqlite3",
                "args": {"database": str(data / "homeserver.db")},
            },
            "listeners": [
                {
                    "port": self.port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": False,
                    "x_forwarded": False,
                    "resources": [{"names": ["client"], "compress": False}],
                }
            ],
        }
        path = self.workdir / "homeserver.yaml"
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        return path

    def start(self, timeout: float = 60.0) -> SynapseServer:
        config = self._write_config()
        base = [sys.executable, "-m", "synapse.app.homeserver", "-c", str(config)]
        subprocess.run(
            [*base, "--generate-keys"],
            cwd=self.workdir,
            check=True,
            capture_output=True,
            timeout=60,
        )
        with (self.workdir / "stderr.log").open("ab") as err:
            self.proc = subprocess.Popen(
                base, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=err, stderr=err
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"synapse exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"synapse did not become healthy: {self.log_tail()}")

    def log_tail(self) -> str:
        parts = []
        for name in ("stderr.log", "homeserver.log"):
            path = self.workdir / name
            if path.exists():
                parts.append(path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    # -- HTTP helpers --------------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                out: dict[str, Any] = json.loads(resp.read() or b"{}")
                return out
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from None

    def register(self, localpart: str, password: str = "pw", *, admin: bool = False) -> MatrixUser:
        """A new user through the shared-secret admin endpoint (logged in once: one device)."""
        nonce = self.request("GET", "/_synapse/admin/v1/register")["nonce"]
        role = "admin" if admin else "notadmin"
        # the MAC covers the four parts separated by NUL bytes
        message = b"\x00".join(p.encode() for p in (nonce, localpart, password, role))
        mac = hmac.new(SHARED_SECRET.encode(), message, digestmod=hashlib.sha1)
        out = self.request(
            "POST",
            "/_synapse/admin/v1/register",
            {
                "nonce": nonce,
                "username": localpart,
                "password": password,
                "admin": admin,
                "mac": mac.hexdigest(),
            },
        )
        return MatrixUser(out["user_id"], password, out["access_token"], out["device_id"])

    # -- a plain client, for the people in the tests -----------------------------------------

    def create_room(
        self,
        user: MatrixUser,
        invite: list[str],
        *,
        direct: bool = False,
        name: str = "",
        history_visibility: str | None = None,
        state: dict[str, dict[str, Any]] | None = None,
    ) -> str:
        """A room (``private_chat`` preset: invite-only, history shared); ``state`` adds state
        events by type (``{"m.room.join_rules": {"join_rule": "public"}}``)."""
        body: dict[str, Any] = {"invite": invite, "is_direct": direct, "preset": "private_chat"}
        if name:
            body["name"] = name
        initial = dict(state or {})
        if history_visibility:
            initial["m.room.history_visibility"] = {"history_visibility": history_visibility}
        if initial:
            body["initial_state"] = [
                {"type": kind, "state_key": "", "content": content}
                for kind, content in initial.items()
            ]
        return str(
            self.request("POST", "/_matrix/client/v3/createRoom", body, user.access_token)[
                "room_id"
            ]
        )

    def set_state(self, user: MatrixUser, room_id: str, kind: str, content: dict[str, Any]) -> str:
        path = f"/_matrix/client/v3/rooms/{quote(room_id)}/state/{kind}/"
        return str(self.request("PUT", path, content, user.access_token)["event_id"])

    def redact(self, user: MatrixUser, room_id: str, event_id: str, reason: str = "") -> str:
        txn = uuid.uuid4().hex
        path = f"/_matrix/client/v3/rooms/{quote(room_id)}/redact/{quote(event_id)}/{txn}"
        body = {"reason": reason} if reason else {}
        return str(self.request("PUT", path, body, user.access_token)["event_id"])

    def invite(self, user: MatrixUser, room_id: str, who: str) -> None:
        path = f"/_matrix/client/v3/rooms/{quote(room_id)}/invite"
        self.request("POST", path, {"user_id": who}, user.access_token)

    def join(self, user: MatrixUser, room_id: str) -> None:
        self.request("POST", f"/_matrix/client/v3/join/{quote(room_id)}", {}, user.access_token)

    def leave(self, user: MatrixUser, room_id: str) -> None:
        path = f"/_matrix/client/v3/rooms/{quote(room_id)}/leave"
        self.request("POST", path, {}, user.access_token)

    def members(self, user: MatrixUser, room_id: str) -> dict[str, str]:
        """user id -> membership."""
        path = f"/_matrix/client/v3/rooms/{quote(room_id)}/members"
        chunk = self.request("GET", path, token=user.access_token)["chunk"]
        return {e["state_key"]: e["content"]["membership"] for e in chunk}

    def send_text(
        self, user: MatrixUser, room_id: str, body: str, *, mentions: list[str] | None = None
    ) -> str:
        content: dict[str, Any] = {"msgtype": "m.text", "body": body}
        if mentions is not None:
            content["m.mentions"] = {"user_ids": mentions}
        return self.send_event(user, room_id, content)

    def send_event(
        self, user: MatrixUser, room_id: str, content: dict[str, Any], kind: str = "m.room.message"
    ) -> str:
        txn = uuid.uuid4().hex
        path = f"/_matrix/client/v3/rooms/{quote(room_id)}/send/{kind}/{txn}"
        return str(self.request("PUT", path, content, user.access_token)["event_id"])

    def messages(self, user: MatrixUser, room_id: str, limit: int = 100) -> list[dict[str, Any]]:
        """The room's message events, oldest first."""
        path = f"/_matrix/client/v3/rooms/{quote(room_id)}/messages?dir=b&limit={limit}"
        chunk = self.request("GET", path, token=user.access_token)["chunk"]
        return [e for e in reversed(chunk) if e["type"] == "m.room.message"]

    def sync(self, user: MatrixUser, since: str | None = None) -> dict[str, Any]:
        query = "timeout=0" + (f"&since={quote(since)}" if since else "")
        return self.request("GET", f"/_matrix/client/v3/sync?{query}", token=user.access_token)
