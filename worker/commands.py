"""What the worker applies without a model call: the owner's commands from the terminal
(memory's own, or the worker's: ``WorkerCommand``, such as ``memory.resummarize``), a gateway's
reports on its replies, and the jobs' results: summaries (layer 1) and profiles (layer 2,
``apply_profile``): :data:`JOB_RESULTS`, by the derived entry's type. Each is applied in
memory's open transaction (the caller's ``memory.write()``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from contract.config import Config
from contract.messages import InboundMessage, Privacy, ReplyKind
from memory.turns import Memory
from memory.writer import profile_apply, summaries
from worker.turn_result import Outcome, make_reply

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class CommandEntry:
    """The entry an owner command came in: a handler that writes is idempotent on its stream
    id (a command is replayed after a crash before its ack); ``msg`` names the terminal's user."""

    stream_id: str
    msg: InboundMessage


# an owner command the worker applies itself: (memory, args, its entry) -> the command's answer
WorkerCommand = Callable[[Memory, dict[str, Any], CommandEntry], dict[str, object]]


def command(
    cfg: Config,
    memory: Memory,
    commands: Mapping[str, WorkerCommand],
    stream_id: str,
    msg: InboundMessage,
    *,
    created: float,
) -> Outcome:
    """An owner command from the terminal: applied to memory, answered with JSON. An
    erasure's outcome names it: the worker then erases the copies outside memory."""
    if msg.channel != "cli" or msg.privacy is not Privacy.OWNER:
        result: dict[str, object] = {
            "ok": False,
            "error": "memory commands are accepted only from the owner's terminal",
        }
    elif not cfg.owner.trusts("cli"):
        result = {
            "ok": False,
            "error": "memory commands are refused: [owner] trusted_channels does not "
            "trust the terminal (cli)",
        }
    elif memory.store is None:
        result = {"ok": False, "error": "memory is unavailable (see the worker log)"}
    elif isinstance(op := msg.extra.get("op"), str) and op in commands:
        args = msg.extra.get("args", {})
        entry = CommandEntry(stream_id, msg)
        result = commands[op](memory, args if isinstance(args, dict) else {}, entry)
    else:
        op, args = msg.extra.get("op"), msg.extra.get("args", {})
        result = memory.apply_command(stream_id, op, args) or {
            "ok": False,
            "error": "memory failed while applying the command; nothing was changed "
            "(see the worker log); it is safe to run it again",
        }
    kind = ReplyKind.NOTICE if result.get("ok") else ReplyKind.ERROR
    text = json.dumps(result, ensure_ascii=False, default=str)
    reply = make_reply(msg, stream_id, text, kind, created=created)
    erasure = result.get("erasure")
    if result.get("ok") and msg.extra.get("op") == "memory.erase" and isinstance(erasure, int):
        return Outcome(reply=reply, erasure=erasure)
    if msg.extra.get("op") == "memory.import":
        erased = bool(result.get("erased"))
        return Outcome(reply=reply, forget_entry=True, rewrite_files=erased)
    return Outcome(reply=reply)


def apply_report(memory: Memory, msg: InboundMessage) -> None:
    """A gateway's report on one of its replies (its final status), marked in memory."""
    kind = msg.extra.get("type")
    if kind == "reply_status":
        reply_id = str(msg.extra.get("reply_id", ""))
        status = str(msg.extra.get("status", ""))
        memory.mark_reply(reply_id, status, str(msg.extra.get("detail", "")))
        log.info("reply.status", reply_id=reply_id, status=status)
    else:
        log.warning("derived.unknown", type=kind)


def apply_summary(memory: Memory, msg: InboundMessage) -> str:
    """Apply a job's summary; why memory refused it ("" when applied)."""
    try:
        proposal = summaries.proposal_of(msg.conversation, msg.text, msg.extra)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        log.warning("summary.invalid", error=f"{type(exc).__name__}: {exc}")
        return "invalid"
    made = memory.apply_summary(proposal)
    if isinstance(made, str):
        return made
    log.info("summary.applied", summary=made.id, first_id=made.first_id,
             last_id=made.last_id, method=made.method,
             supersedes=made.supersedes)  # fmt: skip
    return ""


def apply_profile(memory: Memory, msg: InboundMessage) -> str:
    """Apply a profile job's result (one range: memory/profile_apply.py, idempotent on its run
    key); "" when it applied whole, else why memory refused it or some of it (a fact or gap
    whose evidence was erased since the job read it says "erased": the entry's copy of its
    text is then rewritten out of Redis's files)."""
    try:
        result = profile_apply.result_of(msg.extra)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        log.warning("profile.invalid", error=f"{type(exc).__name__}: {exc}"[:500])
        return "invalid"
    if result.conversation != msg.conversation:
        log.warning("profile.invalid", error="the result names another conversation")
        return "invalid"
    done = memory.apply_profile(result)  # memory logs what it applied and refused
    return done if isinstance(done, str) else "; ".join(done.refused)


# a derived entry from the jobs (never a gateway's: worker/admission.py), by its type: how the
# worker applies it; why memory refused it ("" when applied)
JOB_RESULTS: dict[str, Callable[[Memory, InboundMessage], str]] = {
    "summary": apply_summary,
    "profile": apply_profile,
}
