"""A model's summary is used only when it is real text about its range (issue 26: the prompt's
example ``...`` echoed back was stored as a current ``method=model`` summary); a rejected reply
gets the extractive fallback, headed with why, never "no model" when a model answered
(memory/segments.py ``summary_problem``, worker/summarize_job.py)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from contract.config import Config
from contract.messages import InboundMessage, Privacy
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.rows import LogRow
from memory.segments import SUMMARY_PROMPT, fallback_summary, summary_problem
from memory.store import MemoryStore
from tests.unit.test_summaries import Scripted, entries
from worker.model import NoModel
from worker.summarize_job import derive

_n = itertools.count(1)
CONV = "matrix:dm-bob"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(Config(home=tmp_path).memory_path) as s:
        yield s


def said(store: MemoryStore, *texts: str, sender: str = "@bob:m.org") -> list[LogRow]:
    identity = Identity(OwnerResolver([]), "Ada")
    rows = []
    for text in texts:
        n = next(_n)
        msg = InboundMessage(channel="matrix", session=CONV, conversation=CONV, sender=sender,
                             sender_name="Bob", privacy=Privacy.DIRECT, text=text,
                             ts=1_795_000_000.0 + n, event_id=f"ev{n}")  # fmt: skip
        with store.transaction():
            rows.append(identity.append_inbound(store, msg, f"matrix/{n}-0", is_owner=False))
    return rows


BOAT = ("the boat leaves at nine tomorrow", "bring the blue tent please", "and the stove?")


@pytest.mark.parametrize(
    ("summary", "why"),
    [
        ("...", "no words (a placeholder such as '...')"),
        ("…", "no words (a placeholder such as '...')"),
        ("?!  -- ;", "no words (a placeholder such as '...')"),
        ("", "no words (a placeholder such as '...')"),
        ("summary", "too short to be a summary (1 word)"),
        ("N/A", "no words (a placeholder such as '...')"),
        ("Boat, tent.", "too short to be a summary (2 words)"),
        (SUMMARY_PROMPT.split("\n")[0], "it repeats the prompt's instructions"),
        ("Sure. Say who took part, what was discussed, decided, asked or promised.",
         "it repeats the prompt's instructions"),
        ("The weather in Lisbon was sunny and everyone enjoyed the beach volleyball.",
         "it mentions nothing of the messages it covers"),
        ("The owner and the assistant talked about what was decided.",
         "it mentions nothing of the messages it covers"),
    ],
)  # fmt: skip
def test_what_is_not_a_summary_of_the_range(store: MemoryStore, summary: str, why: str) -> None:
    rows = said(store, *BOAT)
    assert summary_problem(summary, rows, "relaybot") == why


@pytest.mark.parametrize(
    "summary",
    [
        "Bob said the boat leaves at nine tomorrow and asked for the blue tent and the stove.",
        "Bob is leaving by boat at 9; he wants a tent.",  # a paraphrase: boat, tent
        "Bob asked the owner about camping gear.",  # the sender's name
        "Bob organisiert die Abfahrt, das Zelt ist blau.",  # another language: the name
        "SUMMARY: [matrix / @bob:m.org] the boat leaves at nine | ...",  # the fake model's
    ],
)
def test_what_is_a_summary_of_the_range(store: MemoryStore, summary: str) -> None:
    assert summary_problem(summary, said(store, *BOAT), "relaybot") is None


def test_spaceless_scripts_count_each_character_and_names_count_as_words_of_the_range(
    store: MemoryStore,
) -> None:
    rows = said(store, "明日の船は九時に出ます", "青いテントを持ってきて")
    assert summary_problem("ボブは明日九時の船とテントについて話した。", rows, "relaybot") is None
    assert summary_problem("。。。", rows, "relaybot") == "no words (a placeholder such as '...')"
    hello = said(store, "hi", "ok")  # nothing but greetings: who took part is what it is about
    assert summary_problem("Bob said hello, nothing more.", hello, "relaybot") is None
    assert summary_problem("They greeted each other.", hello, "relaybot") == (
        "it mentions nothing of the messages it covers"
    )


def test_a_rejected_reply_gets_the_fallback_headed_with_why(
    store: MemoryStore, tmp_path: Path
) -> None:
    rows = said(store, *BOAT, "see you at the pier")
    cfg = Config(home=tmp_path)
    r = fakeredis.FakeRedis()
    model = Scripted('{"summary": "..."}', '{"summary": "..."}')
    assert derive(cfg, r, model, CONV, first_id=rows[0].id, last_id=rows[-1].id) == "proposed"
    [entry] = entries(r, cfg)
    assert '"method":"fallback"' in entry["extra"]
    assert entry["text"].startswith(
        "(extractive summary, model reply rejected: no words (a placeholder such as '...')) "
        "4 messages on matrix"
    )
    assert "no model" not in entry["text"]
    assert "the boat leaves at nine tomorrow" in entry["text"]
    # the second try is used when it is a summary
    r2 = fakeredis.FakeRedis()
    good = Scripted('{"summary": "..."}', '{"summary": "Bob: boat at nine, blue tent, stove."}')
    derive(cfg, r2, good, CONV, first_id=rows[0].id, last_id=rows[-1].id)
    [entry] = entries(r2, cfg)
    assert '"method":"model"' in entry["extra"]
    assert entry["text"] == "Bob: boat at nine, blue tent, stove."
    # no model at all: that is what the fallback says
    r3 = fakeredis.FakeRedis()
    derive(cfg, r3, NoModel(), CONV, first_id=rows[0].id, last_id=rows[-1].id)
    [entry] = entries(r3, cfg)
    assert entry["text"].startswith("(extractive summary, no model) 4 messages")
    assert fallback_summary(rows, "relaybot").startswith("(extractive summary, no model)")
