"""Layer 1: summaries over exact log ranges (memory/summaries.py, memory/segments.py), the job
that proposes them (worker/summarize_job.py) and the worker's planning (worker/derive.py)."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract.config import Config, ModelConfig
from contract.messages import InboundMessage, Kind, Privacy, Reply
from memory import summaries
from memory.erasure import erase
from memory.facade import Memory
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.rows import LogRow
from memory.segments import fallback_summary, parse_pause, parse_summary, segment
from memory.store import MemoryStore
from worker.derive import Deriver
from worker.model import Completion, ModelError, NoModel
from worker.summarize_job import derive
from worker.turn import memory_settings

_n = itertools.count(1)
CONV = "matrix:dm-bob"


class World:
    def __init__(self, home: Path) -> None:
        self.cfg = Config(home=home)
        self.store = MemoryStore(self.cfg.memory_path)
        self.identity = Identity(OwnerResolver([]), "Ada")

    def say(
        self,
        text: str,
        *,
        conversation: str = CONV,
        privacy: Privacy = Privacy.DIRECT,
        sender: str = "@bob:m.org",
        ts: float | None = None,
    ) -> LogRow:
        n = next(_n)
        channel = conversation.split(":", 1)[0]
        msg = InboundMessage(
            channel=channel, session=conversation, conversation=conversation, sender=sender,
            privacy=privacy, text=text, ts=ts or 1_795_000_000.0 + n, event_id=f"ev{n}",
        )  # fmt: skip
        with self.store.transaction():
            return self.identity.append_inbound(self.store, msg, f"{channel}/{n}-0", is_owner=False)

    def reply(self, row: LogRow, text: str) -> LogRow:
        with self.store.transaction():
            return self.store.append_reply(
                Reply(
                    reply_id=f"r{row.id}",
                    answers=row.stream_id,
                    channel=row.channel,
                    session=row.session,
                    conversation=row.conversation,
                    text=text,
                    created=row.ts + 1,
                ),
                sender="relaybot",
                privacy=Privacy(row.privacy),
            )

    def apply(self, p: summaries.Proposal) -> summaries.Summary:
        with self.store.transaction():
            return summaries.apply(self.store.conn, p)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.store.close()


def proposal(first: int, last: int, text: str = "they talked", **kw: Any) -> summaries.Proposal:
    version = kw.pop("version", 1)
    key = summaries.job_key(kw.get("conversation", CONV), first, last, version)
    return summaries.Proposal(
        conversation=kw.pop("conversation", CONV), first_id=first, last_id=last, text=text,
        method=kw.pop("method", "model"), job_key=key, **kw,
    )  # fmt: skip


def test_a_summary_names_its_exact_range_and_applying_twice_adds_one(world: World) -> None:
    rows = [world.say(f"m{i}") for i in range(4)]
    made = world.apply(proposal(rows[0].id, rows[-1].id))
    again = world.apply(proposal(rows[0].id, rows[-1].id))
    assert again == made
    assert (made.first_id, made.last_id, made.rows, made.privacy) == (
        rows[0].id, rows[-1].id, 4, "direct",
    )  # fmt: skip
    assert [s.id for s in summaries.current(world.store.conn, CONV)] == [made.id]


def test_what_memory_refuses(world: World) -> None:
    a = [world.say(f"a{i}") for i in range(3)]
    other = world.say("elsewhere", conversation="matrix:room", privacy=Privacy.GROUP)
    b = [world.say(f"b{i}", privacy=Privacy.GROUP) for i in range(2)]  # the audience changed
    with pytest.raises(summaries.Refused, match="not in"):
        world.apply(proposal(a[0].id, other.id))  # the range ends in another conversation
    with pytest.raises(summaries.Refused, match="change of privacy"):
        world.apply(proposal(a[0].id, b[-1].id))
    with pytest.raises(summaries.Refused, match="empty summary"):
        world.apply(proposal(a[0].id, a[-1].id, text="  "))
    world.apply(proposal(a[0].id, a[-1].id))
    with pytest.raises(summaries.Refused, match="already covered"):
        world.apply(proposal(a[1].id, a[-1].id))  # overlaps a current summary


def test_a_new_version_supersedes_the_old_which_is_kept_unchanged(world: World) -> None:
    rows = [world.say(f"m{i}") for i in range(3)]
    old = world.apply(proposal(rows[0].id, rows[-1].id, "first try"))
    new = world.apply(proposal(rows[0].id, rows[-1].id, "better", supersedes=old.id, version=2))
    conn = world.store.conn
    assert [s.text for s in summaries.current(conn, CONV)] == ["better"]
    assert [s.text for s in summaries.listing(conn, CONV, every=True)] == ["first try", "better"]
    assert new.supersedes == old.id
    with pytest.raises(summaries.Refused, match="not a current summary"):
        world.apply(proposal(rows[0].id, rows[-1].id, "x", supersedes=old.id, version=3))


def test_summaries_are_never_edited_or_deleted(world: World) -> None:
    rows = [world.say(f"m{i}") for i in range(2)]
    made = world.apply(proposal(rows[0].id, rows[-1].id))
    conn = world.store.conn
    with pytest.raises(sqlite3.IntegrityError, match="never edited"), world.store.transaction():
        conn.execute("UPDATE summary SET text = 'x' WHERE id = ?", (made.id,))
    with pytest.raises(sqlite3.IntegrityError, match="never deleted"), world.store.transaction():
        conn.execute("DELETE FROM summary WHERE id = ?", (made.id,))


def test_erasure_blanks_the_summaries_of_its_rows_and_the_rest_is_derived_again(
    world: World,
) -> None:
    rows = [world.say(t) for t in ("hello", "my pin is 4711", "ok", "bye")]
    made = world.apply(proposal(rows[0].id, rows[-1].id, "bob said his pin is 4711"))
    erase(world.store, kind="id", target=str(rows[1].id), reason="asked", requested_by="ada",
          stream_id="cli/1795999999999-0")  # fmt: skip
    conn = world.store.conn
    dump = "\n".join(str(r) for r in conn.execute("SELECT * FROM summary"))
    assert "4711" not in dump
    tomb = summaries.by_id(conn, made.id)
    assert tomb is not None and tomb.erased is not None and tomb.text == ""
    assert summaries.current(conn, CONV) == []
    # what remains of the range is uncovered again, the erased row left out
    assert [r.id for r in summaries.next_uncovered(conn, CONV, 10)[0]] == [
        rows[0].id,
        rows[2].id,
        rows[3].id,
    ]
    # a job that read the range before the erasure (4 messages) is refused; one that reads what
    # remains (3 messages, a hole where the erased one was) is taken
    with pytest.raises(summaries.Refused, match="erased"):
        world.apply(proposal(rows[0].id, rows[-1].id, "bob said 4711", version=2, rows=4))
    again = world.apply(proposal(rows[0].id, rows[-1].id, "bob said hello", version=2, rows=3))
    assert (again.rows, again.erased) == (3, None)
    assert summaries.next_uncovered(conn, CONV, 10)[0] == []


def test_segments_stop_at_a_change_of_privacy_and_at_max_rows(world: World) -> None:
    a = [world.say(f"a{i}") for i in range(3)]
    b = [world.say(f"b{i}", privacy=Privacy.GROUP) for i in range(5)]
    seg = segment([*a, *b], max_rows=10)
    assert seg is not None and seg.closed and [r.id for r in seg.rows] == [r.id for r in a]
    seg = segment(b, max_rows=10)
    assert seg is not None and not seg.closed
    seg = segment(b, max_rows=3)
    assert seg is not None and seg.closed and len(seg.rows) == 3
    assert segment([], max_rows=3) is None


def test_parsing_the_models_answers() -> None:
    assert parse_pause('Sure: {"paused": true}') is True
    assert parse_pause('{"paused": false}') is False
    assert parse_pause("yes") is None
    assert parse_summary('```json\n{"summary": "They met."}\n```') == "They met."
    assert parse_summary('{"summary": ""}') is None
    assert parse_summary("They met.") is None


def test_the_fallback_summary_is_extractive_and_deterministic(world: World) -> None:
    rows = [world.say("hi"), world.say("can we meet on friday?"), world.say("x" * 500)]
    text = fallback_summary(rows, "relaybot")
    assert text == fallback_summary(rows, "relaybot")
    assert text.startswith("(extractive summary, no model) 3 messages on matrix")
    assert "can we meet on friday?" in text and "@bob:m.org" in text
    assert max(len(line) for line in text.splitlines()) < 300


class Scripted:
    """A model port answering from a list (a string, or an exception to raise)."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.prompts: list[str] = []

    @property
    def name(self) -> str:
        return "scripted"

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        self.prompts.append(messages[-1]["content"])
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Completion(content=answer)


