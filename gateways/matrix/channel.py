"""The Matrix channel's spec: what every central table knows of it (contract/channels.py).

Registered by pyproject.toml's ``relaybot.channels`` entry point ``matrix``. Imports the contract
and the channel's pure config module only (never nio): loading the registry stays cheap.
"""

from __future__ import annotations

from pathlib import Path

from contract.channels import Channel, Probe
from contract.keys import Keys
from gateways.matrix.config import MatrixConfig
from gateways.matrix.keys import MatrixKeys

ACL = (
    "~{prefix}inbound:matrix ~{prefix}dead ~{prefix}heartbeats ~{prefix}reply:matrix:* "
    "~{prefix}inflight:matrix:* ~{prefix}delivered:matrix:* ~{prefix}busy:matrix:* "
    "~{prefix}lease:gateway:matrix:* ~{prefix}cursor:matrix* ~{prefix}matrix:* -@all +ping "
    "+hello +auth +client|setname +xadd +lmove +blmove +lindex +lrem +zadd +zscore "
    "+zremrangebyscore +exists +get +set +hset +hdel +multi +exec +discard +time +evalsha "
    "+script|load +incr +pexpire +del"
)

USES = ("redis", "delivery", "owner.aliases", "matrix", "worker.assistant_name")
RELOADS = (
    "owner.aliases",
    "matrix.owners",
    "matrix.allowlist",
    "matrix.group_policy",
    "matrix.group_allowlist",
    "matrix.rooms",
    "worker.assistant_name",
)


def account(section: MatrixConfig) -> str:
    """The bot's Matrix user id (it names its homeserver)."""
    return f"{section.user_id}"


def owners(section: MatrixConfig) -> list[str]:
    return list(section.owners)


def private(section: MatrixConfig) -> list[Path]:
    return [section.store_path] if section.store_path is not None else []


def inert(section: MatrixConfig) -> tuple[str, str] | None:
    if section.model_fields_set - {"owners"} and not section.configured:  # owners: aliases
        return (
            "[matrix] has settings but no homeserver or user_id: the gateway stays off",
            "set [matrix] homeserver and user_id (or remove the section)",
        )
    return None


def probes(keys: Keys) -> list[Probe]:
    return [("SET", MatrixKeys(keys).cursor, "x")]


CHANNEL = Channel(
    name="matrix",
    title="the Matrix gateway",
    order=10,
    section=MatrixConfig,
    env=(
        ("RELAYBOT_MATRIX_HOMESERVER", "homeserver"),
        ("RELAYBOT_MATRIX_USER_ID", "user_id"),
        ("RELAYBOT_MATRIX_ACCESS_TOKEN", "access_token"),
        ("RELAYBOT_MATRIX_PASSWORD", "password"),
        ("RELAYBOT_MATRIX_DEVICE_ID", "device_id"),
        ("RELAYBOT_MATRIX_STORE_PATH", "store_path"),
    ),
    uses=USES,
    reloads=RELOADS,
    worker_uses=("matrix.owners",),
    account=account,
    owner_addresses=owners,
    free_keys=("matrix.rooms",),
    private=private,
    inert=inert,
    acl=ACL,
    probes=probes,
    gateway="gateways.matrix.gateway:run_matrix",
    onboard="gateways.matrix.onboard:ONBOARDING",
    doctor="gateways.matrix.doctor:matrix_group",
    audience=True,
    redactions=True,
    platform="Matrix",
    hint="set [matrix] homeserver and user_id (or RELAYBOT_MATRIX_*); idling",
)
