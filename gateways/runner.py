"""The process every channel's gateway runs: one lifecycle, one backoff, one delivery loop.

A channel's platform client is a :class:`Channel`: a platform client that logs in, runs its
inbound loops (platform events normalized by a pure module and XADDed) and sends one reply. The
rest is here, once:

- :func:`run_gateway`: the process. SIGTERM/SIGINT set :attr:`Runtime.stopping`; the heartbeat
  ``gateway:<channel>`` beats from the start and is removed on the way out. A channel whose
  config section is not configured logs ``<channel>.not_configured`` and idles, beating
  ``{"state": "not configured"}``, until signalled (``honcho start`` stops every process when one
  exits). Exit 2 on a :class:`FatalGatewayError` (``<channel>.fatal``: a person has to act), 1
  when a task crashed (``<channel>.crashed``), 4 when another gateway of the same account took
  its lease (``gateway.lease_lost``), 0 when stopped; ``<channel>.stopped`` last.
- One gateway per channel account (:mod:`gateways.lease`): a configured gateway takes the
  account's lease before it starts the channel; a second one waits as a standby
  (``gateway.waiting_for_lease``) and takes over when the first dies. The delivery loop sends
  nothing while the lease is not surely held.
- :class:`Backoff` and :meth:`Runtime.sleep`: retries wait 1 s, doubling up to 60 s, back to 1 s
  after a success; every wait ends early when the gateway is stopping.
- Redis going away (a restart) stops nothing: a loop that meets a transient Redis error
  (:data:`contract.outage.TRANSIENT`) waits it out with :meth:`Runtime.redis_away` (logs
  ``redis.unreachable`` with ``retry_in``, 1 s doubling to 15 s) and says
  ``redis.reconnected`` on its first success after (:meth:`contract.outage.Outage.recovered`).
- :class:`Delivery`: every ``tick`` seconds, the sessions the channel names (its own discovery)
  have their reply queues delivered through :func:`gateways.deliver.deliver_next`, in a worker
  thread, with the channel's ``send`` run on the event loop. A :class:`NotSent` (certainly not
  handed over) loses its ``delivered:<session>`` mark, so that the reply is sent again; any send
  failure makes that session wait without holding up the others, ``[delivery] retry_min``
  seconds doubling up to ``retry_max`` while it keeps failing, until the reply is sent or older
  than ``max_age`` (then expired); :class:`Undeliverable` (refused for good) reports the reply
  ``failed``; a fatal error stops the gateway; anything else (Redis down) backs the whole loop
  off. Ages are measured on Redis's clock. A channel with ``report_delivered = True`` has each
  delivery reported to the worker too (``reply_status`` delivered). The typing hook, when the
  channel has one, gets the sessions the worker is busy on (``busy:<session>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, runtime_checkable

import redis
import structlog

from contract.access import REFUSED, refusal
from contract.clock import RedisClock
from contract.config import Config
from contract.config_watch import POLL_EVERY, ConfigWatcher, gateway_uses
from contract.keys import Keys
from contract.liveness import Heartbeat
from contract.messages import Reply
from contract.outage import Backoff as _Backoff
from contract.outage import Outage
from gateways.deliver import ReplyQueue, Undeliverable, deliver_next
from gateways.lease import GatewayLease, LeaseLost

log = structlog.get_logger(__name__)

EXIT_STOPPED, EXIT_CRASHED, EXIT_FATAL, EXIT_LEASE_LOST = 0, 1, 2, 4
BACKOFF_START, BACKOFF_CAP = 1.0, 60.0
SEND_TIMEOUT = 180.0  # seconds one send may take before it counts as failed

TypingHook = Callable[[frozenset[str]], Awaitable[None]]


@runtime_checkable
class Reconfigurable(Protocol):
    def reconfigure(self, cfg: Config) -> None:
        """Apply a reloaded configuration (owners, allowlists, policies) from now on."""


class FatalGatewayError(RuntimeError):
    """A person has to act (a refused login, a lost session, a configuration that cannot work).

    Raised by ``send`` only when nothing was handed to the platform."""


class NotSent(RuntimeError):
    """The reply was certainly not handed to the platform: it may be sent again."""


class Backoff(_Backoff):
    """Delays between retries: 1 s, doubling, capped at 60 s; :meth:`reset` after a success."""

    def __init__(self) -> None:
        super().__init__(BACKOFF_START, BACKOFF_CAP)


class Runtime:
    """What the runner lends a channel: the stop signal, the heartbeat, stop-aware waits."""

    def __init__(self, name: str, r: redis.Redis, keys: Keys) -> None:
        self.name = name
        self.stopping = asyncio.Event()
        self.heartbeat = Heartbeat(r, keys, f"gateway:{name}")
        # may the gateway act on the platform now? (the account's lease is surely its own)
        self.acting: Callable[[], bool] = lambda: True

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less when the gateway is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)

    async def retry_after(self, backoff: Backoff, event: str, **info: Any) -> None:
        """Log a transient failure as ``event`` with the delay before the retry; wait it out."""
        delay = backoff.next()
        log.warning(event, retry_in=delay, **info)
        await self.sleep(delay)

    async def redis_away(self, outage: Outage, exc: BaseException) -> None:
        """A transient Redis error in a loop: log ``redis.unreachable``, wait the backoff out
        (less when stopping). The loop then retries what failed, and calls
        ``outage.recovered()`` once it went through."""
        await self.sleep(outage.failed(exc, gateway=self.name))


class Channel(Protocol):
    """A platform client, as the runner drives it.

    ``name`` is the channel: the sessions' prefix, the log events' (``<name>.*``) and the
    heartbeat's (``gateway:<name>``). Errors a person must fix are :class:`FatalGatewayError`.
    """

    name: str
    idempotent_sink: bool  # the platform drops a resent reply (deliver_next may resend)
    tick: float  # seconds between two looks for replies to deliver
    show_typing: TypingHook | None  # gets the sessions the worker is busy on; None: no typing

    async def start(self) -> None:
        """Connect or log in, retrying transient errors; returns early when stopping."""

    def inbound(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The loops that read the platform and publish, by name; they run until stopping."""

    async def sessions(self) -> list[str]:
        """The sessions whose reply queues are to be delivered now."""

    async def send(self, reply: Reply) -> None:
        """Hand one reply to the platform; :class:`NotSent` when it certainly was not."""

    async def close(self) -> None:
        """Release the platform client (also when ``start`` failed)."""


