"""The summary job (rq, the ``jobs`` process): derive one conversation segment's summary.

It reads memory read-only, asks the model (``[model.derive]`` over ``[model]``), validates the
answer, and XADDs a ``derived`` entry (``extra.type = "summary"``) to the stream without a channel,
which only the worker's and the jobs' Redis accounts may write; the worker checks the proposal again
and applies it (memory/summaries.py). Jobs never write memory.

``mode="judge"``: first ask whether the conversation has naturally paused; "no" is written to
``derive:judged`` (the worker asks again after new messages, or summarises once the conversation
has been quiet for ``[derive] quiet``); an unusable judgement leaves the decision to that quiet
period. A model that is down ends the job with ``model_down`` (one warning, no traceback): the
worker enqueues it again after a backoff, so a summary waits for the model, never gets dropped.
A model that answers garbage twice (not JSON, or not a summary of the range: a placeholder such as
``...``, a refusal, only names, our own context lines, the prompt echoed, text about something
else: memory/segments.py ``summary_problem``) gets
the deterministic, extractive summary (memory/segments.py), marked ``method = "fallback"`` and
headed with why the model's reply was rejected (``no model`` only when there is none); a later job
may supersede it.

Each job reads config.toml afresh (a changed ``[model]`` is used by the next job); when the file
does not load (invalid, or unreadable), the job runs with the last good configuration the jobs
process holds (its config watcher's, :func:`use_last_good`): one bad edit must not send every
summary job to rq's failed registry (issue 26). The jobs process says why, once
(``config.rejected`` or ``config.unreadable``).

Jobs get ids, never serialized models: (conversation, first log id, last log id, mode, the
summary it supersedes, version); the job key (memory/summaries.py) makes applying idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis
import structlog
from rq import get_current_job

from contract.config import Config, ConfigError, load_config
from contract.messages import InboundMessage, Kind, Privacy, new_event_id
from memory.writer import (
    PAUSE_PROMPT,
    SUMMARY_PROMPT,
    MemoryStore,
    fallback_summary,
    parse_pause,
    parse_summary,
    summaries,
    summary_problem,
    transcript,
)
from worker.model import ModelError, ModelPort, NoModel
from worker.openai_client import make_model

if TYPE_CHECKING:
    from memory.types import LogRow

log = structlog.get_logger(__name__)

JUDGE_ROWS = 12  # the last messages the pause judgement reads

# the jobs process's last good configuration (worker/jobs.py sets it; rq's work horse, forked
# from that process, inherits it): None outside the jobs process
_last_good: Callable[[], Config] | None = None


def use_last_good(source: Callable[[], Config] | None) -> None:
    """Where a job finds the last good configuration when config.toml does not load."""
    global _last_good  # noqa: PLW0603 (one per process: the jobs process sets it at start)
    _last_good = source


def job_config() -> Config:
    """config.toml as it is now, or the jobs process's last good configuration when it does not
    load (:class:`ConfigError` only outside the jobs process, which has none)."""
    try:
        return load_config()
    except ConfigError as exc:
        if _last_good is None:
            raise
        detail = "config.toml does not load: this job runs with the last good one"
        log.info("summary.last_good_config", error=str(exc), detail=detail)
        return _last_good()


def summarize(
    conversation: str,
    first_id: int,
    last_id: int,
    *,
    mode: str = "summarize",
    supersedes: int | None = None,
    version: int = 1,
) -> str:
    """The rq entry point; returns what happened (``proposed``, ``open``, ``undecided``,
    ``stale``, or ``model_down``: the worker enqueues the job again after a backoff)."""
    cfg = job_config()
    job = get_current_job()
    r: redis.Redis = job.connection if job is not None else redis.Redis.from_url(_url(cfg))
    model = make_model(cfg.model.for_derive())
    try:
        return derive(cfg, r, model, conversation, first_id=first_id, last_id=last_id,
                      mode=mode, supersedes=supersedes, version=version)  # fmt: skip
    finally:
        close = getattr(model, "close", None)
        if close is not None:
            close()


def _url(cfg: Config) -> str:
    if cfg.redis.url is None:
        raise RuntimeError("no Redis URL: run the job from the jobs process")
    return cfg.redis.url.get_secret_value()


def derive(
    cfg: Config,
    r: redis.Redis,
    model: ModelPort,
    conversation: str,
    *,
    first_id: int,
    last_id: int,
    mode: str = "summarize",
    supersedes: int | None = None,
    version: int = 1,
) -> str:
    """The job's work, with its parts given (tests call it directly too)."""
    name = cfg.worker.assistant_name
    with MemoryStore(cfg.memory_path, readonly=True) as store:
        rows = summaries.live_rows(store.conn, conversation, first_id, last_id)
    bound = log.bind(conversation=conversation, first_id=first_id, last_id=last_id, mode=mode)
    if not rows or rows[0].id != first_id or rows[-1].id != last_id:
        bound.info("summary.stale", detail="the range changed since the job was enqueued")
        return "stale"
    lines = transcript(rows, name)
    if mode == "judge":
        if isinstance(model, NoModel):
            return "undecided"
        tail = transcript(rows[-JUDGE_ROWS:], name)
        try:
            paused = parse_pause(_ask(model, PAUSE_PROMPT + tail))
        except ModelError as exc:
            bound.info("summary.judge_failed", error=str(exc))
            return "undecided"  # the quiet period decides
        if paused is None:
            bound.info("summary.judge_unusable")
            return "undecided"
        if not paused:
            r.hset(cfg.keys.derive_judged, conversation, str(last_id))
            bound.info("summary.not_paused")
            return "open"
    text, rejected = None, None
    if not isinstance(model, NoModel):
        asked = _ask_summary(model, rows, SUMMARY_PROMPT + lines, name, bound)
        if asked is None:
            return "model_down"
        text, rejected = asked
    method = "model" if text is not None else "fallback"
    if text is None:
        text = fallback_summary(rows, name, rejected)
    key = summaries.job_key(conversation, first_id, last_id, version)
    last = rows[-1]
    entry = InboundMessage(
        kind=Kind.DERIVED,
        channel=last.channel,
        session=last.session,
        conversation=conversation,
        sender="jobs",
        privacy=Privacy(last.privacy),
        text=text,
        ts=time.time(),
        event_id=new_event_id(),
        extra={
            "type": "summary",
            "first_id": first_id,
            "last_id": last_id,
            "method": method,
            "job_key": key,
            "supersedes": supersedes,
            "rows": len(rows),
        },
    )
    r.xadd(cfg.keys.inbound, entry.to_fields())  # type: ignore[arg-type]
    bound.info("summary.proposed", method=method, chars=len(text), key=key)
    return "proposed"


def _ask_summary(
    model: ModelPort, rows: Sequence[LogRow], prompt: str, name: str, bound: Any
) -> tuple[str | None, str | None] | None:
    """The model's summary (None, and why, when its two tries gave none); None when the model
    is down (the job is enqueued again, backing off)."""
    rejected = None
    for _ in range(2):
        try:
            answer = _ask(model, prompt)
        except ModelError as exc:
            if exc.retryable and exc.kind != "garbage":
                bound.warning("summary.model_down", error=str(exc), kind=exc.kind)
                return None
            # it will not do better later (a 4xx such as "context too long", or not an answer
            # at all): as an unusable answer, the extractive fallback after two
            bound.warning("summary.model_refused", error=str(exc), kind=exc.kind)
            rejected = f"the model failed ({exc.kind})"
            continue
        text = parse_summary(answer)
        if text is None:
            rejected = "not JSON with a summary"
        else:
            # a placeholder, the prompt echoed, text about something else: not a summary
            rejected = summary_problem(text, rows, name)
            if rejected is None:
                return text, None
        bound.warning("summary.unusable_answer", reason=rejected)
    return None, rejected


def _ask(model: ModelPort, prompt: str) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    return model.complete(messages, []).content or ""
