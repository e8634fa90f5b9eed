"""The worker's side of layer 2 (issue 28): which ranges need their profile job, the owner's
TODO.md, and gaps a tool of the worker covers.

Two periodic duties on the writer (worker/duties.py), every ``[profiles] check_every`` seconds:

- ``profile.plan``: the ranges layer 1 summarised and layer 2 has not derived yet (memory's
  ``pending_profiles``: a current summary with no run of its own; oldest first, at most
  ``[profiles] batch`` new jobs a round, passing over those already queued or backing off), one
  rq job each (worker/profile_job.py), under an id made of the range's run key, with layer 1's
  rules (worker/derive.py ``submit``: not twice while queued, running or just finished; a failed
  job or one that found the model down again after a backoff, so a range waits for the model,
  never gets dropped). With no model, or ``[profiles] enabled =
  false``, nothing is planned: profiles wait (said once in the log; ``relaybot status`` says it).
  Before planning, at start and whenever the worker's tool names change (a reload), the open
  gaps whose ``needs`` names one of its tools are closed ("covered by the tool NAME").
- ``profile.todo``: ``<home>/TODO.md`` rewritten from the open gaps when they changed (memory's
  cheap signature of the gaps; worker/todo.py), unless ``[profiles] todo = false``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from pathlib import Path

import redis
import structlog

from contract.access import REFUSED, refusal
from contract.config import Config
from contract.files import write_atomic
from memory.turns import Memory
from memory.writer import profile_apply
from worker.derive import submit
from worker.duties import Duties
from worker.todo import HEADER, entity_names, render
from worker.turn import owner_zone

log = structlog.get_logger(__name__)

JOB = "worker.profile_job.profile"
CALLS = 16  # model calls a profile job may make (four questions, twice, a few people)
TODO_FILE = "TODO.md"
TODO_HEADER = HEADER.encode()
WINDOW = 10  # pending ranges looked at per round: this many batches

# a write to memory between rounds (worker/writer.py ``write_between_rounds``)
Write = Callable[[Callable[[], object]], object]


def job_id(prefix: str, run_key: str) -> str:
    """The rq job id of a range's profile job (rq's job keys are shared by every prefix on one
    Redis). A range summarised again has a new summary id, so a new run key: a new job."""
    ident = f"{prefix}|{run_key}"
    return f"relaybot-profile-{hashlib.sha256(ident.encode()).hexdigest()[:32]}"


def ours(path: Path) -> bool:
    """Whether ``path`` is a TODO.md relaybot wrote (its header): only such a file is removed
    when ``[profiles] todo = false``, never one of the owner's own."""
    try:
        with path.open("rb") as fh:
            return fh.read(len(TODO_HEADER)) == TODO_HEADER
    except OSError:
        return False


