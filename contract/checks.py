"""A check's result, as ``relaybot doctor`` shows it: what the core's probes and every channel's
(its spec's ``doctor`` group, contract/channels.py) return. Pure data, and the Redis client a
probe uses (short timeouts, no retries)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from contract import redis_tls
from contract.bus import redis_url
from contract.config import Config


class Verdict(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Check:
    """One check's result. ``summary`` says what was found, ``hint`` what to do about it (a
    skipped check's summary says why it was skipped)."""

    id: str
    verdict: Verdict
    summary: str
    hint: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "group": self.group,
            "verdict": str(self.verdict),
            "summary": self.summary,
            "hint": self.hint,
            "details": self.details,
        }


def ok(id_: str, summary: str, **details: Any) -> Check:
    return Check(id_, Verdict.OK, summary, details=details)


def warn(id_: str, summary: str, hint: str, **details: Any) -> Check:
    return Check(id_, Verdict.WARN, summary, hint, details)


def fail(id_: str, summary: str, hint: str, **details: Any) -> Check:
    return Check(id_, Verdict.FAIL, summary, hint, details)


def skipped(id_: str, because: str, hint: str = "") -> Check:
    return Check(id_, Verdict.SKIPPED, because, hint)


Add = Callable[[Check], None]  # a group of checks hands each result to this


def probe_client(cfg: Config, timeout: float) -> redis.Redis:
    """A Redis client for a probe: every step within ``timeout``, never retried."""
    return redis.Redis.from_url(
        redis_url(cfg),
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        client_name="relaybot-doctor",
        **redis_tls.options(cfg),  # [redis] ca_file, cert_file, key_file
    )