class _SendFailed(Exception):
    """``send`` failed after the reply may have been handed over (the cause says how)."""


class Delivery:
    """The delivery loop of one gateway."""

    def __init__(self, rt: Runtime, channel: Channel, r: redis.Redis, cfg: Config) -> None:
        self.rt, self.channel, self.r, self.keys = rt, channel, r, cfg.keys
        self.max_age = cfg.delivery.max_age
        self.retry_min, self.retry_max = cfg.delivery.retry_min, cfg.delivery.retry_max
        self.clock = RedisClock(r)  # one clock for the whole loop: its offset is cached
        # optional on a channel: report every delivery to the worker (memory records it)
        self.report_delivered = bool(getattr(channel, "report_delivered", False))
        self.waiting: dict[str, float] = {}  # session -> when it may be tried again (monotonic)
        self.delay: dict[str, float] = {}  # session -> its next wait, while its sends fail
        self.errors: dict[str, str] = {}  # session -> why its last send failed

    async def run(self) -> None:
        loop, backoff = asyncio.get_running_loop(), Backoff()
        while not self.rt.stopping.is_set():
            try:
                sessions = await self.channel.sessions()
                busy = await asyncio.to_thread(self.deliver, sessions, loop)
                if self.channel.show_typing is not None:
                    await self.channel.show_typing(busy)
            except FatalGatewayError:
                raise
            except REFUSED:  # Redis refused the account: the process stops (exit 2)
                raise
            except Exception as exc:  # Redis down, the platform unreachable, or a bug: back off
                if refusal(exc):  # a script of ours refused by the ACL: as REFUSED
                    raise
                await self.rt.retry_after(
                    backoff, f"{self.rt.name}.delivery_failed", error=repr(exc)
                )
                continue
            backoff.reset()
            await self.rt.sleep(self.channel.tick)

    def deliver(self, sessions: list[str], loop: asyncio.AbstractEventLoop) -> frozenset[str]:
        """(In a worker thread.) Deliver these sessions' replies; returns the busy sessions."""
        now = time.monotonic()
        for session in sessions:
            if not self.rt.acting():  # the lease may be another gateway's by now: send nothing
                break
            if self.waiting.get(session, 0.0) > now:
                continue
            self.waiting.pop(session, None)
            try:
                self._drain(session, loop)
            except NotSent as exc:
                self._wait(session, str(exc))
            except _SendFailed as exc:
                self._wait(session, repr(exc.__cause__))
            else:
                self.delay.pop(session, None)
                self.errors.pop(session, None)
        if self.channel.show_typing is None:
            return frozenset()
        return frozenset(s for s in sessions if self.r.exists(self.keys.busy(s)))

    def _drain(self, session: str, loop: asyncio.AbstractEventLoop) -> None:
        queue = ReplyQueue(
            self.r,
            self.keys,
            session,
            max_age=self.max_age,
            gateway=f"gateway:{self.rt.name}",
            clock=self.clock,
        )
        queue.last_error = self.errors.get(session, "")
        send = functools.partial(self._send, queue, loop)
        # deliver_next answers None for an expired (or possibly sent) reply too: go on until the
        # queue and the in-flight list are empty
        while self.r.exists(queue.queue, queue.inflight) and not self.rt.stopping.is_set():
            deliver_next(
                queue,
                send,
                timeout=0,
                idempotent_sink=self.channel.idempotent_sink,
                report_delivered=self.report_delivered,
            )

    def _send(self, queue: ReplyQueue, loop: asyncio.AbstractEventLoop, reply: Reply) -> None:
        future = asyncio.run_coroutine_threadsafe(self.channel.send(reply), loop)
        try:
            future.result(timeout=SEND_TIMEOUT)
        except (NotSent, FatalGatewayError):
            if not self.channel.idempotent_sink:  # an idempotent sink resends marked replies
                self.r.zrem(queue.delivered, reply.reply_id)  # certainly not sent: send again
            raise
        except Undeliverable:
            raise  # deliver_next reports it failed
        except Exception as exc:  # it stays in flight, marked: deliver_next's rules apply
            future.cancel()  # a send that timed out must not complete behind a resend
            raise _SendFailed from exc

    def _wait(self, session: str, error: str) -> None:
        delay = self.delay.get(session, self.retry_min)
        self.delay[session] = min(delay * 2, self.retry_max)
        log.warning(f"{self.rt.name}.send_failed", session=session, error=error, retry_in=delay)
        self.waiting[session] = time.monotonic() + delay
        self.errors[session] = error[:300]