def entries(r: fakeredis.FakeRedis, cfg: Config) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in r.xrange(cfg.keys.inbound)
    ]


def test_the_job_proposes_a_summary_it_never_writes_memory(world: World) -> None:
    rows = [world.say(f"m{i}") for i in range(4)]
    r = fakeredis.FakeRedis()
    model = Scripted('{"paused": true}', '{"summary": "Bob counted from m0 to m3."}')
    out = derive(world.cfg, r, model, CONV, first_id=rows[0].id, last_id=rows[-1].id, mode="judge")
    assert out == "proposed"
    assert model.prompts[0].startswith("You read the last messages")
    assert "[matrix / @bob:m.org]" in model.prompts[1] and "m3" in model.prompts[1]
    [entry] = entries(r, world.cfg)
    msg = InboundMessage.from_fields(entry)
    assert msg.kind is Kind.DERIVED and msg.text == "Bob counted from m0 to m3."
    assert msg.extra["type"] == "summary" and msg.extra["method"] == "model"
    assert msg.extra["job_key"] == summaries.job_key(CONV, rows[0].id, rows[-1].id)
    assert summaries.listing(world.store.conn, every=True) == []  # jobs never write memory


def test_not_paused_is_noted_and_no_summary_is_proposed(world: World) -> None:
    rows = [world.say(f"m{i}") for i in range(4)]
    r = fakeredis.FakeRedis()
    out = derive(world.cfg, r, Scripted('{"paused": false}'), CONV, first_id=rows[0].id,
                 last_id=rows[-1].id, mode="judge")  # fmt: skip
    assert out == "open"
    assert r.hget(world.cfg.keys.derive_judged, CONV) == str(rows[-1].id).encode()
    assert entries(r, world.cfg) == []


