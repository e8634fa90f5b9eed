"""The terminal gateway: ``relaybot chat``.

Each terminal is its own session (``cli:<name>``); the conversation is the session and it is the
owner's own. A message is XADDed, then replies for the session are delivered from its reply queue
while a "thinking" indicator runs on stderr (only when stderr is a terminal).
"""

from __future__ import annotations

import getpass
import itertools
import secrets
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import redis
import structlog

from contract.bus import publish, stream_id, text
from contract.config import Config
from contract.config_watch import ConfigWatcher
from contract.durable import Durable
from contract.keys import Keys
from contract.liveness import CHAT_BEAT, Heartbeat, drop_ended_chats
from contract.messages import MAX_TEXT_CHARS, InboundMessage, Kind, Privacy, Reply, new_event_id
from contract.outage import TRANSIENT, Outage
from contract.terminal import safe
from gateways.deliver import ReplyQueue, deliver_next

log = structlog.get_logger(__name__)

CHANNEL = "cli"
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_LABELS = {
    "running": "thinking…",
    "waiting": "waiting behind another turn…",
    None: "waiting for the worker…",
}
LOOK_BACK = 1000  # newest entries searched for a message whose XADD's answer was lost


def new_session_name() -> str:
    return f"{getpass.getuser()}-{secrets.token_hex(3)}"


def normalize(session: str, text: str, *, sender: str | None = None) -> InboundMessage:
    """A line typed in the terminal as a normalized message (pure)."""
    note = ""
    if len(text) > MAX_TEXT_CHARS:
        note = f"\n[truncated by relaybot: the message had {len(text)} characters]"
        text = text[: MAX_TEXT_CHARS - len(note)] + note
    return InboundMessage(
        kind=Kind.MESSAGE,
        channel=CHANNEL,
        session=f"cli:{session}",
        conversation=f"cli:{session}",
        sender=sender or getpass.getuser(),
        sender_name=sender or getpass.getuser(),
        privacy=Privacy.OWNER,
        text=text,
        ts=time.time(),
        event_id=new_event_id(),
    )


class _Debug:
    """A logger whose every line is a debug line (``relaybot -v chat`` shows them)."""

    def __getattr__(self, _level: str) -> Callable[..., Any]:
        debug: Callable[..., Any] = log.debug
        return debug


class ChatBeat(Heartbeat):
    """A terminal chat's heartbeat (``gateway:cli:<session>``).

    Its config fields follow config.toml (the chat reloads nothing, but its view of the file is
    current: doctor never sees it running "an older config" after an onboarding, and ``/status``
    shows the model the file configures, as the worker uses it); only a changed [redis] waits
    for a new chat (``restart_needed``). Its first beat removes the beats of chats that ended
    without removing their own (contract/liveness.py: CHAT_ENDED_AFTER)."""

    def __init__(self, r: redis.Redis, keys: Keys, session: str, watch: ConfigWatcher) -> None:
        super().__init__(r, keys, f"{CHAT_BEAT}{session}", config=watch.fields())
        self.watch = watch
        self._lock = threading.Lock()  # the beating thread and /status both look at the file
        self._swept = False

    def follow(self, *, now: bool = False) -> Config:
        """The newest valid config.toml (its config fields updated); ``now``: look at the file
        now, not at most every couple of seconds."""
        with self._lock:
            try:
                self.watch.check() if now else self.watch.poll()
            except OSError as exc:
                log.debug("config.unreadable", process=self.watch.process, error=str(exc))
            self.config = self.watch.fields()
            return self.watch.latest

    def refresh(self) -> None:
        self.follow()
        if not self._swept:
            try:
                drop_ended_chats(self._r, self._keys)
                self._swept = True
            except redis.RedisError as exc:  # no HGETALL (a Redis 6.2 ACL), or Redis is down
                log.info("heartbeat.sweep_skipped", error=str(exc))
                self._swept = not isinstance(exc, TRANSIENT)


