"""A power cut of the Redis host under terminal and e-mail traffic (issue 11, item 3).

Real pieces: a redis-server configured like the embedded one (``appendonly yes``, and the
``appendfsync`` of ``deploy.embedded.server_args``: ``always``), ``relaybot worker``, ``relaybot
gateway email`` against pymap (IMAP) and aiosmtpd (SMTP), and the terminal gateway's publish path
(``contract.bus.publish`` with :class:`contract.durable.Durable`, what ``relaybot chat`` runs)
driven from this test.

**How the cut is simulated, and why it is honest.** With ``appendfsync always`` Redis writes and
fsyncs the AOF for one event-loop turn *before* it sends any reply of that turn; so what a power
cut can lose is at most a tail of the file whose replies no client has received. We cannot see
from outside where the last completed fsync ended, so we cut harder than any real cut can: at the
kill -9, the AOF is cut back to the end of the last write this test *saw acknowledged* (the last
XADD whose id a publisher got back: the terminal publishes here, the e-mail gateway logs
``email.published`` right after its durable publish returned), MULTI/EXEC kept whole.
Everything after it is lost, also writes whose replies the worker or a gateway may already have
had (acks, reply pushes, delivery marks, cursor moves): a prefix of the file, i.e. a consistent
rollback, at least as deep as any power cut of a server that fsyncs before replying. Then Redis
starts again on that file, the worker and the gateway (killed with the host) start again, and
messages whose publish failed are published again by their sender (same event id: the terminal's
retry). (Were the embedded Redis still at ``everysec``, as before this change, the cut would be
what that policy allows: the last second of writes, never fsynced; then acknowledged entries
vanish and (a) fails.)

**What must hold.** (a) Every message whose publish was acknowledged is still in its stream after
the cut (durable acceptance; holds on its own). (b) Every message is answered exactly once end to
end (one SMTP reply per mail, one queued reply per terminal message), memory holds exactly one
inbound and one outbound row per message, nothing stays pending. (b) depends on the lead
engineer's parallel work: memory deduplication by (channel, platform event id), so an entry
published again after the rollback is answered once, and the reconciliation that queues again
replies recorded in memory but lost from Redis.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.bus import publish
from contract.config import load_config
from contract.durable import Durable, NotDurable
from contract.keys import Keys
from contract.messages import InboundMessage, Reply
from deploy.embedded import server_args
from gateways.cli.gateway import normalize
from tests.support.fakemodel import FakeModelServer
from tests.support.mailservers import ImapServer, SmtpServer, email_config, make_message
from tests.support.procs import Proc, Procs, relaybot_env, wait_until, write_config
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

BOT = "bot@example.org"
OWNER = "owner@example.org"
MAILS = 24
CHATS = 24


def test_a_power_cut_of_the_redis_host_loses_and_repeats_nothing(
    tmp_path: Path,
    prefix: str,
    procs: Procs,
    imap: ImapServer,
    smtp: SmtpServer,
    model_server: FakeModelServer,
) -> None:
    keys = Keys(prefix)
    fsync = embedded_fsync_policy(tmp_path)
    server = RedisServer(
        tmp_path / "redis", persistence=("--appendonly", "yes", "--appendfsync", fsync)
    ).start()
    aof = server.workdir / "appendonly.aof"
    sizes = _SizeWatch(aof)
    env = _env(tmp_path, server.url, prefix, model_server, imap, smtp)
    r = redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=2)
    worker = procs.worker(env, r=r, keys=keys)
    gateway = procs.start("gateway-email", ["gateway", "email"], env)
    gateway.wait_for_log("email.ready", timeout=30)

    terminal = _Terminal(server.url, keys)
    mail_ids = [f"<cut.{i}@example.org>" for i in range(MAILS)]
    half = MAILS // 2
    try:
        # -- traffic, then the cut in the middle of it ----------------------------------------
        terminal.start()
        sizes.start()
        for mid in mail_ids[:half]:
            imap.append(make_message(message_id=mid, subject=f"mail {mid}"))
            time.sleep(0.05)
        wait_until(lambda: len(gateway.events("email.published")) >= half // 2, timeout=30)
        wait_until(lambda: terminal.acked_count() >= CHATS // 3, timeout=30)
        assert server.proc is not None
        server.proc.kill()  # the host loses power: Redis first ...
        server.proc.wait(10)
        sizes.stop()
        for proc in (worker, gateway):  # ... and every process on it
            proc.popen.kill()
            proc.popen.wait(10)
        terminal.pause()

        acked = terminal.acked() | _gateway_acked(gateway, keys)
        before = aof.stat().st_size
        if fsync == "always":
            cut = cut_aof(aof, acked)
        else:  # everysec: what was written in the last second was never fsynced
            cut = cut_to(aof, sizes.size_at(time.monotonic() - 1.0))
        cut_note = f"appendfsync {fsync}: AOF cut from {before} to {cut} bytes"
        assert cut < before, f"the cut removed nothing ({cut_note}): the test proves nothing"

        # -- the host comes back ----------------------------------------------------------------
        server.start()
        for stream, sid in sorted(acked):  # (a): nothing acknowledged was lost
            assert r.xrange(stream, sid, sid), f"acknowledged {stream} {sid} lost; {cut_note}"
        worker = procs.worker(env, r=r, keys=keys, timeout=60)
        gateway = procs.start("gateway-email", ["gateway", "email"], env)
        gateway.wait_for_log("email.ready", timeout=30)
        terminal.resume()
        for mid in mail_ids[half:]:
            imap.append(make_message(message_id=mid, subject=f"mail {mid}"))
            time.sleep(0.05)
        terminal.join(60)
        assert terminal.error is None, terminal.error

        # -- (b): answered exactly once, memory complete, nothing pending ----------------------
        def all_mail_answered() -> bool:
            got = {m["In-Reply-To"] for m in smtp.messages()}
            return all(mid in got for mid in mail_ids)

        wait_until(all_mail_answered, timeout=90, message="a reply to every mail")
        wait_until(
            lambda: set(_cli_replies(r, keys)) >= set(terminal.event_ids),
            timeout=90,
            message="a reply to every terminal message",
        )
        wait_until(lambda: _pending(r, keys) == 0, timeout=60, message="nothing pending")
        time.sleep(2)  # a duplicate answer would come now, not later
        # one answer per mail: a send the cut interrupted is sent again under the same Message-ID
        # (the e-mail gateway's idempotent resend, which the receiving side recognises)
        answers: dict[str, set[str]] = {}
        for m in smtp.messages():
            answers.setdefault(m["In-Reply-To"], set()).add(m["Message-ID"])
        assert {mid: ids for mid, ids in answers.items() if len(ids) != 1} == {}, cut_note
        per_chat = Counter(_cli_replies(r, keys))
        assert {e: n for e, n in per_chat.items() if n != 1} == {}
        assert _pending(r, keys) == 0
        _assert_memory_complete(tmp_path / "home" / "memory.sqlite3", mail_ids, terminal)
    finally:
        terminal.stop()
        r.close()
        server.stop()


# -- the terminal: durable publishes, retried with the same event id after a failure ------------


class _Terminal(threading.Thread):
    """``relaybot chat`` as far as publishing goes: one message at a time, through
    :class:`Durable`; a publish that failed (Redis gone) is sent again, same event id."""

    def __init__(self, url: str, keys: Keys) -> None:
        super().__init__(daemon=True)
        self.url, self.keys = url, keys
        self.messages = [normalize("powercut", f"terminal {i}") for i in range(CHATS)]
        self.event_ids = [m.event_id for m in self.messages]
        self._acked: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._go = threading.Event()
        self._go.set()
        self._halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for msg in self.messages:
                self._send(msg)
                time.sleep(0.3)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _send(self, msg: InboundMessage) -> None:
        while not self._halt.is_set():
            self._go.wait()
            r = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=1)
            try:
                sid = publish(r, self.keys, msg, durable=Durable(r))
            except (redis.RedisError, NotDurable, OSError):
                time.sleep(0.2)  # Redis is away: the sender tries again
                continue
            finally:
                r.close()
            with self._lock:
                self._acked.append((self.keys.inbound_of("cli"), sid.split("/", 1)[1]))
            return

    def acked_count(self) -> int:
        with self._lock:
            return len(self._acked)

    def acked(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._acked)

    def pause(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def stop(self) -> None:
        self._halt.set()
        self._go.set()


def _gateway_acked(gateway: Proc, keys: Keys) -> set[tuple[str, str]]:
    """The entries the e-mail gateway was told were durable (it logs right after)."""
    out = set()
    for event in gateway.events("email.published"):
        channel, raw = str(event["stream_id"]).split("/", 1)
        out.add((keys.inbound_of(channel), raw))
    return out


# -- the AOF cut ---------------------------------------------------------------------------------


def parse_aof(data: bytes) -> list[tuple[int, int, list[bytes]]]:
    """(start, end, args) of each complete RESP command in an AOF; a torn tail is left out."""
    out: list[tuple[int, int, list[bytes]]] = []
    pos = 0
    while pos < len(data):
        start = pos
        try:
            if data[pos : pos + 1] != b"*":
                raise ValueError(f"not a command at {pos}")
            eol = data.index(b"\r\n", pos)
            count = int(data[pos + 1 : eol])
            pos = eol + 2
            args = []
            for _ in range(count):
                eol = data.index(b"\r\n", pos)
                size = int(data[pos + 1 : eol])
                pos = eol + 2
                if pos + size + 2 > len(data):
                    raise ValueError("torn")
                args.append(data[pos : pos + size])
                pos += size + 2
        except ValueError:
            break  # a torn last command: not part of the file any cut can keep
        out.append((start, pos, args))
    return out


def embedded_fsync_policy(tmp_path: Path) -> str:
    """The embedded Redis's ``appendfsync``: the test runs Redis as relaybot does."""
    cfg = load_config(env={"RELAYBOT_HOME": str(tmp_path / "embedded")})
    args = server_args(cfg)
    return args[args.index("--appendfsync") + 1]