def test_garbage_twice_gets_the_fallback_and_a_model_down_is_tried_again_later(
    world: World,
) -> None:
    rows = [world.say(f"m{i}") for i in range(4)]
    r = fakeredis.FakeRedis()
    derive(world.cfg, r, Scripted("no json", "still none"), CONV, first_id=rows[0].id,
           last_id=rows[-1].id)  # fmt: skip
    [entry] = entries(r, world.cfg)
    assert '"method":"fallback"' in entry["extra"]
    # a model answered, badly: not "no model" (issue 26)
    assert entry["text"].startswith(
        "(extractive summary, model reply rejected: not JSON with a summary) 4 messages"
    )
    down = Scripted(ModelError("down", kind="connect"))
    out = derive(world.cfg, r, down, CONV, first_id=rows[0].id, last_id=rows[-1].id)
    assert out == "model_down"  # the worker enqueues the job again, backing off
    assert len(entries(r, world.cfg)) == 1


def test_no_model_summarises_by_the_fallback_and_a_changed_range_is_stale(world: World) -> None:
    rows = [world.say(f"m{i}") for i in range(4)]
    r = fakeredis.FakeRedis()
    assert derive(world.cfg, r, NoModel(), CONV, first_id=rows[0].id, last_id=rows[-1].id) == (
        "proposed"
    )
    assert derive(world.cfg, r, NoModel(), CONV, first_id=rows[0].id, last_id=rows[-1].id + 99) == (
        "stale"
    )


def deriver(
    world: World,
    *,
    has_model: bool,
    now: float,
    busy: Callable[[str], bool] = lambda _conversation: False,
    **derive_cfg: Any,
) -> Deriver:
    cfg = world.cfg.model_copy(
        update={
            "derive": world.cfg.derive.model_copy(update={"check_every": 0.001, **derive_cfg}),
            "model": ModelConfig(timeout=5),
        }
    )
    memory = Memory(world.store, memory_settings(cfg))
    return Deriver(
        cfg, fakeredis.FakeRedis(), memory, has_model=has_model, clock=lambda: now, busy=busy
    )


