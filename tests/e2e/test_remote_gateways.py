"""deploy/README.md's "Gateways on other hosts", walked on one machine (issue 26).

Three hosts, each a network namespace: the worker's (Debian's redis-server with the shipped
deploy/redis/tls.conf and the ACL file ``python -m deploy.acl`` writes, the worker, the jobs
process, the model), the e-mail gateway's (its IMAP and SMTP servers on its own loopback) and
the terminal's, joined to the worker's host by veth pairs. Each host's settings are the guide's
own files, read from deploy/README.md (the fenced blocks that start ``# /etc/relaybot/...`` or
``# .env``), with the guide's placeholders filled in; only the mail servers' addresses and the
model's differ, as they would for any reader. Each gateway connects over ``rediss://`` with its
own ACL account and the guide's CA file.

Then: the owner's authenticated mail and a terminal message are answered; a certificate that
does not verify is refused with one line and exit 2; both links are cut for 30 s while a reply
is being written and mail arrives, and afterwards every message is answered exactly once (the
SMTP server's replies, the streams' entries and the terminal's output counted).

Before: a gateway set up as the guide said (environment only) had no way to learn the owner's
addresses and recorded the owner's mail without answering it. Needs root (``ip netns``); under
CI it fails rather than skips when namespaces cannot be made."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import pytest
import redis

from tests.support import netns
from tests.support.fakemodel import FakeModelServer
from tests.support.mailservers import ImapServer, SmtpServer, make_message
from tests.support.netns import Host, link
from tests.support.procs import Procs, relaybot_env, wait_until
from tests.support.synapse import SynapseServer
from tests.support.tlsredis import Pki, TlsRedis, make_pki, redis_conf

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "deploy/README.md"
CUT_SECONDS = 30
OWNER = "ada@example.org"
BOT = "relaybot@example.org"
AUTHSERV = "mx.example.org"  # the guide's trusted_authserv_ids
W_TO_E, E_TO_W = "10.77.1.1", "10.77.1.2"
W_TO_C, C_TO_W = "10.77.2.1", "10.77.2.2"
W_TO_M, M_TO_W = "10.77.3.1", "10.77.3.2"


def guide_file(name: str) -> dict[str, str]:
    """The ``KEY=value`` lines of the guide's block that starts ``# <name>``."""
    text = GUIDE.read_text("utf-8")
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        lines = block.splitlines()
        if lines and lines[0].strip() == f"# {name}":
            pairs = [ln.split("=", 1) for ln in lines[1:] if ln.strip() and not ln.startswith("#")]
            return {k.strip(): v.strip().strip("'") for k, v in pairs}
    raise AssertionError(f"deploy/README.md has no ```sh block starting '# {name}'")


def fill(values: dict[str, str], placeholders: dict[str, str], **ours: str) -> dict[str, str]:
    """The guide's values with its placeholders replaced; ``ours`` (the test's servers) must be
    keys the guide sets: the test sets nothing the guide does not tell the operator to."""
    unknown = set(ours) - set(values)
    assert not unknown, f"the guide's file does not set {sorted(unknown)}"
    out = {}
    for key, raw in values.items():
        value = raw
        for placeholder, real in placeholders.items():
            value = value.replace(placeholder, real)
        out[key] = ours.get(key, value)
    return out


def guide_certificates(directory: Path, ips: list[str]) -> Pki:
    """Step 1's openssl commands, run as the guide writes them, the certificate naming the
    addresses the gateways connect to here too; plus a CA that signed nothing (a client that
    trusts it must refuse the server)."""
    text = GUIDE.read_text("utf-8")
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, flags=re.S) if "ca.key" in b)
    extra = "".join(f",IP:{ip}" for ip in ips)
    assert "IP:127.0.0.1" in block
    assert "~/relaybot-tls" in block
    directory.mkdir()  # the operator's home directory here
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.replace("IP:127.0.0.1", "IP:127.0.0.1" + extra)],
        env={"PATH": os.environ["PATH"], "HOME": str(directory)}, capture_output=True,
        check=True,
    )  # fmt: skip
    directory = directory / "relaybot-tls"
    for f in directory.iterdir():
        f.chmod(0o644)  # throwaway keys; redis-server and relaybot read them
    rogue = make_pki(directory / "rogue", ["127.0.0.1"]).rogue_ca
    return Pki(directory / "ca.crt", directory / "redis.crt", directory / "redis.key", rogue)


