"""The e-mail channel's spec: what every central table knows of it (contract/channels.py).

Registered by pyproject.toml's ``relaybot.channels`` entry point ``email``. Imports the contract
and the channel's pure config module only (never the IMAP or SMTP clients).
"""

from __future__ import annotations

from contract.channels import Channel, Probe
from contract.keys import Keys
from gateways.email.config import EmailConfig
from gateways.email.keys import EmailKeys

ACL = (
    "~{prefix}inbound:email ~{prefix}dead ~{prefix}heartbeats ~{prefix}reply:email:* "
    "~{prefix}inflight:email:* ~{prefix}delivered:email:* ~{prefix}busy:email:* "
    "~{prefix}lease:gateway:email:* ~{prefix}cursor:email* ~{prefix}email:* -@all +ping +hello "
    "+auth +client|setname +xadd +lmove +blmove +lindex +lrem +zadd +zscore +zremrangebyscore "
    "+exists +get +set +hset +hdel +multi +exec +discard +hgetall +zcard +zrem +expire +scan "
    "+time +evalsha +script|load +incr +pexpire +del"
)

USES = ("redis", "delivery", "owner.aliases", "email")
RELOADS = (
    "owner.aliases",
    "email.allowlist",
    "email.trusted_authserv_ids",
    "email.trust_unauthenticated",
    "email.lists",
)


def account(section: EmailConfig) -> str:
    """The IMAP user (or relaybot's first address) at the IMAP host."""
    user = section.imap_user or (section.addresses[0] if section.addresses else "")
    return f"{user}@{section.imap_host}".lower()


def inert(section: EmailConfig) -> tuple[str, str] | None:
    if section.model_fields_set and not section.configured:
        return (
            "[email] has settings but no imap_host: the gateway stays off",
            "set [email] imap_host (or remove the section)",
        )
    return None


def probes(keys: Keys) -> list[Probe]:
    # its cursor, the lists it learns, the owner's mail it refused (for doctor)
    return [
        ("SET", EmailKeys(keys).cursor("INBOX"), "x"),
        ("ZADD", EmailKeys(keys).lists, "1", "x"),
        ("SET", EmailKeys(keys).owner_refused, "x"),
    ]


CHANNEL = Channel(
    name="email",
    title="the e-mail gateway",
    order=20,
    section=EmailConfig,
    env=(
        ("RELAYBOT_EMAIL_IMAP_HOST", "imap_host"),
        ("RELAYBOT_EMAIL_IMAP_PORT", "imap_port"),
        ("RELAYBOT_EMAIL_IMAP_TLS", "imap_tls"),
        ("RELAYBOT_EMAIL_IMAP_USER", "imap_user"),
        ("RELAYBOT_EMAIL_IMAP_PASSWORD", "imap_password"),
        ("RELAYBOT_EMAIL_FOLDER", "folder"),
        ("RELAYBOT_EMAIL_SMTP_HOST", "smtp_host"),
        ("RELAYBOT_EMAIL_SMTP_PORT", "smtp_port"),
        ("RELAYBOT_EMAIL_SMTP_TLS", "smtp_tls"),
        ("RELAYBOT_EMAIL_SMTP_USER", "smtp_user"),
        ("RELAYBOT_EMAIL_SMTP_PASSWORD", "smtp_password"),
        ("RELAYBOT_EMAIL_CA_FILE", "ca_file"),
        ("RELAYBOT_EMAIL_ADDRESSES", "addresses"),
        ("RELAYBOT_EMAIL_ALLOWLIST", "allowlist"),
        ("RELAYBOT_EMAIL_POLL_INTERVAL", "poll_interval"),
        ("RELAYBOT_EMAIL_TRUSTED_AUTHSERV_IDS", "trusted_authserv_ids"),
        ("RELAYBOT_EMAIL_TRUST_UNAUTHENTICATED", "trust_unauthenticated"),
        ("RELAYBOT_EMAIL_LISTS", "lists"),
    ),
    uses=USES,
    reloads=RELOADS,
    account=account,
    inert=inert,
    acl=ACL,
    probes=probes,
    gateway="gateways.email.gateway:run_email",
    onboard="gateways.email.onboard:ONBOARDING",
    doctor="gateways.email.doctor:email_group",
    doctor_budget=10,
    erase="gateways.email.erase:ERASURE",
    audience=True,
    subjects=True,
    platform="e-mail",
    hint="set [email] imap_host (or RELAYBOT_EMAIL_IMAP_HOST); idling until stopped",
)