def test_the_worker_plans_a_judgement_after_a_short_quiet_and_a_summary_after_a_long_one(
    world: World,
) -> None:
    rows = [world.say(f"m{i}", ts=None) for i in range(5)]
    last_ts = max(r.recorded_ts for r in rows)
    d = deriver(world, has_model=True, now=last_ts + 10, judge_after=60, quiet=600, min_rows=4)
    assert d.plan() == []  # not quiet long enough
    d.clock = lambda: last_ts + 61
    [p] = d.plan()
    assert (p.mode, p.first_id, p.last_id) == ("judge", rows[0].id, rows[-1].id)
    d.r.hset(world.cfg.keys.derive_judged, CONV, str(rows[-1].id))  # the model: not paused
    assert d.plan() == []
    d.clock = lambda: last_ts + 601
    [p] = d.plan()
    assert p.mode == "summarize"
    assert d.enqueue(p) is True
    assert d.enqueue(p) is False  # queued already: not twice


def test_too_short_an_open_segment_waits_and_no_model_means_the_quiet_period(
    world: World,
) -> None:
    rows = [world.say(f"m{i}") for i in range(2)]
    last_ts = max(r.recorded_ts for r in rows)
    d = deriver(world, has_model=False, now=last_ts + 100, judge_after=1, quiet=50, min_rows=4)
    assert d.plan() == []
    more = [world.say(f"n{i}") for i in range(2)]
    d.clock = lambda: max(r.recorded_ts for r in more) + 100
    [p] = d.plan()
    assert p.mode == "summarize" and p.last_id == more[-1].id