def run_gateway(
    name: str,
    cfg: Config,
    r: redis.Redis,
    *,
    configured: bool,
    hint: str,
    make: Callable[[Runtime], Channel],
) -> int:
    """A channel's gateway process until SIGTERM/SIGINT; ``hint`` says how to configure it."""

    async def main() -> int:
        rt = Runtime(name, r, cfg.keys)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, rt.stopping.set)
        code = await (_serve(rt, cfg, r, make) if configured else _idle(rt, hint, cfg))
        log.info(f"{name}.stopped", code=code)
        return code

    return asyncio.run(main())


def watcher(rt: Runtime, cfg: Config, channel: object | None) -> ConfigWatcher:
    """The gateway's config.toml watcher: what its channel can take is reloaded (a channel with
    ``reconfigure``), the rest of what it uses waits for a restart. An idle gateway (``channel``
    None: its section is not configured) takes what its channel would reload when running:
    that needs no restart (the channel starts with it); the rest, e.g. its section configured
    meanwhile, does."""
    uses, reloads = gateway_uses(rt.name)  # an unknown channel: UnknownChannel
    if channel is not None and not isinstance(channel, Reconfigurable):
        reloads = ()
    watch = ConfigWatcher(cfg, process=f"gateway:{rt.name}", uses=uses, reloadable=reloads)
    rt.heartbeat.config = watch.fields()
    return watch


