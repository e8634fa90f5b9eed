"""The toy channel's spec (contract/channels.py): what every central table knows of it."""

from __future__ import annotations

from contract.channels import Channel, Probe
from contract.keys import Keys
from tests.support.toychannel.config import ToyConfig

ACL = (
    "~{prefix}inbound:toy ~{prefix}dead ~{prefix}heartbeats ~{prefix}reply:toy:* "
    "~{prefix}inflight:toy:* ~{prefix}delivered:toy:* ~{prefix}busy:toy:* "
    "~{prefix}lease:gateway:toy:* ~{prefix}toy:* -@all +ping +hello +auth +client|setname +xadd "
    "+lmove +blmove +lindex +lrem +zadd +zscore +zremrangebyscore +exists +get +set +hset +hdel "
    "+multi +exec +discard +time +evalsha +script|load +incr +pexpire +del"
)


def account(section: ToyConfig) -> str:
    return str(section.inbox)  # one gateway per inbox file


def probes(keys: Keys) -> list[Probe]:
    return [("SET", f"{keys.prefix}toy:cursor", "x")]


CHANNEL = Channel(
    name="toy",
    title="the toy gateway",
    order=90,
    section=ToyConfig,
    env=(("RELAYBOT_TOY_INBOX", "inbox"), ("RELAYBOT_TOY_OUTBOX", "outbox")),
    uses=("redis", "delivery", "toy"),
    account=account,
    acl=ACL,
    probes=probes,
    gateway="tests.support.toychannel.gateway:run",
    doctor="tests.support.toychannel.doctor:toy_group",
    hint="set [toy] inbox and outbox",
)
