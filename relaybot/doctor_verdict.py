"""``relaybot doctor``'s verdicts: pure functions from what a probe saw to ok / warn / fail.

No I/O here (the probes are in ``doctor_*`` modules next to this one): each function takes plain
facts (a version string, file modes, a parsed TOML table, heartbeats) and returns :class:`Check`
values, so every verdict and every hint is unit-tested without a server.
"""

from __future__ import annotations

import difflib
import json
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from contract import channels as registry
from contract.checks import Check, Verdict, fail, ok, skipped, warn
from contract.config import config_digest as contract_config_digest

__all__ = ["Check", "Verdict", "fail", "ok", "skipped", "warn"]  # and the verdicts below


def exit_code(checks: Iterable[Check]) -> int:
    """1 when any check failed; warnings alone exit 0."""
    return 1 if any(c.verdict is Verdict.FAIL for c in checks) else 0


# -- Redis -------------------------------------------------------------------------------------

MIN_REDIS = (6, 2)  # LMOVE/BLMOVE (gateways' delivery), the worker's scripts
WAITAOF_REDIS = (7, 2)
DURABILITY_DOC = "README: Configuration (REDIS_URL) and deploy/README.md"


def parse_version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def redis_version(server: str, version: str) -> Check:
    v = parse_version(version)
    name = f"{server} {version}"
    if v < MIN_REDIS:
        return fail(
            "redis.version",
            f"{name}: relaybot needs Redis/Valkey >= 6.2 (LMOVE, the worker's scripts)",
            "upgrade Redis (>= 7.2 recommended: WAITAOF), or unset REDIS_URL to use the "
            "embedded Redis",
            version=version,
        )
    if v < WAITAOF_REDIS:
        return ok("redis.version", f"{name} (no WAITAOF: durability needs appendfsync always)")
    return ok("redis.version", f"{name} (WAITAOF: relaybot waits for the fsync itself)")


def persistence(
    version: str, appendonly: str | None, appendfsync: str | None, *, embedded: bool
) -> Check:
    """The README's requirement for any Redis: ``appendonly yes`` + ``appendfsync always``, or
    Redis/Valkey >= 7.2 (WAITAOF) with any ``appendfsync`` but ``no`` (contract/durable.py)."""
    waitaof = parse_version(version) >= WAITAOF_REDIS
    cid = "redis.persistence"
    facts = {"appendonly": appendonly, "appendfsync": appendfsync, "waitaof": waitaof}
    where = "the embedded Redis" if embedded else "this Redis"
    fix = "set in redis.conf (and CONFIG SET it live): appendonly yes, appendfsync always"
    if appendonly is None or appendfsync is None:
        return warn(
            cid,
            f"cannot read {where}'s configuration (this account has no CONFIG): durability "
            "unverified",
            f"check that redis.conf says appendonly yes and appendfsync always (or run Redis "
            f">= 7.2); gateways log redis.durability_unverified at start ({DURABILITY_DOC})",
            **facts,
        )
    if appendonly != "yes":
        return fail(
            cid,
            f"{where} runs appendonly {appendonly}: an accepted message is lost if the Redis "
            "host crashes, so gateways refuse to start",
            f"{fix} ({DURABILITY_DOC})",
            **facts,
        )
    if appendfsync == "always":
        return ok(cid, "appendonly yes, appendfsync always: an accepted entry is on disk", **facts)
    if appendfsync == "no":
        return fail(
            cid,
            f"{where} runs appendfsync no: it never fsyncs, so gateways refuse to start",
            f"{fix} ({DURABILITY_DOC})",
            **facts,
        )
    if waitaof:
        return ok(
            cid,
            f"appendonly yes, appendfsync {appendfsync}, WAITAOF: gateways wait for the fsync",
            **facts,
        )
    return fail(
        cid,
        f"appendfsync {appendfsync} on a Redis without WAITAOF (< 7.2): a power cut can lose "
        "accepted messages, so gateways refuse to start",
        f"{fix}, or upgrade to Redis/Valkey >= 7.2 ({DURABILITY_DOC})",
        **facts,
    )


