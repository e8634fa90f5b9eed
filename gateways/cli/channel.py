"""The terminal channel's spec (contract/channels.py): ``relaybot chat`` is its gateway.

It has no config section and takes no lease (one terminal per person, many at once); its ACL
user may read the worker's lease (``relaybot chat`` says when the worker is not running).
"""

from __future__ import annotations

from contract.channels import Channel, Probe
from contract.keys import Keys

ACL = (
    "~{prefix}inbound:cli ~{prefix}dead ~{prefix}heartbeats ~{prefix}worker:lease "
    "~{prefix}reply:cli:* ~{prefix}inflight:cli:* ~{prefix}delivered:cli:* ~{prefix}busy:cli:* "
    "-@all +ping +hello +auth +client|setname +xadd +lmove +blmove +lindex +lrem +zadd +zscore "
    "+zremrangebyscore +exists +get +hset +hdel +multi +exec +discard +time"
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