def test_a_job_that_found_the_model_down_is_enqueued_again_after_a_growing_backoff(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rq import SimpleWorker

    from worker import derive as derive_mod
    from worker.derive import Planned, enqueue, queue, retry_after

    assert [retry_after(n) for n in (1, 2, 3, 10)] == [10.0, 20.0, 40.0, 600.0]
    rows = [world.say(f"m{i}") for i in range(4)]
    r = fakeredis.FakeRedis()
    p = Planned(CONV, rows[0].id, rows[-1].id, "summarize")
    monkeypatch.setattr("worker.summarize_job.load_config", lambda: world.cfg)
    monkeypatch.setattr(
        "worker.summarize_job.make_model", lambda _cfg: Scripted(ModelError("down"))
    )
    assert enqueue(world.cfg, r, p) is True
    assert enqueue(world.cfg, r, p) is False  # queued: not twice
    SimpleWorker([queue(world.cfg, r)], connection=r).work(burst=True)
    assert enqueue(world.cfg, r, p) is False  # the model was down a moment ago: backing off
    monkeypatch.setattr(derive_mod, "RETRY_FIRST", 0.0)
    assert enqueue(world.cfg, r, p) is True
    job = queue(world.cfg, r).fetch_job(p.job_id(world.cfg.keys.prefix))
    assert job is not None and job.meta["attempts"] == 2


def test_a_model_that_refuses_the_prompt_gets_the_fallback_not_endless_retries(
    world: World,
) -> None:
    rows = [world.say(f"m{i}") for i in range(4)]
    r = fakeredis.FakeRedis()
    too_long = ModelError("context length exceeded", kind="status", status=400, retryable=False)
    out = derive(world.cfg, r, Scripted(too_long, too_long), CONV, first_id=rows[0].id,
                 last_id=rows[-1].id)  # fmt: skip
    assert out == "proposed"
    [entry] = entries(r, world.cfg)
    assert '"method":"fallback"' in entry["extra"] and '"rows":4' in entry["extra"]
    assert entry["text"].startswith("(extractive summary, model reply rejected: the model failed")


def test_what_a_job_proposes_is_bounded() -> None:
    ok = {"first_id": 1, "last_id": 2, "job_key": "k"}
    assert summaries.proposal_of("c", "t", ok).last_id == 2
    for bad in ({**ok, "supersedes": 2**70}, {**ok, "first_id": -1}, {**ok, "rows": 0}):
        with pytest.raises(ValueError, match="out of range"):
            summaries.proposal_of("c", "t", bad)
    with pytest.raises(ValueError, match="characters"):
        summaries.proposal_of("c", "x" * 60_000, ok)


def test_a_complete_segment_is_summarised_while_the_conversation_goes_on(world: World) -> None:
    rows = [world.say(f"m{i}") for i in range(7)]
    last_ts = max(r.recorded_ts for r in rows)
    running = lambda _conversation: True  # noqa: E731  # a turn of it runs: it has not paused
    d = deriver(
        world, has_model=True, now=last_ts + 1, judge_after=60, quiet=600, max_rows=3, busy=running
    )
    [p] = d.plan()  # m0..m2 is complete (newer messages follow): summarised now
    assert (p.first_id, p.last_id, p.mode) == (rows[0].id, rows[2].id, "summarize")


def test_an_erasure_has_the_rest_of_the_range_derived_again(world: World) -> None:
    rows = [world.say(f"m{i}") for i in range(4)]
    made = world.apply(proposal(rows[0].id, rows[-1].id))
    last_ts = max(r.recorded_ts for r in rows)
    d = deriver(world, has_model=False, now=last_ts + 10_000, quiet=600)
    assert d.plan() == []  # covered: nothing to do, the conversation is dropped
    assert CONV not in d.active
    erase(world.store, kind="id", target=str(rows[1].id), reason="asked", requested_by="ada",
          stream_id="cli/1795999999997-0")  # fmt: skip
    [p] = d.plan()  # noticed without any new message
    assert (p.first_id, p.last_id) == (rows[0].id, rows[-1].id)
    assert summaries.by_id(world.store.conn, made.id).erased is not None  # type: ignore[union-attr]


def test_a_job_lost_between_the_queue_and_its_start_is_enqueued_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker import derive as derive_mod
    from worker.derive import Planned, enqueue, queue

    rows = [world.say(f"m{i}") for i in range(4)]
    r = fakeredis.FakeRedis()
    p = Planned(CONV, rows[0].id, rows[-1].id, "summarize")
    assert enqueue(world.cfg, r, p) is True
    q = queue(world.cfg, r)
    r.lpop(q.key)  # a jobs process took it and died before rq recorded the start
    assert enqueue(world.cfg, r, p) is False  # queued a moment ago: rq may still start it
    monkeypatch.setattr(derive_mod, "LOST_AFTER", 0.0)
    assert enqueue(world.cfg, r, p) is True
    assert q.get_job_ids() == [p.job_id(world.cfg.keys.prefix)]


def test_a_proposal_that_read_an_erased_message_is_refused_and_planned_again_as_a_new_job(
    world: World,
) -> None:
    """Issue 24, item 10c: a job read four messages; an erasure took one before its proposal
    came. The proposal is refused (never applied with the erased text), and the deriver plans the
    range again at once, as a job of its own (the finished one would hold the same id back)."""
    rows = [world.say(f"m{i}") for i in range(4)]
    last_ts = max(r.recorded_ts for r in rows)
    d = deriver(world, has_model=False, now=last_ts + 10_000, quiet=600, min_rows=2)
    [first] = d.plan()
    assert first.rows == 4
    erase(world.store, kind="id", target=str(rows[1].id), reason="asked", requested_by="ada",
          stream_id="cli/1795999999996-0")  # fmt: skip
    stale = proposal(rows[0].id, rows[-1].id, "m0 m1 m2 m3", rows=4)
    with pytest.raises(summaries.Refused, match="erased since the job read it"):
        world.apply(stale)
    # a proposal that does not say how many messages it read is refused too: the range holds
    # an erased one, which it may have read
    with pytest.raises(summaries.Refused, match="erased"):
        world.apply(proposal(rows[0].id, rows[-1].id, "m0 m1 m2 m3"))
    d.active.pop(CONV, None)  # even a conversation the deriver had let go of
    [again] = d.plan()
    assert (again.first_id, again.last_id, again.rows) == (rows[0].id, rows[-1].id, 3)
    assert again.job_id("p:") != first.job_id("p:")
    made = world.apply(proposal(rows[0].id, rows[-1].id, "m0 m2 m3", rows=3))
    assert made.rows == 3
