"""Real mail servers for integration tests, started on 127.0.0.1 by the tests themselves.

``ImapServer`` runs pymap's in-memory (``dict``) backend as a subprocess (IDLE included, no root);
``SmtpServer`` is an aiosmtpd ``Controller`` that keeps every message it receives.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import imaplib
import ssl
import subprocess
import sys
import threading
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.support.servers import free_port

IMAP_USER = "relay"
IMAP_PASSWORD = "relaypass"


class ImapServer:
    """pymap on a free port with one user (its mail lives in memory: a restart empties it)."""

    def __init__(self, workdir: Path, *, tls: tuple[Path, Path] | None = None) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.user, self.password = IMAP_USER, IMAP_PASSWORD
        self.tls = tls  # (cert, key): STARTTLS offered (pymap has no implicit TLS)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ImapServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        pymap = str(Path(sys.executable).with_name("pymap"))
        self.proc = subprocess.Popen(
            [
                pymap, "--host", "127.0.0.1", "--port", str(self.port),
                *(["--cert", str(self.tls[0]), "--key", str(self.tls[1])] if self.tls
                  else ["--no-tls"]),
                "dict", "--demo-user", self.user, "--demo-password", self.password,
            ],
            stdin=subprocess.DEVNULL,
            stdout=(self.workdir / "pymap.log").open("ab"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with self.client():
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("pymap did not start")

    def client(self) -> imaplib.IMAP4:
        conn = imaplib.IMAP4("127.0.0.1", self.port, timeout=10)
        if self.tls:
            conn.starttls(ssl.create_default_context(cafile=str(self.tls[0])))
        conn.login(self.user, self.password)
        return conn

    def append(self, msg: EmailMessage | bytes, folder: str = "INBOX") -> int:
        """APPEND a message; returns its UID."""
        data = msg if isinstance(msg, bytes) else msg.as_bytes(policy=email.policy.SMTP)
        with self.client() as conn:
            typ, resp = conn.append(folder, None, None, data)
            if typ != "OK":
                raise RuntimeError(f"APPEND failed: {resp!r}")
            text = (resp[0] or b"").decode()
            return int(text.split("APPENDUID", 1)[1].split()[1].rstrip("]"))

    def flags(self, uid: int, folder: str = "INBOX") -> str:
        with self.client() as conn:
            conn.select(folder)
            _typ, data = conn.uid("FETCH", str(uid), "(FLAGS)")
            return repr(data)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class _Collect:
    def __init__(self, server: SmtpServer) -> None:
        self.server = server

    async def handle_DATA(self, _server: Any, _session: Any, envelope: Any) -> str:
        raw: bytes = envelope.original_content or envelope.content
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        with self.server.lock:
            self.server.received.append((list(envelope.rcpt_tos), msg))
        return "250 OK"


class _Logins:
    """aiosmtpd's authenticator: one user and password (AUTH PLAIN and LOGIN)."""

    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user.encode(), password.encode()

    def __call__(
        self, _server: Any, _session: Any, _envelope: Any, _mechanism: str, data: Any
    ) -> AuthResult:
        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
            self.user,
            self.password,
        )
        return AuthResult(success=ok, handled=False)


class SmtpServer:
    """aiosmtpd on a free port collecting ``(recipients, message)`` for every mail sent to it.
    With ``login=(user, password)`` it offers AUTH and takes only those (over plain text too: the
    tests run on loopback)."""

    def __init__(
        self,
        *,
        tls: tuple[Path, Path] | None = None,
        implicit_tls: bool = False,
        login: tuple[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.received: list[tuple[list[str], email.message.Message]] = []
        self.lock = threading.Lock()
        options: dict[str, Any] = {}
        if tls is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            if implicit_tls:  # SMTPS: TLS from the first byte (port 465 style)
                options = {"ssl_context": ctx}
            else:  # STARTTLS required
                options = {"tls_context": ctx, "require_starttls": True}
        if login is not None:
            options |= {"authenticator": _Logins(*login), "auth_require_tls": False}
        self.controller = Controller(
            _Collect(self), hostname="127.0.0.1", port=self.port, **options
        )

    def start(self) -> SmtpServer:
        self.controller.start()
        return self

    def messages(self) -> list[email.message.Message]:
        with self.lock:
            return [m for _rcpt, m in self.received]

    def stop(self) -> None:
        self.controller.stop()


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (and its key), made with the openssl command."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def make_message(
    *,
    sender: str = "owner@example.org",
    to: str = "bot@example.org",
    subject: str = "hello",
    body: str = "hi there",
    message_id: str,
    in_reply_to: str | None = None,
    references: str | None = None,
    cc: str | None = None,
    headers: dict[str, str] | None = None,
) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = to
    if cc:
        msg["Cc"] = cc
    msg["Subject"] = subject
    msg["Message-ID"] = message_id
    msg["Date"] = email.utils.formatdate(localtime=False)
    if in_reply_to:
        msg["In-Reply-To"] = in_reply_to
    if references:
        msg["References"] = references
    for name, value in (headers or {}).items():
        msg[name] = value
    msg.set_content(body)
    return msg


class TlsProxy:
    """Implicit TLS (IMAPS, port 993 style) in front of a plain server: pymap offers only
    STARTTLS, so the tests terminate TLS here and forward the bytes to pymap's port."""

    def __init__(self, target_port: int, cert: Path, key: Path) -> None:
        self.port = free_port()
        self.target_port = target_port
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(str(cert), str(key))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None

    def start(self) -> TlsProxy:
        self.thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, "127.0.0.1", self.port, ssl=self.ctx), self.loop
        )
        self.server = fut.result(10)
        return self

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        async def shutdown() -> None:
            if self.server is not None:
                self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


def email_config(
    imap: ImapServer,
    smtp: SmtpServer,
    *,
    bot: str,
    owner: str,
    more: str = "",
    authserv: str | None = None,
) -> str:
    """config.toml for the e-mail gateway against these servers: plain IMAP and SMTP, ``bot``
    the assistant's address, ``owner`` the owner's alias, senders trusted as the test's pymap is
    the only server that delivers to the mailbox (or, with ``authserv``, only as that
    Authentication-Results id vouches); ``more`` lines go on in ``[email]``."""
    trust = (
        f'trusted_authserv_ids = ["{authserv}"]'
        if authserv
        else "trust_unauthenticated = true  # only the test's pymap delivers to this mailbox"
    )
    return f"""
[owner]
aliases = [{{ address = "{owner}", channel = "email" }}]

[email]
imap_host = "127.0.0.1"
imap_port = {imap.port}
imap_tls = "plain"
imap_user = "{imap.user}"
imap_password = "{imap.password}"
smtp_host = "127.0.0.1"
smtp_port = {smtp.port}
smtp_tls = "plain"
addresses = ["{bot}"]
{trust}
{more}
"""