def acl(user: str, refused: Mapping[str, list[str]]) -> Check:
    """``refused``: for each role checked, the probes Redis refused (NOPERM)."""
    roles = ", ".join(refused) or "none"
    bad = {role: probes for role, probes in refused.items() if probes}
    if not bad:
        return ok("redis.acl", f"user {user} may run what {roles} need", roles=list(refused))
    lines = "; ".join(f"{role}: {', '.join(p)}" for role, p in bad.items())
    return fail(
        "redis.acl",
        f"user {user} is refused what {', '.join(bad)} need: {lines}",
        "give the user the keys and commands of deploy/redis/users.acl (ACL LOAD after editing "
        "the file), with the same key prefix as [redis] prefix",
        refused=bad,
    )


# -- the scheduler -----------------------------------------------------------------------------

START_JOBS = (
    "start the jobs process, which runs the scheduler: relaybot jobs (honcho start, or the "
    "relaybot-jobs systemd unit); it fires what is overdue once, by each item's late policy"
)


ZERO_CONFIG = (
    "a zero-config home runs only while a relaybot chat is open: its worker starts the jobs "
    "process, and the next chat fires what is due, by each item's late policy; for reminders on "
    "time whether a chat is open or not, run honcho start"
)
STUCK = (
    "the worker applies each occurrence: check that it runs and takes its entries (relaybot "
    "status: pending); a fire job held by a jobs process that died is made again within a "
    "minute; an occurrence refused is a dead letter, with the reason (relaybot redis-cli XRANGE "
    "relaybot:dead - +); the jobs process's log says what each fire job did"
)


def _no_scheduler(said: str, *, due_now: bool, zero_config: bool, **facts: Any) -> Check:
    """Items wait and nobody holds rq's scheduler lock: a failure when they are due, but in a
    zero-config home, where nothing runs between chats by design."""
    cid = "scheduler.health"
    if zero_config:
        return warn(cid, said + "they fire when a chat opens", ZERO_CONFIG, **facts)
    if due_now:
        return fail(cid, said + "they do not fire", START_JOBS, **facts)
    return warn(cid, said + "they will not fire until one does", START_JOBS, **facts)


def scheduler(health: Mapping[str, Any], now: float, *, zero_config: bool = False) -> list[Check]:
    """The scheduler's health (relaybot/scheduler_health.py: ``memory``, ``lock``, ``holder``,
    ``failed_jobs``): a failure when items are due or overdue and no scheduler holds rq's lock
    (nothing will fire them), a warning when items wait with no scheduler, or are overdue
    although one runs (the worker applies each occurrence); a warning too when occurrences were
    skipped in the last day (``late = "skip"`` says nothing in the conversation: this is where
    the owner learns of it)."""
    mem = health.get("memory") or {}
    lock = health.get("lock") or {}
    held, holder = lock.get("held"), health.get("holder") or "a scheduler"
    facts = {"memory": dict(mem), "lock": dict(lock), "holder": health.get("holder"),
             "refused": health.get("refused")}  # fmt: skip
    out: list[Check] = []
    cid = "scheduler.health"
    if mem.get("error"):
        out.append(warn(cid, f"cannot read the scheduled items: {mem['error']}",
                        "see the memory checks; relaybot memory status", **facts))  # fmt: skip
    elif not mem.get("active"):
        said = "no reminders waiting" if mem.get("exists", True) else "no memory database yet"
        runs = {True: f"; {holder} runs", False: "; no scheduler runs", None: ""}[held]
        out.append(ok(cid, said + runs, **facts))
    else:
        active, overdue = int(mem["active"]), int(mem.get("overdue") or 0)
        next_due = mem.get("next_due")
        due_now = overdue > 0 or (next_due is not None and next_due <= now)
        waiting = f"{active} reminder(s) waiting, next due {mem.get('next_due_at') or next_due}"
        if overdue:
            waiting += f", {overdue} overdue (the oldest due {mem.get('oldest_overdue_at')})"
        if held is None:
            out.append(warn(cid, waiting + "; whether a scheduler runs could not be read (rq's "
                            "scheduler lock)", "run doctor as an account that may read "
                            f"{lock.get('key')} (PTTL), e.g. relaybot-cli", **facts))  # fmt: skip
        elif not held:
            nobody = f"{waiting}; no scheduler runs (nobody holds {lock.get('key')}): "
            out.append(_no_scheduler(nobody, due_now=due_now, zero_config=zero_config, **facts))
        elif overdue:
            out.append(warn(cid, waiting + f", although {holder} runs", STUCK,
                            **facts))  # fmt: skip
        else:
            out.append(ok(cid, waiting + f"; {holder} runs", **facts))
    skipped = int(mem.get("skipped_24h") or 0)
    if skipped:
        out.append(warn("scheduler.skipped", f"{skipped} reminder occurrence(s) skipped in the "
                        "last 24 h (late = \"skip\": late, so not delivered, and nothing said)",
                        "relaybot reminders --all shows them (each item's runs); to deliver a "
                        "late one instead, set it again with late = deliver, and keep relaybot "
                        "jobs and the worker running", skipped_24h=skipped))  # fmt: skip
    failed = health.get("failed_jobs")
    if failed:
        out.append(warn("scheduler.failed", f"{len(failed)} fire job(s) failed: "
                        + ", ".join(failed[:5]), "relaybot status shows why each failed (the "
                        "jobs process's log too); the worker makes a missing job again",
                        failed=list(failed)))  # fmt: skip
    return out


