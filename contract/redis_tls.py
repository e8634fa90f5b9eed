"""TLS to Redis (``rediss://``): the client's options, and what a TLS failure means.

``[redis] ca_file`` (the CA that signed the server's certificate; default the system's CAs),
``cert_file`` and ``key_file`` (this client's, for a server with ``tls-auth-clients yes``) become
redis-py's ``ssl_*`` options. Certificates are always checked, host name included.

A TLS failure is not an outage that waiting cures: a certificate that does not verify, a
``rediss://`` URL against a server that does not speak TLS, a TLS file that cannot be read.
:func:`problem` turns such an error into one line that says what to do; the callers stop with it
(exit 2) instead of waiting for Redis forever (:func:`contract.bus.wait_for_redis`).
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

from contract.config import Config

# what OpenSSL says when the other side answered a ClientHello with something that is not TLS
_NOT_TLS = (
    "wrong version number",
    "record layer failure",
    "packet length too long",
    "unknown protocol",
    "http request",
    "tlsv1 alert protocol version",
)
# what redis-py says when a server hangs up on its plain-text first command (a TLS-only port)
_CLOSED = ("closed by server", "connection reset by peer")
_NEEDS_CLIENT_CERT = ("certificate required", "alert bad certificate", "alert handshake failure")


def _is_tls(cfg: Config) -> bool:
    return cfg.redis.url is not None and cfg.redis.url.get_secret_value().startswith("rediss://")


def options(cfg: Config) -> dict[str, Any]:
    """redis-py's keyword arguments for the configured TLS files (none for a plain URL)."""
    if not _is_tls(cfg):
        return {}
    r = cfg.redis
    out: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    if r.ca_file is not None:
        out["ssl_ca_certs"] = str(r.ca_file)
    if r.cert_file is not None:
        out["ssl_certfile"] = str(r.cert_file)
    if r.key_file is not None:
        out["ssl_keyfile"] = str(r.key_file)
    return out


def file_problem(cfg: Config) -> str | None:
    """A configured TLS file that this process cannot read, in one line; None when all are."""
    if not _is_tls(cfg):
        return None
    for key, var in (("ca_file", "CA_FILE"), ("cert_file", "CERT_FILE"), ("key_file", "KEY_FILE")):
        path = getattr(cfg.redis, key)
        if path is None:
            continue
        if not path.is_file() or not os.access(path, os.R_OK):
            why = "does not exist" if not path.exists() else "is not a file this user can read"
            return (
                f"[redis] {key} {path} {why}: fix the path ([redis] {key} or "
                f"RELAYBOT_REDIS__{var}) or its permissions"
            )
    return _load_problem(cfg)


def _load_problem(cfg: Config) -> str | None:
    """A readable TLS file OpenSSL cannot use (a key given as the CA, a file of junk): one line,
    not a connection that fails for ever ("NO_CERTIFICATE_OR_CRL_FOUND" is no outage)."""
    r = cfg.redis
    context = ssl.create_default_context()
    try:
        if r.ca_file is not None:
            context.load_verify_locations(cafile=str(r.ca_file))
    except (ssl.SSLError, ValueError) as exc:
        return (
            f"[redis] ca_file {r.ca_file} holds no CA certificate OpenSSL can read ({exc}): name "
            "the PEM file of the CA that signed the server's certificate (RELAYBOT_REDIS__CA_FILE)"
        )
    try:
        if r.cert_file is not None:
            context.load_cert_chain(str(r.cert_file), str(r.key_file) if r.key_file else None)
    except (ssl.SSLError, ValueError) as exc:
        return (
            f"[redis] cert_file {r.cert_file} and key_file {r.key_file} are not a certificate and "
            f"its key OpenSSL can read ({exc}): name this client's PEM certificate and its key "
            "(RELAYBOT_REDIS__CERT_FILE, RELAYBOT_REDIS__KEY_FILE)"
        )
    return None


def problem(exc: BaseException, cfg: Config, where: str) -> str | None:
    """What a failed connection to ``where`` (the URL, its password masked) means and what to
    do, in one line, when it is a TLS misconfiguration; None for anything else (an outage)."""
    said = str(exc)
    low = said.lower()
    if not _is_tls(cfg):
        if any(m in low for m in _CLOSED) and _speaks_tls(cfg):
            return (
                f"Redis at {where} speaks TLS on that port ({said}): use a rediss:// URL, with "
                "[redis] ca_file (RELAYBOT_REDIS__CA_FILE) the CA that signed its certificate"
            )
        return None
    if "certificate_verify_failed" in low or "certificate verify failed" in low:
        reason = said.split("certificate verify failed:", 1)[-1].strip(" .)") or said
        return (
            f"Redis at {where}: its TLS certificate does not verify ({reason}): set [redis] "
            "ca_file (RELAYBOT_REDIS__CA_FILE) to the CA that signed the server's certificate, "
            "and connect to a name or address the certificate holds"
        )
    if any(marker in low for marker in _NEEDS_CLIENT_CERT):
        return (
            f"Redis at {where} refused the TLS handshake ({said}): the server asks for a client "
            "certificate (tls-auth-clients yes): set [redis] cert_file and key_file "
            "(RELAYBOT_REDIS__CERT_FILE, RELAYBOT_REDIS__KEY_FILE)"
        )
    if any(marker in low for marker in _NOT_TLS) or (
        ("timeout" in low or "closed" in low) and _plain_redis(cfg)
    ):
        return (
            f"Redis at {where} does not speak TLS on that port ({said}): a rediss:// URL needs "
            "the server's tls-port; for a server without TLS use redis://"
        )
    if "[ssl" in low and ("no such file" in low or "pem lib" in low):
        return f"Redis at {where}: a TLS file could not be loaded ({said}): fix [redis] ca_file"
    return None


def _plain_redis(cfg: Config) -> bool:
    """Whether the rediss:// URL's host and port answer a plain-text PING as Redis does (a plain
    Redis takes the TLS ClientHello for the start of a command and waits: a timeout)."""
    assert cfg.redis.url is not None
    parts = urlsplit(cfg.redis.url.get_secret_value())
    try:
        with socket.create_connection((parts.hostname or "localhost", parts.port or 6379), 2) as s:
            s.sendall(b"PING\r\n")
            answer = s.recv(64)
    except OSError:
        return False
    return answer[:1] in (b"+", b"-")  # +PONG, -NOAUTH ..., -ERR ...


def _speaks_tls(cfg: Config) -> bool:
    """Whether the redis:// URL's host and port complete a TLS handshake (a Redis with only its
    tls-port there hangs up on a plain-text connection: redis-py says "Connection reset by peer"
    or "Connection closed by server", which waiting would never cure). The certificate is not
    checked: only the protocol is."""
    if cfg.redis.url is None:
        return False
    parts = urlsplit(cfg.redis.url.get_secret_value())
    if parts.scheme != "redis":
        return False
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((parts.hostname or "localhost", parts.port or 6379), 2) as raw,
            context.wrap_socket(raw) as tls,
        ):
            return tls.version() is not None
    except (OSError, ssl.SSLError):
        return False