class _SizeWatch(threading.Thread):
    """The AOF's size every 20 ms, to know what it held a second before the cut (everysec)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.02):
            with contextlib.suppress(OSError):
                self.samples.append((time.monotonic(), self.path.stat().st_size))

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def size_at(self, when: float) -> int:
        return max((size for t, size in self.samples if t <= when), default=0)


def cut_to(path: Path, size: int) -> int:
    """Cut the AOF back to the last whole command that ends at or before ``size``."""
    data = path.read_bytes()
    end = max((e for _s, e, _a in parse_aof(data) if e <= size), default=0)
    with path.open("r+b") as f:
        f.truncate(end)
    return end


def cut_aof(path: Path, acked: set[tuple[str, str]]) -> int:
    """Cut the AOF back to the end of the last acknowledged XADD (its MULTI/EXEC kept whole);
    returns the new size. See the module docstring for why this is a legal power cut."""
    data = path.read_bytes()
    commands = parse_aof(data)
    wanted = {(s.encode(), i.encode()) for s, i in acked}
    last = -1
    for n, (_s, _e, args) in enumerate(commands):
        if args[0].upper() == b"XADD" and len(args) > 2 and (args[1], args[2]) in wanted:
            last = n
    assert last >= 0, "no acknowledged XADD in the AOF: the traffic did not reach Redis"
    end = commands[last][1]
    in_multi = False
    for _s, e, args in commands[: last + 1]:
        verb = args[0].upper()
        in_multi = verb == b"MULTI" or (in_multi and verb != b"EXEC")
        if verb == b"EXEC":
            end = e
    if in_multi:
        end = next(e for _s, e, args in commands[last:] if args[0].upper() == b"EXEC")
    assert end <= len(data)
    with path.open("r+b") as f:
        f.truncate(end)
    return end


# -- what is in Redis and memory at the end ------------------------------------------------------


def _cli_replies(r: redis.Redis, keys: Keys) -> list[str]:
    """The event ids answered by the replies queued for the terminal session (undelivered)."""
    raw: Any = r.lrange(keys.reply("cli:powercut"), 0, -1)
    return [Reply.from_json(x).in_reply_to for x in raw]


def _pending(r: redis.Redis, keys: Keys) -> int:
    total = 0
    for channel in ("cli", "email"):
        try:
            groups: Any = r.xinfo_groups(keys.inbound_of(channel))
        except redis.ResponseError:
            continue
        total += sum(int(g["pending"]) for g in groups)
    return total


def _assert_memory_complete(db: Path, mail_ids: list[str], terminal: _Terminal) -> None:
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT direction, session, text FROM log").fetchall()
    finally:
        conn.close()
    inbound_cli = Counter(t for d, s, t in rows if d == "in" and s == "cli:powercut")
    assert {m.text: inbound_cli[m.text] for m in terminal.messages} == {
        m.text: 1 for m in terminal.messages
    }
    out_cli = sum(1 for d, s, _t in rows if d == "out" and s == "cli:powercut")
    assert out_cli == CHATS
    mail_in = [t for d, s, t in rows if d == "in" and s.startswith("email:")]
    mail_out = [t for d, s, t in rows if d == "out" and s.startswith("email:")]
    assert len(mail_in) == len(mail_ids) and len(mail_out) == len(mail_ids)


def _env(
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    model: FakeModelServer,
    imap: ImapServer,
    smtp: SmtpServer,
) -> dict[str, str]:
    home = tmp_path / "home"
    write_config(
        home,
        email_config(
            imap, smtp, bot=BOT, owner=OWNER, more="rate_per_thread = 100\nrate_per_sender = 1000"
        ),
    )
    return relaybot_env(home, redis_url=redis_url, prefix=prefix, model_url=model.base_url)
