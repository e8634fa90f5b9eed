"""The worker's side of layer 2 (worker/profile_derive.py, worker/todo.py): planning the profile
jobs over fakeredis (once per range, backoff, nothing without a model), gaps a tool covers, and
the owner's TODO.md (atomic, 0600, what it says)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import structlog
import structlog.testing
from rq import SimpleWorker
from rq.job import JobStatus

from contract.config import Config, ProfilesConfig
from contract.messages import Privacy
from memory import gaps, profile_apply
from memory.facade import Memory
from memory.identity import OWNER
from memory.rows import LogRow
from tests.unit.test_profile_job import DM, World
from worker import derive
from worker.duties import Duties
from worker.model import Completion, ModelError
from worker.profile_derive import JOB, TODO_FILE, Profiler, job_id
from worker.todo import render
from worker.turn import memory_settings


class Rig:
    def __init__(self, home: Path) -> None:
        self.world = World(home)
        self.cfg = self.world.cfg
        self.r = fakeredis.FakeRedis()
        self.memory = Memory(self.world.store, memory_settings(self.cfg))
        self.model = True
        self.tools = ["clock", "recall"]
        self.duties = Duties()
        self.profiler = Profiler(lambda: self.cfg, self.r, self.memory,
                                 has_model=lambda: self.model, tool_names=lambda: self.tools,
                                 write=self.write, duties=self.duties)  # fmt: skip

    def write(self, op: Callable[[], object]) -> object:
        with self.memory.write():
            out = op()
        self.memory.settle()
        return out

    def ranges(self, n: int) -> list[profile_apply.PendingRange]:
        out = []
        for i in range(n):
            a = self.world.say(f"message {i}")
            out.append(self.world.summary([a]))
        return out

    def queued(self) -> list[str]:
        return derive.queue(self.cfg, self.r).get_job_ids()

    def gap(self, rows: list[LogRow], description: str, needs: str | None = None) -> None:
        rng = self.world.summary(rows)
        entity = OWNER if rows[0].is_owner else self.world.bob()
        self.world.apply({
            "type": "profile", "conversation": rng.conversation, "first_id": rng.first_id,
            "last_id": rng.last_id, "summary": rng.summary, "method": "model",
            "run_key": profile_apply.run_key(rng.conversation, rng.first_id, rng.last_id,
                                             rng.summary),
            "facts": [], "retire": [],
            "gaps": [{"entity": entity, "description": description, "needs": needs,
                      "evidence": [r.id for r in rows], "same_as": None}],
        })  # fmt: skip


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.world.store.close()


def test_both_duties_are_registered_every_check_every() -> None:
    duties = Duties()
    Profiler(lambda: Config(home=Path("/nonexistent")), fakeredis.FakeRedis(), None,  # type: ignore[arg-type]
             has_model=lambda: False, tool_names=list, write=lambda op: None,
             duties=duties)  # fmt: skip
    assert duties.names() == ["profile.plan", "profile.todo"]


def test_each_pending_range_is_enqueued_once_oldest_first_a_batch_a_round(rig: Rig) -> None:
    ranges = rig.ranges(3)
    rig.cfg = rig.cfg.model_copy(update={"profiles": ProfilesConfig(batch=2)})
    assert rig.profiler.plan_and_enqueue() == ranges[:2]
    assert rig.profiler.plan_and_enqueue() == [ranges[2]]  # the first two are queued already
    assert rig.profiler.plan_and_enqueue() == []
    keys = [profile_apply.run_key(p.conversation, p.first_id, p.last_id, p.summary)
            for p in ranges]  # fmt: skip
    assert rig.queued() == [job_id(rig.cfg.keys.prefix, k) for k in keys]
    job = derive.queue(rig.cfg, rig.r).fetch_job(rig.queued()[0])
    assert job is not None and job.func_name == JOB
    assert job.args == (DM, ranges[0].first_id, ranges[0].last_id, ranges[0].summary)
    assert job.kwargs == {"tool_names": ["clock", "recall"], "again": 0}
    assert job.meta["attempts"] == 1


def test_no_model_or_turned_off_plans_nothing(rig: Rig) -> None:
    rig.ranges(2)
    rig.model = False
    assert rig.profiler.plan_and_enqueue() == [] and rig.queued() == []
    rig.model = True
    rig.cfg = rig.cfg.model_copy(update={"profiles": ProfilesConfig(enabled=False)})
    assert rig.profiler.plan_and_enqueue() == [] and rig.queued() == []
    rig.cfg = rig.cfg.model_copy(update={"profiles": ProfilesConfig()})
    assert len(rig.profiler.plan_and_enqueue()) == 2  # a model came: the ranges waited


def test_the_job_ids_are_the_run_keys_per_prefix() -> None:
    assert job_id("a:", "profile:c@1-2/s1") != job_id("b:", "profile:c@1-2/s1")
    assert job_id("a:", "profile:c@1-2/s1") != job_id("a:", "profile:c@1-2/s2")
    assert job_id("a:", "k").startswith("relaybot-profile-") and len(job_id("a:", "k")) == 49


class Down:
    name = "down"

    def complete(self, messages: list[dict[str, Any]], tools: list[Any]) -> Completion:
        raise ModelError("connection refused", kind="connect")


def test_a_job_that_found_the_model_down_is_enqueued_again_after_a_backoff(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    [rng] = rig.ranges(1)
    monkeypatch.setattr("worker.summarize_job.load_config", lambda: rig.cfg)
    monkeypatch.setattr("worker.profile_job.make_model", lambda _cfg: Down())
    assert rig.profiler.plan_and_enqueue() == [rng]
    SimpleWorker([derive.queue(rig.cfg, rig.r)], connection=rig.r).work(burst=True)
    [jid] = [job_id(rig.cfg.keys.prefix, profile_apply.run_key(DM, rng.first_id, rng.last_id,
                                                               rng.summary))]  # fmt: skip
    job = derive.queue(rig.cfg, rig.r).fetch_job(jid)
    assert job is not None and job.return_value() == "model_down"
    assert rig.profiler.plan_and_enqueue() == []  # backing off: never dropped, not hammered
    monkeypatch.setattr(derive, "RETRY_FIRST", 0.0)
    assert rig.profiler.plan_and_enqueue() == [rng]
    job = derive.queue(rig.cfg, rig.r).fetch_job(jid)
    assert job is not None and job.meta["attempts"] == 2


def test_a_started_job_whose_jobs_process_stopped_beating_is_enqueued_again(rig: Rig) -> None:
    """A jobs process stopped or killed mid-job leaves the job "started" for good (and a
    zero-config chat starts a jobs process only when rq has work): once its heart has not beaten
    for LOST_AFTER, the planner makes it again; a job whose process beats is left alone."""
    [rng] = rig.ranges(1)
    assert rig.profiler.plan_and_enqueue() == [rng]
    [jid] = rig.queued()
    queue = derive.queue(rig.cfg, rig.r)
    job = queue.fetch_job(jid)
    assert job is not None
    queue.remove(job)  # taken off the queue by a jobs process, which started it
    job.set_status(JobStatus.STARTED)
    job.heartbeat(datetime.now(UTC), ttl=600)
    assert rig.profiler.plan_and_enqueue() == []  # running, its process beating
    job.heartbeat(datetime.now(UTC) - timedelta(seconds=derive.LOST_AFTER + 5), ttl=600)
    assert rig.profiler.plan_and_enqueue() == [rng]
    assert rig.queued() == [jid]


def test_a_job_run_by_rq_proposes_and_once_applied_the_range_is_done(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contract.messages import InboundMessage
    from tests.unit.test_profile_job import NO_GAPS, Model, fact, facts
    from worker.commands import apply_profile

    a = rig.world.say("I only drink green tea")
    rng = rig.world.summary([a])
    model = Model(profile_facts=[facts(fact("Bob drinks green tea", [a.id]))],
                  capability_gaps=[NO_GAPS])  # fmt: skip
    monkeypatch.setattr("worker.summarize_job.load_config", lambda: rig.cfg)
    monkeypatch.setattr("worker.profile_job.make_model", lambda _cfg: model)
    assert rig.profiler.plan_and_enqueue() == [rng]
    SimpleWorker([derive.queue(rig.cfg, rig.r)], connection=rig.r).work(burst=True)
    [(_sid, fields)] = rig.r.xrange(rig.cfg.keys.inbound)
    msg = InboundMessage.from_fields(fields)
    assert rig.profiler.plan_and_enqueue() == []  # finished a moment ago: its entry is coming
    rig.write(lambda: apply_profile(rig.memory, msg))
    assert rig.memory.pending_profiles(10) == []
    monkeypatch.setattr(derive, "FINISHED_HOLD", 0.0)
    assert rig.profiler.plan_and_enqueue() == []  # the run is recorded: never again


# -- gaps a tool covers ---------------------------------------------------------------------


def test_gaps_a_tool_covers_are_closed_at_start_and_when_the_tools_change(rig: Rig) -> None:
    a = rig.world.say("what's the weather?")
    rig.gap([a, rig.world.reply(a, "I can't")], "check the weather", needs="web_search")
    b = rig.world.say("book a table")
    rig.gap([b, rig.world.reply(b, "I can't")], "book a table", needs="reservations")
    rig.profiler.plan_and_enqueue()  # the start: nothing covered yet
    assert {g.needs for g in rig.memory.open_gaps() or []} == {"web_search", "reservations"}
    rig.tools = [*rig.tools, "web_search"]  # a reload brought a tool
    rig.profiler.plan_and_enqueue()
    [left] = rig.memory.open_gaps() or []
    assert left.needs == "reservations"
    [closed] = [g for g in gaps.listing(rig.world.conn, include_closed=True) if g.id != left.id]
    assert closed.closed_reason == "covered by the tool web_search"


def test_covered_gaps_are_closed_even_with_no_model(rig: Rig) -> None:
    a = rig.world.say("search the web for x")
    rig.gap([a, rig.world.reply(a, "I can't")], "search the web", needs="web_search")
    rig.model, rig.tools = False, ["web_search"]
    rig.profiler.plan_and_enqueue()
    assert rig.memory.open_gaps() == []


# -- TODO.md --------------------------------------------------------------------------------


def test_todo_lists_the_open_gaps_with_their_evidence_atomically_0600(rig: Rig) -> None:
    a = rig.world.say("what's the weather in Paris?")
    b = rig.world.reply(a, "I can't check the weather")
    rig.gap([a, b], "check the weather\n## injected heading", needs="web_search")
    c = rig.world.say("remind me about **taxes**", conversation="cli:home", sender="ada",
                      privacy=Privacy.OWNER, owner=True)  # fmt: skip
    d = rig.world.reply(c, "I cannot")
    rig.gap([c, d], "remind me about **taxes**")
    path = rig.cfg.home / TODO_FILE
    assert rig.profiler.write_todo() is True
    text = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert text.startswith("# TODO: what the assistant could not do\n")
    assert "check the weather \\#\\# injected heading" in text  # one line, no markup of its own
    assert f"- from: Bob ({rig.world.bob()})" in text
    assert f"- evidence: log {a.id}, {b.id}\n" in text and "- needs: web\\_search" in text
    assert "- asked: once, first 2026-" in text
    assert "- from: owner (the owner)" in text and "remind me about \\*\\*taxes\\*\\*" in text
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".TODO")] == []
    assert rig.profiler.write_todo() is False  # nothing changed: not rewritten
    rig.write(lambda: rig.memory.apply_command("cli/1-0", "memory.gap_close",
                                               {"id": (rig.memory.open_gaps() or [])[0].id,
                                                "why": "done"}))  # fmt: skip
    assert rig.profiler.write_todo() is True
    assert text != path.read_text()
    path.unlink()
    assert rig.profiler.write_todo() is True and path.exists()  # gone: written again


def test_todo_is_not_written_when_turned_off(rig: Rig) -> None:
    rig.cfg = rig.cfg.model_copy(update={"profiles": ProfilesConfig(todo=False)})
    assert rig.profiler.write_todo() is False
    assert not (rig.cfg.home / TODO_FILE).exists()


def test_an_erasure_rewrites_todo_at_once_or_removes_ours_when_turned_off(rig: Rig) -> None:
    """The erasure's answer says what became of TODO.md: rewritten without the erased gap's
    words before the answer goes; with ``todo = false``, relaybot's file removed, never one the
    owner wrote."""
    a = rig.world.say("book my chemotherapy appointment")
    b = rig.world.reply(a, "I can't book appointments")
    rig.gap([a, b], "book a chemotherapy appointment", needs="calendar")
    path = rig.cfg.home / TODO_FILE
    assert rig.profiler.write_todo() is True and "chemotherapy" in path.read_text()
    rig.write(lambda: rig.memory.apply_command("cli/2-0", "memory.erase", {
        "kind": "id", "target": str(a.id), "reason": "asked"}))  # fmt: skip
    assert rig.profiler.after_erasure() == "rewritten"
    assert "chemotherapy" not in path.read_text()
    rig.cfg = rig.cfg.model_copy(update={"profiles": ProfilesConfig(todo=False)})
    assert rig.profiler.after_erasure() == "removed ([profiles] todo = false)"
    assert not path.exists()
    path.write_text("# my own list\n")
    assert rig.profiler.after_erasure().startswith("nothing to clean")
    assert rig.profiler.write_todo() is False and path.read_text() == "# my own list\n"


def test_a_todo_that_cannot_be_written_is_said_once_and_never_stops_the_worker(rig: Rig) -> None:
    """TODO.md is a directory (or the home read-only): one warning, not one every round; turned
    off then, the removal that fails is said, not raised (a duty that raises stops the worker)."""
    path = rig.cfg.home / TODO_FILE
    a = rig.world.say("please fax this")
    rig.gap([a, rig.world.reply(a, "I have no way to send a fax")], "fax a letter")
    path.mkdir(parents=True)
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            assert rig.profiler.write_todo() is False
    assert [e["event"] for e in logs].count("profile.todo_failed") == 1
    path.rmdir()
    with structlog.testing.capture_logs() as logs:
        assert rig.profiler.write_todo() is True
    assert "profile.todo_recovered" in [e["event"] for e in logs]
    rig.cfg = rig.cfg.model_copy(update={"profiles": ProfilesConfig(todo=False)})

    def refused(*_a: object, **_k: object) -> None:
        raise PermissionError(13, "Permission denied")

    real = Path.unlink
    Path.unlink = refused  # type: ignore[method-assign,assignment]
    try:
        with structlog.testing.capture_logs() as logs:
            assert rig.profiler.write_todo() is False
    finally:
        Path.unlink = real  # type: ignore[method-assign]
    assert "profile.todo_failed" in [e["event"] for e in logs] and path.exists()


def test_a_failed_write_leaves_the_old_todo_and_no_temporary(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = rig.cfg.home / TODO_FILE
    assert rig.profiler.write_todo() is False and not path.exists()  # no gap yet: no file
    b = rig.world.say("please scan this")
    rig.gap([b, rig.world.reply(b, "I cannot scan")], "scan a letter")
    assert rig.profiler.write_todo() is True
    before = path.read_text()
    assert "scan a letter" in before
    a = rig.world.say("please fax this")
    rig.gap([a, rig.world.reply(a, "I have no way to send a fax")], "fax a letter")

    def broken(src: Any, dst: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    assert rig.profiler.write_todo() is False
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(".TODO")) == []
    monkeypatch.undo()
    assert rig.profiler.write_todo() is True and "fax a letter" in path.read_text()


def test_render_orders_by_count_and_bounds_the_evidence_listed() -> None:
    class Gap:
        def __init__(self, id_: int, count: int, evidence: tuple[int, ...]) -> None:
            self.id, self.entity, self.description, self.needs = id_, "e1", f"gap {id_}", None
            self.count, self.first_seen, self.last_seen = count, 1.0, 2.0
            self.evidence = evidence

    text = render([Gap(1, 1, (1,)), Gap(2, 5, tuple(range(100, 130)))], {"e1": "Bob"})
    assert text.index("Gap 2: gap 2") < text.index("Gap 1: gap 1")
    assert "- asked: 5 times" in text and "and 10 more" in text and "- needs: not known" in text
