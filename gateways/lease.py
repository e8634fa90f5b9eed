"""Exactly one gateway per channel account: the gateway lease (issue 12).

Two ``relaybot gateway <channel>`` processes for the same platform account and Redis prefix would
both read the platform and both deliver replies. The runner therefore holds a
:class:`contract.liveness.Lease` — the worker's — on ``Keys.gateway_lease(channel, account)``
before it starts the channel (logs in, reads, delivers):

- a gateway restarted on the same host after a crash does not wait for its dead predecessor's
  lease to run out: a holder whose process is gone (same host name and PID namespace, no such
  PID) is freed at once (``gateway.lease_freed``);
- a second gateway of the same account is a **standby**: it logs ``gateway.waiting_for_lease``
  once, with the holder, beats ``gateway:<channel>:standby`` (``state: standby``) instead of
  ``gateway:<channel>``, touches nothing on the platform, and takes over when the holder's lease
  expires (the holder died: within ``[worker] lease_seconds`` and a poll);
- the holder renews it; Redis going away is ridden out. If the lease key vanished with Redis's
  data (or expired while Redis was away) and nobody else took it, the holder takes it again
  (``gateway.lease_regained``) and goes on;
- a holder that finds **another** process holding its lease (it was paused, or cut off from
  Redis, longer than the lease) stops acting at once: it logs ``gateway.lease_lost`` and exits 4
  (a supervisor restarts it, and it waits as a standby). Between a renewal that could not go
  through and that finding, the delivery loop sends nothing (:meth:`GatewayLease.acting`).

The terminal (``relaybot chat``) is not a single-account gateway: it takes no lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Protocol

import redis
import structlog

from contract import channels as registry
from contract.config import Config
from contract.liveness import Heartbeat, Lease, process_identity
from contract.outage import TRANSIENT, Outage


class Runtime(Protocol):
    """What the lease needs of the gateway's runtime (gateways/runner.py)."""

    name: str
    stopping: asyncio.Event

    async def sleep(self, seconds: float) -> None: ...

    async def redis_away(self, outage: Outage, exc: BaseException) -> None: ...


log = structlog.get_logger(__name__)

WATCH_EVERY = 0.2  # seconds between two looks at the renewal thread's verdict
# KEYS: lease; ARGV: the holder seen. Frees the lease of a holder known to be dead, if it still
# holds it (nobody else took it meanwhile).
_FREE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class LeaseLost(RuntimeError):
    """Another gateway of the same account holds the lease: this one must stop acting."""


def _pid_namespace() -> str:
    """This process's PID namespace (Linux), so that a PID is compared only with PIDs of the
    same namespace (two containers may share a host name); "" where there is none to read."""
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    return ""


def identity(channel: str) -> str:
    """A gateway's lease token: ``gateway:<channel>@<host>:<pid>#<pid namespace>``."""
    return f"{process_identity(f'gateway:{channel}')}#{_pid_namespace()}"


def died_here(holder: str) -> bool:
    """Is ``holder`` (a lease token) a gateway process of this host (and PID namespace) that is
    gone? Then its lease need not run out: a gateway restarted after a crash takes over at once.
    False whenever in doubt (another host, a PID in use, a token of another form)."""
    ident, _, namespace = holder.rpartition("#")
    where, _, pid = ident.rpartition(":")
    host = where.rpartition("@")[2]
    if host != socket.gethostname() or namespace != _pid_namespace() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def account_of(cfg: Config, channel: str) -> str:
    """The platform account a channel's gateway acts as: a stable string (it is digested into
    the lease key), from the channel's spec (contract/channels.py: ``account``). A channel the
    registry does not list, or whose spec names no account, is an error: two gateways of two
    accounts must never share one lease."""
    spec = registry.channel(channel)
    if spec.account is None:
        raise ValueError(f"channel {channel!r} names no account: its gateway cannot take a lease")
    return spec.account(getattr(cfg, channel) if spec.section is not None else None)


class GatewayLease:
    """The lease of one gateway process: wait for it, watch it, release it."""

    def __init__(self, rt: Runtime, r: redis.Redis, cfg: Config) -> None:
        self.rt, self.r = rt, r
        self.account = account_of(cfg, rt.name)
        self.key = cfg.keys.gateway_lease(rt.name, self.account)
        self.ttl = cfg.worker.lease_seconds
        self.lease = Lease(r, self.key, identity(rt.name), self.ttl)
        self._free = r.register_script(_FREE)
        self.poll = min(1.0, self.ttl / 5)  # a standby's look at a free lease
        self.standby = Heartbeat(r, cfg.keys, f"gateway:{rt.name}:standby")
        self.held = False

    def acting(self) -> bool:
        """May the gateway act on the platform now (the lease is surely still its own)?"""
        return self.held and self.lease.surely_held()

    async def acquire(self) -> bool:
        """Take the lease, waiting as a standby while another gateway holds it; False when the
        gateway is stopping first."""
        outage, announced, beating = Outage(f"{self.rt.name}.lease"), False, False
        try:
            while not self.rt.stopping.is_set():
                try:
                    if await asyncio.to_thread(self.lease.try_acquire):
                        outage.recovered()
                        self._hold("gateway.lease_acquired")
                        return True
                    holder = await asyncio.to_thread(self.lease.holder)
                    if holder is not None and died_here(holder):
                        await asyncio.to_thread(self._free, keys=[self.key], args=[holder])
                        log.info("gateway.lease_freed", holder=holder, detail="its process is gone")
                        continue
                    outage.recovered()
                except TRANSIENT as exc:  # Redis restarting as the gateway starts
                    await self.rt.redis_away(outage, exc)
                    continue
                if holder is None:  # it expired between the two calls: try again at once
                    continue
                self.standby.info = {"state": "standby", "holder": holder}
                if not announced:
                    log.warning(
                        "gateway.waiting_for_lease",
                        channel=self.rt.name,
                        holder=holder,
                        key=self.key,
                        account=self.account,
                    )
                    announced = True
                if not beating:
                    self.standby.start()
                    beating = True
                await self.rt.sleep(self.poll)
            return False
        finally:
            if beating:
                self.standby.stop()

    def _hold(self, event: str) -> None:
        self.lease.start_renewing()
        self.held = True
        log.info(
            event,
            channel=self.rt.name,
            holder=self.lease.token,
            key=self.key,
            epoch=self.lease.epoch,
        )

    async def watch(self) -> None:
        """Runs beside the channel's loops until stopping. The renewal thread found the lease
        gone: take it again if nobody else did (Redis lost it, or it expired while Redis was
        away), else raise :class:`LeaseLost`."""
        while not self.rt.stopping.is_set():
            if self.lease.lost.is_set():
                await self._regain()
            await self.rt.sleep(WATCH_EVERY)

    async def _regain(self) -> None:
        self.held = False
        outage = Outage(f"{self.rt.name}.lease")
        while not self.rt.stopping.is_set():
            try:
                if await asyncio.to_thread(self.lease.try_acquire):
                    outage.recovered()
                    self._hold("gateway.lease_regained")
                    return
                holder = await asyncio.to_thread(self.lease.holder)
                outage.recovered()
            except TRANSIENT as exc:
                await self.rt.redis_away(outage, exc)
                continue
            if holder is not None:
                log.error("gateway.lease_lost", channel=self.rt.name, holder=holder, key=self.key)
                raise LeaseLost(f"another gateway of this account holds the lease: {holder}")

    async def release(self) -> None:
        """Stop renewing; free the lease if it is still this process's (a standby then takes
        over at once)."""
        if self.held or self.lease.lost.is_set():
            self.held = False
            await asyncio.to_thread(self.lease.release)