def unit_env(home: Path, settings: dict[str, str]) -> dict[str, str]:
    """What systemd gives the unit: its Environment= (RELAYBOT_HOME) and EnvironmentFile=."""
    env = relaybot_env(home)  # PATH, HOME, RELAYBOT_DOTENV= (the tests never read a .env)
    env.update(settings)
    return env


@pytest.fixture
def hosts() -> Iterator[tuple[Host, Host, Host, Host]]:
    why = netns.unavailable()
    if why is not None:
        if os.environ.get("CI") or os.geteuid() == 0:
            pytest.fail(f"network namespaces are needed and unavailable: {why}")
        pytest.skip(why)
    tag = f"rb{os.getpid() % 100000}"
    with Host(f"{tag}w") as w, Host(f"{tag}e") as e, Host(f"{tag}c") as c, Host(f"{tag}m") as m:
        yield w, e, c, m


def _ready(host: Host, url: str, ca: Path) -> bool:
    def ping() -> bool:
        client = redis.Redis.from_url(url, ssl_ca_certs=str(ca), socket_timeout=2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    return host.run(ping)


def _owner_mail(n: int, body: str) -> tuple[str, EmailMessage]:
    mid = f"<remote-{n}-{secrets.token_hex(4)}@example.org>"
    msg = make_message(sender=OWNER, to=BOT, subject=f"remote {n}", body=body, message_id=mid)
    msg["Authentication-Results"] = f"{AUTHSERV}; dmarc=pass header.from=example.org"
    return mid, msg


def _asked(model: FakeModelServer, text: str) -> bool:
    """Whether a request the model got holds ``text`` (the worker is on that turn)."""
    return any(text in json.dumps(body) for body in list(model.requests))


def _replies_to(smtp: SmtpServer) -> list[str]:
    return [str(m["In-Reply-To"]) for m in smtp.messages()]


def test_the_deploy_guide_on_three_hosts(
    hosts: tuple[Host, Host, Host, Host], tmp_path: Path, procs: Procs
) -> None:
    w, e, c, m = hosts
    dev_we, _ = link(w, W_TO_E, e, E_TO_W, f"{w.name[:-1]}E")
    dev_wc, _ = link(w, W_TO_C, c, C_TO_W, f"{w.name[:-1]}C")
    dev_wm, _ = link(w, W_TO_M, m, M_TO_W, f"{w.name[:-1]}M")

    # the worker's host: certificates, the ACL file, Redis with TLS (guide steps 1-3)
    pki = guide_certificates(tmp_path / "pki", [W_TO_E, W_TO_C, W_TO_M])
    acl_text = subprocess.run(
        [sys.executable, "-m", "deploy.acl"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    passwords = {u: secrets.token_hex(32) for u in ("worker", "jobs", "cli", "matrix", "email")}
    for user, password in passwords.items():
        acl_text = acl_text.replace(f"CHANGE-ME-{user}", password)
    acl = tmp_path / "redis" / "users.acl"
    acl.parent.mkdir()
    acl.write_text(acl_text, "utf-8")
    conf = redis_conf(tmp_path / "redis", pki, acl, bind="0.0.0.0", port=6380)
    worker_url = f"rediss://relaybot-worker:{passwords['worker']}@127.0.0.1:6380/0"
    server = TlsRedis(conf, wrap=w.wrap).start(lambda: _ready(w, worker_url, pki.ca))
    model = w.run(lambda: FakeModelServer().start())
    mail_dir = tmp_path / "mail"
    imap = e.run(lambda: ImapServer(mail_dir).start())
    smtp = e.run(lambda: SmtpServer().start())
    hs = m.run(lambda: SynapseServer(tmp_path / "synapse").start())  # the bot's homeserver
    try:
        placeholders = {f"CHANGE-ME-{u}": p for u, p in passwords.items()}
        placeholders["/etc/relaybot/ca.pem"] = str(pki.ca)
        # the test's homeserver is named localhost: its users' ids replace the guide's
        bot, owner = m.run(lambda: (hs.register("relaybot", "bot-pw"), hs.register("ada")))
        placeholders |= {"@ada:example.org": owner.user_id, "@relaybot:example.org": bot.user_id}

        # the worker's host: /etc/relaybot/env, the worker and jobs units (guide step 4)
        worker_env = unit_env(
            tmp_path / "worker-home",
            fill(
                guide_file("/etc/relaybot/env"),
                {**placeholders, "redis.example.org": "127.0.0.1"},
                OPENAI_BASE_URL=model.base_url,
                OPENAI_MODEL="fake-model",
            ),
        )
        worker = procs.start("worker", ["worker"], worker_env, wrap=w.wrap)
        procs.start("jobs", ["jobs"], worker_env, wrap=w.wrap)

        # the e-mail gateway's host: /etc/relaybot/gateway-email.env (guide step 5)
        email_settings = fill(
            guide_file("/etc/relaybot/gateway-email.env"),
            {**placeholders, "redis.example.org": W_TO_E},
            RELAYBOT_EMAIL__IMAP_HOST="127.0.0.1",
            RELAYBOT_EMAIL__IMAP_PORT=str(imap.port),
            RELAYBOT_EMAIL__IMAP_TLS="plain",
            RELAYBOT_EMAIL__IMAP_USER=imap.user,
            RELAYBOT_EMAIL__IMAP_PASSWORD=imap.password,
            RELAYBOT_EMAIL__SMTP_HOST="127.0.0.1",
            RELAYBOT_EMAIL__SMTP_PORT=str(smtp.port),
            RELAYBOT_EMAIL__SMTP_TLS="plain",
            RELAYBOT_EMAIL__SMTP_USER="",  # the test's SMTP server takes mail without AUTH
            RELAYBOT_EMAIL__SMTP_PASSWORD="",
        )
        for key in ("RELAYBOT_OWNER__ALIASES", "RELAYBOT_EMAIL__TRUSTED_AUTHSERV_IDS"):
            assert key in email_settings, f"the guide's gateway-email.env lacks {key}"
        email_env = unit_env(tmp_path / "email-home", email_settings)

        # a certificate that does not verify: one line, exit 2, no endless wait
        rogue = {**email_env, "RELAYBOT_REDIS__CA_FILE": str(pki.rogue_ca)}
        refused = subprocess.run(
            [*e.wrap, sys.executable, "-m", "relaybot", "gateway", "email"],
            env=rogue, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert "Traceback" not in refused.stderr
        said = [ln for ln in refused.stderr.splitlines() if "does not verify" in ln]
        assert len(said) == 1 and "ca_file" in said[0], refused.stderr

        gateway = procs.start("gateway-email", ["gateway", "email"], email_env, wrap=e.wrap)

        # the Matrix gateway's host: /etc/relaybot/gateway-matrix.env (guide step 5)
        matrix_env = unit_env(
            tmp_path / "matrix-home",
            fill(
                guide_file("/etc/relaybot/gateway-matrix.env"),
                {**placeholders, "redis.example.org": W_TO_M},
                RELAYBOT_MATRIX__HOMESERVER=hs.url,
                RELAYBOT_MATRIX__PASSWORD=bot.password,
            ),
        )
        matrix = procs.start("gateway-matrix", ["gateway", "matrix"], matrix_env, wrap=m.wrap)
        gateway.wait_for_log("email.first_start", timeout=30)
        matrix.wait_for_log("matrix.backlog_skipped", timeout=30)
        dm = m.run(lambda: hs.create_room(owner, [bot.user_id], direct=True))

        def bot_said() -> list[str]:
            said = m.run(lambda: hs.messages(owner, dm))
            return [ev["content"]["body"] for ev in said if ev["sender"] == bot.user_id]

        wait_until(
            lambda: m.run(lambda: hs.members(owner, dm)).get(bot.user_id) == "join",
            timeout=30, message="the bot to join the owner's DM",
        )  # fmt: skip
        m.run(lambda: hs.send_text(owner, dm, "hello from matrix"))
        wait_until(bot_said, timeout=30, message="the bot's Matrix reply")
        assert "[matrix / owner]" in bot_said()[0] and "hello from matrix" in bot_said()[0]

        # the terminal's host: its .env (guide step 6), in the directory the chat starts in
        cli_dir = tmp_path / "terminal"
        cli_dir.mkdir()
        dotenv = fill(guide_file(".env"), {**placeholders, "redis.example.org": W_TO_C})
        (cli_dir / ".env").write_text("".join(f"{k}={v}\n" for k, v in dotenv.items()))
        cli_env = relaybot_env(tmp_path / "cli-home")
        del cli_env["RELAYBOT_DOTENV"]  # this one reads its .env, as the guide says

        def chat(text: str, timeout: float = 60) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [*c.wrap, sys.executable, "-m", "relaybot", "chat", "-m", text,
                 "--session", "remote", "--timeout", str(int(timeout))],
                env=cli_env, cwd=cli_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip

        first = chat("hello from the terminal host")
        out, err = first.communicate(timeout=90)
        assert first.returncode == 0, err
        assert "echo:" in out and "hello from the terminal host" in out

        sent: list[str] = []
        mid, msg = _owner_mail(1, "hello from my mail")
        e.run(lambda: imap.append(msg))
        sent.append(mid)
        wait_until(lambda: mid in _replies_to(smtp), timeout=45, message="the owner's reply")
        reply = smtp.messages()[0]
        body = reply.get_body(preferencelist=("plain",))  # type: ignore[attr-defined]
        assert "echo:" in body.get_content() and "hello from my mail" in body.get_content()

        # cut both links while a reply is being written and mail arrives (guide: "nothing is
        # lost or answered twice when the network goes")
        slow_mid, slow = _owner_mail(2, "slow one [[delay:8]]")
        e.run(lambda: imap.append(slow))
        sent.append(slow_mid)
        wait_until(lambda: _asked(model, "slow one"), timeout=30, message="the model at work")
        slow_chat = chat("typed before the cut [[delay:8]]", timeout=150)
        wait_until(lambda: _asked(model, "typed before the cut"), timeout=30, message="the chat")
        for dev in (dev_we, dev_wc, dev_wm):
            w.link_down(dev)
        cut_at = time.monotonic()
        m.run(lambda: hs.send_text(owner, dm, "said during the cut"))
        for n in (3, 4):
            mid_n, msg_n = _owner_mail(n, f"written during the cut {n}")
            e.run(lambda m=msg_n: imap.append(m))  # type: ignore[misc]
            sent.append(mid_n)
        time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))
        crossed = set(_replies_to(smtp)) & set(sent[2:])
        assert not crossed, f"a reply crossed a cut link: {crossed}"
        assert len(bot_said()) == 1, "a Matrix reply crossed a cut link"
        for dev in (dev_we, dev_wc, dev_wm):
            w.link_up(dev)

        wait_until(
            lambda: set(sent) <= set(_replies_to(smtp)),
            timeout=60,
            message=lambda: (
                f"replies to {sent}; got {_replies_to(smtp)}\n{gateway.log_text()[-3000:]}"
            ),
        )
        out, err = slow_chat.communicate(timeout=120)
        assert slow_chat.returncode == 0, err
        assert out.count("typed before the cut") == 1, out

        # settled: nothing pending, no reply queued or in flight; then count
        wait_until(
            lambda: w.run(lambda: _idle(worker_url, pki.ca)), timeout=30, interval=0.5,
            message="an idle bus",
        )  # fmt: skip
        wait_until(lambda: len(bot_said()) >= 2, timeout=60, message="the Matrix reply")
        replies = _replies_to(smtp)
        assert sorted(replies) == sorted(sent), replies  # each mail answered once
        entries = w.run(lambda: _stream_messages(worker_url, pki.ca))
        assert sorted(entries["email"]) == sorted(sent), entries  # each mail published once
        assert len(entries["cli"]) == len(set(entries["cli"])) == 2, entries
        assert len(entries["matrix"]) == len(set(entries["matrix"])) == 2, entries
        said = bot_said()
        assert len(said) == 2 and "said during the cut" in said[1], said  # answered once
        assert None is worker.returncode is gateway.returncode is matrix.returncode
    finally:
        procs.stop_all()
        smtp.stop()
        imap.stop()
        model.stop()
        server.stop()
        hs.stop()


def _idle(url: str, ca: Path) -> bool:
    client = redis.Redis.from_url(url, ssl_ca_certs=str(ca))
    try:
        for ch in ("email", "cli", "matrix"):
            for group in client.xinfo_groups(f"relaybot:inbound:{ch}"):
                if int(group["pending"]):
                    return False
        queued = [*client.scan_iter("relaybot:reply:*"), *client.scan_iter("relaybot:inflight:*")]
        return not queued
    finally:
        client.close()


def _stream_messages(url: str, ca: Path) -> dict[str, list[str]]:
    """The event ids of the messages (not the delivery reports) on each inbound stream."""
    client = redis.Redis.from_url(url, ssl_ca_certs=str(ca), decode_responses=True)
    try:
        return {
            ch: [
                fields["event_id"]
                for _id, fields in client.xrange(f"relaybot:inbound:{ch}")
                if fields.get("kind") == "message"
            ]
            for ch in ("email", "cli", "matrix")
        }
    finally:
        client.close()
