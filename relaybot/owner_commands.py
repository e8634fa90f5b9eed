"""Sending an owner command to the worker from the terminal and waiting for its JSON result.

Memory is written only by the worker, so the command line sends ``kind=command`` entries (see
memory/commands.py) on a session of its own and reads the answer from that session's queue.
"""

from __future__ import annotations

import json
import secrets
import time
from contextlib import ExitStack
from typing import Any

import structlog

from contract.bus import publish
from contract.config import Config
from contract.messages import MAX_EXTRA_CHARS, InboundMessage, Kind, Privacy, Reply, new_event_id
from deploy.embedded import EmbeddedRedisError
from gateways.cli.gateway import CHANNEL
from gateways.deliver import ReplyQueue, deliver_next
from relaybot.runtime import Runtime, RuntimeProblem

log = structlog.get_logger(__name__)


class CommandFailed(RuntimeError):
    """The command could not be run or was refused; the message says why."""


def command_message(session: str, op: str, args: dict[str, Any], sender: str) -> InboundMessage:
    extra = {"op": op, "args": args}
    if len(json.dumps(extra, ensure_ascii=False)) > MAX_EXTRA_CHARS:
        raise CommandFailed(f"the {op} command is too large for one entry; send it in parts")
    return InboundMessage(
        kind=Kind.COMMAND,
        channel=CHANNEL,
        session=session,
        conversation=session,
        sender=sender,
        privacy=Privacy.OWNER,
        text=f"/{op}",
        ts=time.time(),
        event_id=new_event_id(),
        extra=extra,
    )


def run_commands(
    cfg: Config, calls: list[tuple[str, dict[str, Any]]], *, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Send commands in order and return their results (a zero-config run starts the worker)."""
    import getpass

    session = f"cli:admin-{secrets.token_hex(4)}"
    results: list[dict[str, Any]] = []
    with ExitStack() as stack:
        try:
            rt = stack.enter_context(Runtime(cfg))
        except (RuntimeProblem, EmbeddedRedisError) as exc:  # Redis cannot be reached or started
            raise CommandFailed(str(exc)) from None
        queue = ReplyQueue(
            rt.r, cfg.keys, session, max_age=cfg.delivery.max_age, gateway="gateway:cli"
        )
        try:
            for op, args in calls:
                sid = publish(rt.r, cfg.keys, command_message(session, op, args, getpass.getuser()))
                reply = _wait(rt, queue, sid, timeout)
                try:
                    results.append(json.loads(reply.text))
                except ValueError:
                    results.append({"ok": False, "error": reply.text})
        finally:  # emptied, the set is gone (the terminal's account may not DEL)
            rt.r.zremrangebyscore(queue.delivered, "-inf", "+inf")
    return results


def run_command(
    cfg: Config, op: str, args: dict[str, Any], *, timeout: float = 60.0
) -> dict[str, Any]:
    return run_commands(cfg, [(op, args)], timeout=timeout)[0]


def _wait(rt: Runtime, queue: ReplyQueue, sid: str, timeout: float) -> Reply:
    got: list[Reply] = []
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        deliver_next(queue, got.append, timeout=0.2)
        for reply in got:
            if reply.answers == sid:
                return reply
        problem = rt.problem()
        if problem and time.monotonic() - started > 3.0:
            raise CommandFailed(f"{problem}; the command is queued as {sid}")
    raise CommandFailed(f"the worker did not answer within {timeout:.0f} s (entry {sid})")