class Terminal:
    """One chat session in a terminal."""

    def __init__(
        self,
        cfg: Config,
        r: redis.Redis,
        session: str,
        *,
        out: TextIO = sys.stdout,
        err: TextIO = sys.stderr,
        show: Callable[[Reply], None] | None = None,
    ) -> None:
        self.cfg, self.r, self.session = cfg, r, session
        self.show = show  # how a reply is shown (relaybot chat renders Markdown on a terminal)
        self.keys = cfg.keys
        self.out, self.err = out, err
        self.queue = ReplyQueue(
            r, self.keys, f"cli:{session}", max_age=cfg.delivery.max_age, gateway="gateway:cli"
        )
        # its heartbeat, doctor and status say a rejected or changed config.toml: the terminal
        # is kept for the conversation
        watch = ConfigWatcher(cfg, process="gateway:cli", uses=("redis",), logger=_Debug())
        self.heartbeat = ChatBeat(r, self.keys, session, watch)
        self.durable = Durable(r)  # "sent" is printed only for a message that is on disk
        self._spin = itertools.cycle(_SPINNER)
        self._spinning = False
        self._printed: set[str] = set()  # reply ids shown by this process
        self.before_show: Callable[[], None] | None = None  # e.g. clear the prompt's line

    def send(self, text: str, *, patience: float = 0.0) -> str:
        """XADD one line; its stream id. Redis going away is waited out for ``patience``
        seconds (then the last error is raised): :meth:`publish_once`."""
        msg = normalize(self.session, text)
        sid = self.publish_once(msg, patience=patience)
        log.info("cli.sent", stream_id=sid, session=msg.session)
        return sid

    def publish_once(self, msg: InboundMessage, *, patience: float) -> str:
        """XADD ``msg``, once, also when the connection drops around it.

        A connection lost after the XADD was sent leaves it unknown whether Redis took it. Once
        Redis answers again, the entry is looked for by its event id among the newest of the
        channel's stream (:data:`LOOK_BACK`); it is XADDed again only when absent (the worker
        also records one message per (channel, event id), so even a second copy is answered
        once)."""
        deadline = time.monotonic() + patience
        outage = Outage("cli")
        sent = False  # an XADD was sent, its answer lost
        while True:
            try:
                if sent and (found := self._find(msg.event_id)) is not None:
                    outage.recovered(found=found)
                    return found
                sent = True
                sid = publish(self.r, self.keys, msg, durable=self.durable)
                outage.recovered()
                return sid
            except TRANSIENT as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(outage.failed(exc, session=msg.session), left))

    def _find(self, event_id: str) -> str | None:
        """The stream id of this channel's entry with ``event_id``, among the newest ones."""
        stream, newest, seen = self.keys.inbound_of(CHANNEL), "+", 0
        try:
            while seen < LOOK_BACK:
                page: Any = self.r.xrevrange(stream, newest, "-", count=100)
                for raw_id, fields in page:
                    if fields.get(b"event_id") == event_id.encode():
                        return stream_id(CHANNEL, raw_id)
                seen += len(page)
                if len(page) < 100:
                    return None
                newest = f"({text(page[-1][0])}"
        except redis.ResponseError as exc:  # an ACL without XREVRANGE: send again
            log.warning("cli.cannot_look_up", error=str(exc))
        return None

    def drain(self) -> int:
        """Print replies that were queued while no terminal was attached."""
        count = 0
        # deliver_next answers None for an expired (or possibly sent) reply too: go on until the
        # queue and the in-flight list are empty, not until the first reply that was not shown
        while self.r.exists(self.queue.queue, self.queue.inflight):
            if deliver_next(self.queue, self._print_earlier, timeout=0) is not None:
                count += 1
        return count

    def poll(self) -> int:
        """Show the replies that have arrived, without waiting (the chat at its prompt: a turn
        replayed after a crash, a message sent for this session elsewhere); how many."""
        shown = 0
        for _ in range(100):  # a bound: the rest at the next poll
            if not self.r.exists(self.queue.queue, self.queue.inflight):
                break
            if deliver_next(self.queue, self._print, timeout=0, idempotent_sink=True):
                shown += 1
        return shown

    def state(self) -> str | None:
        """The worker's mark of this session (worker/busy.py): ``waiting`` (its turn waits
        behind other turns), ``running`` (an older worker's ``1`` too), None (no mark)."""
        raw: Any = self.r.get(self.keys.busy(f"cli:{self.session}"))
        if raw is None:
            return None
        return "waiting" if raw == b"waiting" else "running"

    def taken(self) -> bool:
        """Whether the worker runs a turn of this session (it shows as "thinking…")."""
        return self.state() == "running"

    def wait_for(self, stream_id: str, timeout: float) -> Reply | None:
        """Deliver this session's replies until the one answering ``stream_id`` arrives.

        The terminal is an idempotent sink within this process (:meth:`_print` shows a reply
        id once), so a reply left in flight by a connection lost mid-delivery is still shown,
        not dropped as "maybe delivered"."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self._tick()
                reply = deliver_next(self.queue, self._print, timeout=0.1, idempotent_sink=True)
                if reply is not None and reply.answers == stream_id:
                    return reply
            return None
        finally:
            self.clear()

    def _print(self, reply: Reply) -> None:
        if reply.reply_id in self._printed:
            return
        self._printed.add(reply.reply_id)
        self.clear()
        if self.before_show is not None:
            self.before_show()
        if self.show is not None:
            self.show(reply)
            return
        prefix = "! " if reply.kind == "error" else ""
        self.out.write(f"{prefix}{safe(reply.text)}\n")
        self.out.flush()

    def _print_earlier(self, reply: Reply) -> None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(reply.created))
        self.out.write(f"(reply from {when}, queued while this session was away)\n")
        self._print(reply)

    def _tick(self) -> None:
        if not self.err.isatty():
            return
        label = _LABELS[self.state()]
        self.err.write(f"\r{next(self._spin)} {label}\033[K")
        self.err.flush()
        self._spinning = True

    def clear(self) -> None:
        if self._spinning:
            self.err.write("\r\033[K")
            self.err.flush()
            self._spinning = False