# -- the model ---------------------------------------------------------------------------------


def model_exists(model: str, available: list[str]) -> Check:
    if model in available:
        return ok("model.exists", f"{model} is listed by the endpoint", models=available)
    close = difflib.get_close_matches(model, available, n=1, cutoff=0.5)
    listing = ", ".join(available[:10]) + (" ..." if len(available) > 10 else "")
    hint = f'set [model] model = "{close[0]}"' if close else "set [model] model to one of them"
    if not available:
        hint = "load or pull a model on the server (ollama pull NAME), then set [model] model"
    return fail(
        "model.exists",
        f"{model} is not among the endpoint's models ({listing or 'none listed'})",
        hint + " (or OPENAI_MODEL / RELAYBOT_MODEL)",
        models=available,
    )


TOOL_HINT = (
    "relaybot's tools (memory search, notes, the clock) need a model with tool calling: pick "
    "one that has it (Ollama: a model tagged 'tools'; llama.cpp: start llama-server with --jinja)"
)


def tool_call(name: str, answer: Mapping[str, Any]) -> Check:
    """The answer (an OpenAI chat completion) to a request that offered one tool and asked for
    it: the model must have called ``name`` with arguments that are a JSON object."""
    cid = "model.tools"
    try:
        message = answer["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return fail(cid, "the endpoint's answer is not a chat completion", TOOL_HINT)
    calls = message.get("tool_calls") or []
    if not calls:
        said = str(message.get("content") or "")[:80]
        return warn(
            cid,
            f"the model answered in text instead of calling the tool ({said!r})",
            TOOL_HINT,
        )
    fn = (calls[0] or {}).get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        args = None
    if fn.get("name") != name or not isinstance(args, dict):
        return warn(
            cid,
            f"the model called {fn.get('name')!r} with arguments {fn.get('arguments')!r}, not "
            f"{name} with a JSON object",
            TOOL_HINT,
        )
    return ok(cid, f"the model called the tool {name} (tool calling works)")


# -- disk and permissions ----------------------------------------------------------------------

FAIL_FREE = 200 * 1024**2  # bytes: SQLite's WAL, Redis's AOF rewrite need room to grow
WARN_FREE = 1024**3
WARN_FRACTION = 0.05


def disk_space(path: Path, free: int, total: int) -> Check:
    gib = free / 1024**3
    facts = {"path": str(path), "free": free, "total": total}
    line = f"{gib:.1f} GiB free of {total / 1024**3:.1f} GiB under {path}"
    if free < FAIL_FREE:
        return fail(
            "disk.space",
            line + ": SQLite and Redis cannot write much more (Redis stops accepting writes "
            "when its AOF cannot grow)",
            "free space on that filesystem, or move RELAYBOT_HOME to a larger one",
            **facts,
        )
    if free < WARN_FREE or (total and free / total < WARN_FRACTION):
        return warn("disk.space", line, "free some space before it runs out", **facts)
    return ok("disk.space", line, **facts)


SENSITIVE = ("memory.sqlite3", "config.toml", "session.json")


def permissions(home: Path, modes: Mapping[Path, int], limit: int = 10) -> Check:
    """``modes``: st_mode of every file, directory and socket under RELAYBOT_HOME (and the
    memory database, wherever it is). Anything group or world accessible fails."""
    open_ = {p: m for p, m in modes.items() if m & 0o077}
    if not modes:
        return ok("disk.permissions", f"{home} does not exist yet: nothing to check")
    if not open_:
        return ok("disk.permissions", f"{len(modes)} paths under {home}: only the owner can read")
    first = sorted(open_, key=lambda p: (p.name.split("-")[0] not in SENSITIVE, str(p)))
    shown = ", ".join(f"{p} ({stat.filemode(open_[p])})" for p in first[:limit])
    more = f" and {len(open_) - limit} more" if len(open_) > limit else ""
    targets = sorted({str(home), *(str(p) for p in first if not p.is_relative_to(home))})
    return fail(
        "disk.permissions",
        f"readable by others: {shown}{more} (memory and config hold private messages and secrets)",
        f"chmod -R go-rwx {' '.join(targets)}",
        paths=[str(p) for p in first],
    )


# -- the configuration -------------------------------------------------------------------------


def config_digest(raw: bytes) -> str:
    """What a process reports as its ``config`` heartbeat field: the first 12 hex digits of the
    SHA-256 of the config.toml bytes it loaded (contract.config.config_digest, for a file)."""
    return contract_config_digest(raw)


# tables whose keys are names the owner chooses (a conversation id, a room id, a channel)
_FREE_KEYS = frozenset(
    {
        "roles",
        "turns.channels",
        "turns.conversations",
        "mcp.servers",  # [mcp.servers.NAME]: names the owner chooses
        *(key for ch in registry.channels() for key in ch.free_keys),
    }
)


Unknown = tuple[tuple[str, ...], str | None]  # a key's path and the closest known key


def unknown_keys(
    data: Mapping[str, Any], model: type[BaseModel], where: tuple[str, ...] = ()
) -> list[Unknown]:
    """The keys of ``data`` that ``model`` does not know (a typo makes the config fail to load),
    each with the closest known key."""
    out: list[Unknown] = []
    fields = model.model_fields
    for key, value in data.items():
        path = (*where, key)
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            out.append((path, close[0] if close else None))
            continue
        sub = _submodel(fields[key].annotation)
        if sub is None or not isinstance(value, Mapping):
            continue
        if ".".join(path) in _FREE_KEYS:
            for name, item in value.items():
                if isinstance(item, Mapping):
                    out += unknown_keys(item, sub, (*path, name))
        else:
            out += unknown_keys(value, sub, path)
    return out


def describe_unknown(item: Unknown) -> str:
    path, close = item
    dotted = ".".join(path)
    if close is None:
        return dotted
    return f"{dotted} (did you mean {'.'.join((*path[:-1], close))}?)"


def without(data: Mapping[str, Any], paths: Iterable[tuple[str, ...]]) -> dict[str, Any]:
    """A copy of ``data`` without the keys at ``paths``."""
    out: dict[str, Any] = {k: (without(v, []) if isinstance(v, Mapping) else v)
                           for k, v in data.items()}  # fmt: skip
    for path in paths:
        node: Any = out
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, or the values of a dict of models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def config_keys(path: Path, unknown: list[Unknown]) -> Check:
    if not unknown:
        return ok("config.keys", f"every key of {path} is known" if path.exists() else "no file")
    named = [describe_unknown(u) for u in unknown]
    return fail(
        "config.keys",
        f"unknown key{'s' if len(named) > 1 else ''} in {path}: {'; '.join(named)}",
        "fix or remove them: a config with an unknown key does not load, so every process "
        "refuses to start (the other checks below ran without those keys)",
        unknown=named,
    )