class Profiler:
    def __init__(
        self,
        config: Callable[[], Config],
        r: redis.Redis,
        memory: Memory,
        *,
        has_model: Callable[[], bool],
        tool_names: Callable[[], Collection[str]],
        write: Write,
        duties: Duties | None = None,
    ) -> None:
        """``config``: the configuration as the worker runs it now (a reload changes it);
        ``has_model``: whether a model is configured now; ``tool_names``: the tools the worker's
        turns have; ``write``: how a duty writes memory (closing covered gaps)."""
        self.config, self.r, self.memory = config, r, memory
        self.has_model, self.tool_names, self.write = has_model, tool_names, write
        self._tools: frozenset[str] | None = None  # the tool names gaps were last closed for
        self._todo: str | None = None  # the gaps' signature TODO.md was last written for
        self._failure: tuple[str, int | None, str] | None = None  # the last write that failed
        self._waiting = False  # "profiles wait" said (until a model comes)
        if duties is not None:
            every = lambda: self.config().profiles.check_every  # noqa: E731
            duties.every(every, self.plan_and_enqueue, name="profile.plan")
            duties.every(every, self.write_todo, name="profile.todo")

    def plan_and_enqueue(self) -> list[profile_apply.PendingRange]:
        """The periodic duty: close covered gaps, then enqueue the pending ranges' jobs."""
        self.close_covered()
        cfg = self.config()
        if not cfg.profiles.enabled or not self.has_model():
            if not self._waiting:
                log.info("profile.waiting", detail="with no model, profiles wait"
                         if cfg.profiles.enabled else "[profiles] enabled = false")  # fmt: skip
            self._waiting = True
            return []
        self._waiting = False
        # a window past the batch: ranges whose jobs are queued, running or backing off are
        # passed over, so one that keeps failing never holds the others back
        pending = self.memory.pending_profiles(cfg.profiles.batch * WINDOW) or []
        tools = sorted(self._tools or ())
        done: list[profile_apply.PendingRange] = []
        try:
            for p in pending:
                if len(done) >= cfg.profiles.batch:
                    break
                key = profile_apply.run_key(p.conversation, p.first_id, p.last_id, p.summary,
                                            p.again)  # fmt: skip
                made = submit(cfg, self.r, job_id(cfg.keys.prefix, key), JOB,
                              args=(p.conversation, p.first_id, p.last_id, p.summary),
                              kwargs={"tool_names": tools, "again": p.again},
                              calls=CALLS)  # fmt: skip
                if made:
                    log.info("profile.enqueued", run_key=key)
                    done.append(p)
        except REFUSED:  # Redis refused the account: the worker stops (exit 2), not retried
            raise
        except redis.RedisError as exc:  # tried again at the next check
            if refusal(exc):
                raise
            log.warning("profile.plan_failed", error=str(exc))
        return done

    def close_covered(self) -> list[int]:
        """Close the open gaps a tool of the worker covers, when its tool names are new."""
        names = frozenset(self.tool_names())
        if names == self._tools:
            return []
        closed = self.write(lambda: self.memory.close_gaps_covered(sorted(names)))
        if closed is None:  # memory refused the write: tried again at the next round
            return []
        self._tools = names
        ids = list(closed) if isinstance(closed, list) else []
        if ids:
            log.info("profile.gaps_covered", gaps=ids, tools=sorted(names))
        return ids

    def _failed(self, path: Path, signature: str, exc: OSError) -> None:
        """Say a failed write of TODO.md once (a warning every round would drown the log): again
        only when the gaps or the error change."""
        failure = (signature, exc.errno, str(path))
        if failure != self._failure:
            log.warning("profile.todo_failed", path=str(path), error=str(exc),
                        detail="tried again every round, said again when it changes")  # fmt: skip
        self._failure = failure

    def after_erasure(self) -> str:
        """An erasure was committed: TODO.md rewritten at once (an erased gap's words must not
        wait for the next round), or removed when ``[profiles] todo = false``; what was done,
        for the erasure's answer."""
        cfg = self.config()
        path = Path(cfg.home) / TODO_FILE
        if not cfg.profiles.todo:
            if not ours(path):
                return "nothing to clean: [profiles] todo = false and no TODO.md of relaybot's"
            try:
                path.unlink()
            except OSError as exc:
                log.warning("profile.todo_failed", path=str(path), error=str(exc))
                return f"not removed ({exc.strerror}): delete {path}"
            return "removed ([profiles] todo = false)"
        if self.write_todo(force=True):
            return "rewritten"
        return f"not rewritten: see the worker log (profile.todo_failed), or delete {path}"

    def write_todo(self, *, force: bool = False) -> bool:
        """Rewrite TODO.md when the gaps changed since it was last written (True: written);
        ``force``: whether they did or not. With ``[profiles] todo = false`` a TODO.md written
        before is removed."""
        cfg = self.config()
        path = Path(cfg.home) / TODO_FILE
        if not cfg.profiles.todo:
            if self._todo is not None:  # turned off since it was written: it goes (it is ours)
                self._todo = None
                if ours(path):
                    try:
                        path.unlink(missing_ok=True)
                    except OSError as exc:
                        self._failed(path, "", exc)
                        return False
                    log.info("profile.todo_removed", path=str(path),
                             detail="[profiles] todo = false")  # fmt: skip
            return False
        signature = self.memory.gaps_signature()
        if signature is None or (signature == self._todo and path.exists() and not force):
            return False
        found = self.memory.open_gaps()
        names = self.memory.use(lambda store: entity_names(store, found or []))
        if found is None or names is None:
            return False
        if not found and not path.exists():  # nothing open, never written: no file of nothing
            self._todo = signature
            return False
        text = render(found, names, owner=cfg.owner.name, zone=owner_zone(cfg))
        try:
            write_atomic(path, text)
        except OSError as exc:
            self._failed(path, signature, exc)
            return False
        if self._failure is not None:
            log.info("profile.todo_recovered", path=str(path))
            self._failure = None
        self._todo = signature
        log.info("profile.todo_written", path=str(path), gaps=len(found))
        return True
