"""The terminal channel's spec (contract/channels.py): ``relaybot chat`` is its gateway.

It has no config section and takes no lease (one terminal per person, many at once); its ACL
user may read the worker's lease (``relaybot chat`` says when the worker is not running) and
the worker's MCP facts (``relaybot tools``, doctor: ``Keys.mcp``; no gateway's account may: they
name the owner's tools).

``relaybot status`` and ``/status`` run under this account too: a read-only selector (Redis >= 7,
``%R~``) lets it count what status shows -- the length, group and pending counts of every
inbound stream (XLEN, XINFO GROUPS, XPENDING: ids and counts, never an entry's text), the dead
letters, the heartbeats, the lease's TTL, the jobs queue's counts, and the scheduler's: the
TTL of rq's scheduler lock (whether a jobs process runs it) and the number of scheduled fire
jobs (relaybot/scheduler_health.py) -- and nothing more: no
XRANGE of another channel's stream, no SCAN of other sessions' keys (their names say who talks
to the assistant), no read of a reply queue or a job. ``python -m deploy.acl --redis-6.2``
leaves the selector out (6.2 refuses the file); status then says what it could not read.
"""

from __future__ import annotations

from contract.channels import Channel, Probe
from contract.keys import Keys

ACL = (
    "~{prefix}inbound:cli ~{prefix}dead ~{prefix}heartbeats ~{prefix}mcp ~{prefix}worker:lease "
    "~{prefix}reply:cli:* ~{prefix}inflight:cli:* ~{prefix}delivered:cli:* ~{prefix}busy:cli:* "
    "-@all +ping +hello +auth +client|setname +xadd +lmove +blmove +lindex +lrem +zadd +zscore "
    "+zremrangebyscore +exists +get +hset +hdel +multi +exec +discard +time "
    # relaybot status: counts only, read-only keys (Redis >= 7 selector)
    "(%R~{prefix}inbound* %R~{prefix}dead %R~{prefix}heartbeats %R~{prefix}worker:lease "
    "%R~rq:queue:{prefix}jobs %R~rq:wip:{prefix}jobs %R~rq:failed:{prefix}jobs "
    "%R~rq:scheduled:{prefix}jobs %R~rq:scheduler-lock:{prefix}jobs "
    "+xlen +xinfo|groups +xpending +hgetall +pttl +llen +zcard)"
)


def probes(keys: Keys) -> list[Probe]:
    return [("GET", keys.lease)]


CHANNEL = Channel(
    name="cli",
    title="the terminal",
    platform="the terminal",
    order=0,
    acl=ACL,
    probes=probes,
)