async def watch_config(rt: Runtime, watch: ConfigWatcher, channel: object | None) -> None:
    """Every few seconds: a changed config.toml (contract/config_watch.py), applied to the
    channel between its events; the heartbeat says what the gateway runs with."""
    while not rt.stopping.is_set():
        await rt.sleep(POLL_EVERY)
        try:
            reload = await asyncio.to_thread(watch.check)
        except OSError as exc:  # the file is unreadable now: looked at again next time
            log.warning("config.unreadable", error=str(exc))
            continue
        if reload is not None and isinstance(channel, Reconfigurable):
            channel.reconfigure(reload.config)
        rt.heartbeat.config = watch.fields()


async def _idle(rt: Runtime, hint: str, cfg: Config) -> int:
    """Not configured: stay up (honcho stops every process when one exits), beating; a section
    configured meanwhile is said to need a restart (config.restart_needed); what the running
    gateway would reload (owner.aliases, allowlists) is taken without one."""
    log.info(f"{rt.name}.not_configured", detail=hint)  # a state, not a fault (doctor warns)
    rt.heartbeat.info = {"state": "not configured"}
    watch = watcher(rt, cfg, None)
    rt.heartbeat.start()
    task = asyncio.create_task(watch_config(rt, watch, None), name=f"{rt.name}-config")
    try:
        await rt.stopping.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        rt.heartbeat.stop()
    return EXIT_STOPPED


async def _serve(
    rt: Runtime, cfg: Config, r: redis.Redis, make: Callable[[Runtime], Channel]
) -> int:
    try:
        channel = make(rt)
    except FatalGatewayError as exc:
        return _exit_code(rt.name, exc, "setup")
    lease, beating = GatewayLease(rt, r, cfg), False
    watch = watcher(rt, cfg, channel)
    lease.standby.config = watch.fields()  # a standby says which config it would run with
    try:
        if not await lease.acquire():  # a standby until then: the platform is left alone
            return EXIT_STOPPED
        rt.acting = lease.acting
        rt.heartbeat.info = {"state": "starting"}
        rt.heartbeat.start()
        beating = True
        try:
            await channel.start()
        except Exception as exc:  # a fatal error, or a bug: the same exits as a loop's
            return _exit_code(rt.name, exc, f"{rt.name}-start")
        if rt.stopping.is_set():
            return EXIT_STOPPED
        loops = {
            **channel.inbound(),
            "delivery": Delivery(rt, channel, r, cfg).run(),
            "lease": lease.watch(),
            "config": watch_config(rt, watch, channel),
        }
        return await _until_first_ends(rt, loops)
    finally:
        rt.stopping.set()
        if beating:
            rt.heartbeat.stop()
        await channel.close()
        await lease.release()


async def _until_first_ends(rt: Runtime, loops: dict[str, Coroutine[Any, Any, None]]) -> int:
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(c, name=f"{rt.name}-{n}") for n, c in loops.items()
    ]
    tasks.append(asyncio.create_task(rt.stopping.wait(), name=f"{rt.name}-stop"))
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return max(
            _exit_code(rt.name, None if t.cancelled() else t.exception(), t.get_name())
            for t in done
        )
    finally:
        rt.stopping.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _exit_code(name: str, error: BaseException | None, task: str) -> int:
    if error is not None and refusal(error):  # not waited out: `relaybot` says it, exit 2
        raise error
    if isinstance(error, LeaseLost):  # logged as gateway.lease_lost
        return EXIT_LEASE_LOST
    if isinstance(error, FatalGatewayError):
        log.error(f"{name}.fatal", error=str(error))
        return EXIT_FATAL
    if error is not None:
        log.error(f"{name}.crashed", error=repr(error), task=task)
        return EXIT_CRASHED
    return EXIT_STOPPED
