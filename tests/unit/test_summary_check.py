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
        "Bob asked the owner about the tent and other camping gear.",
        "SUMMARY: @bob:m.org: the boat leaves at nine | @bob:m.org: and the stove?",  # fake model
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
    hello = said(store, "hi", "ok")  # nothing but greetings: greeting is what it is about
    assert summary_problem("Bob said hello, nothing more.", hello, "relaybot") is None
    assert summary_problem("They greeted each other.", hello, "relaybot") is None
    assert summary_problem("A conversation with Bob.", hello, "relaybot") == (
        "only names, nothing said about the messages"
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


def row(text: str, *, out: bool = False, channel: str = "email", n: int = 0) -> LogRow:
    """A row of a conversation with Bob Smith <bob@example.com> (``out``: the assistant's)."""
    return LogRow(id=n + 1, direction="out" if out else "in", stream_id=f"s/{n}", kind="message",
                  channel=channel, session="c", conversation="c",
                  sender="relaybot" if out else "bob@example.com",
                  sender_name="relaybot" if out else "Bob Smith", entity=None, is_owner=False,
                  privacy="direct", text=text, event_id=f"e{n}", reply_id=None, platform_ts=None,
                  recorded_ts=1_795_000_000.0 + n)  # fmt: skip


def rng(*texts: str) -> list[LogRow]:
    """A range: its texts alternate Bob's and the assistant's (a text starting with '>')."""
    return [row(t.removeprefix(">"), out=t.startswith(">"), n=i) for i, t in enumerate(texts)]


INVOICE = rng("Can you send me the invoice for March?")
TRIP = rng("the boat leaves at nine tomorrow", "bring the blue tent please", "and the stove?")
GREETINGS = rng("hi", "hello!", ">hey Bob")


@pytest.mark.parametrize(
    ("texts", "summary"),
    [
        (INVOICE, "Bob asked for the March invoice."),  # one message
        (INVOICE, "Invoice request, March."),  # three words
        (rng("Running 10 minutes late"), "Bob is running ten minutes late."),
        (rng("Treffen wir uns morgen um 10 Uhr am Bahnhof?", ">Ja, ich bringe die Karten mit."),
         "Bob schlägt ein Treffen morgen um 10 Uhr am Bahnhof vor; relaybot bringt die Karten."),
        (rng("明日の会議は三時からです", ">了解、資料を準備します"),
         "明日三時から会議、資料を準備する。"),
        (rng("¿Vienes a la cena del sábado?", ">Sí, llevo el vino"),
         "Bob invita a la cena del sábado; relaybot lleva el vino."),
        (rng("2026-12-01?", ">14:30", "ok 14:45"),  # numbers and dates only
         "Bob proposed 1 December 2026; relaybot said 14:30, Bob 14:45."),
        (rng("Flight LH1234 lands 2026-12-24 at 18:05"), "Bob's flight LH 1234 lands at 18:05."),
        (GREETINGS, "Bob and relaybot greeted each other."),  # only greetings
        (GREETINGS, "They said hello, nothing more."),
        (rng("thanks!", ">bye"), "Bob thanked relaybot and said goodbye."),
        (rng("👍", "🎉"), "Bob reacted with a thumbs up and a party emoji."),  # no words at all
        (rng("what's the weather in Lisbon?", ">Sunny, 24 degrees."),
         "Bob asked about the weather in Lisbon; relaybot said sunny and 24 degrees."),
        (rng("the deploy failed on step 3 with exit code 137", ">probably OOM, raise the limit"),
         "The deploy failed at step 3 (exit 137, out of memory); the memory limit must go up."),
        (TRIP, "Bob\u2019s boat leaves at 9; he wants the blue tent and asks about the stove."),
        (rng("my todo for friday: renew passport", "and the TBD items?"),  # its own words
         "Bob's TODO for Friday is renewing the passport; the TBD items are open."),
        (rng("use lorem ipsum for the mockup text"), "Bob wants lorem ipsum as the mockup text."),
        (TRIP, "Trip: boat at nine, tent, stove … all planned by Bob."),
        (TRIP, "Unfortunately the boat leaves at nine; none of the tents are packed."),
        (TRIP, "Not enough tents: Bob brings the blue one; the boat leaves at nine."),
        (TRIP, "Bob will come here with the boat at nine; the stove stays."),
    ],
)  # fmt: skip
def test_real_short_summaries_of_varied_ranges_pass(texts: list[LogRow], summary: str) -> None:
    assert summary_problem(summary, texts, "relaybot") is None


INSTRUCTIONS = SUMMARY_PROMPT.split("\n")[0]


@pytest.mark.parametrize(
    ("texts", "summary", "why"),
    [
        (TRIP, "A conversation with Bob.", "only names, nothing said about the messages"),
        (GREETINGS, "A conversation with Bob.", "only names, nothing said about the messages"),
        (TRIP, "TODO: summary goes here, example.", "a placeholder ('TODO'), not a summary"),
        (TRIP, "Nothing relevant; example com.",
         "it declines or says there is nothing, not a summary"),
        (GREETINGS, "Nothing relevant; example com.",
         "it declines or says there is nothing, not a summary"),
        (TRIP, "[email / Bob Smith] 2026-11-29 04:28 UTC: ...",
         "it copies the messages' lines ([channel / who] time: text), not a summary"),
        (TRIP, "[email / bob@example.com] 2026-11-29 04:28 UTC: the boat leaves at nine tomorrow",
         "it copies the messages' lines ([channel / who] time: text), not a summary"),
        (TRIP, "I cannot summarize this", "it declines or says there is nothing, not a summary"),
        (TRIP, "I\u2019m sorry, but I can't summarise the boat trip.",
         "it declines or says there is nothing, not a summary"),
        (TRIP, "As an AI model I have no access to the tent.",
         "it declines or says there is nothing, not a summary"),
        (TRIP, "There is nothing to summarise here.",
         "it declines or says there is nothing, not a summary"),
        (TRIP, "Summary: ...", "too short to be a summary (1 word)"),
        (TRIP, "Summary of the boat trip: ...",
         "a template with '...' where the summary should be"),
        (TRIP, "Bob Smith: … relaybot: …", "a template with '...' where the summary should be"),
        (TRIP, "N/A", "no words (a placeholder such as '...')"),
        (TRIP, "<summary>", "too short to be a summary (1 word)"),
        (TRIP, "<summary>Bob Smith, boat</summary>", "a placeholder ('<summary>'), not a summary"),
        (TRIP, "[Insert the summary of the boat here]",
         "a placeholder ('insert ... here'), not a summary"),
        (TRIP, "Lorem ipsum dolor sit amet, the boat.",
         "a placeholder ('lorem ipsum'), not a summary"),
        (TRIP, "Summary: TBD (boat).", "a placeholder ('TBD'), not a summary"),
        (TRIP, "Placeholder text about the boat.", "a placeholder ('placeholder'), not a summary"),
        (TRIP, INSTRUCTIONS, "it repeats the prompt's instructions"),
        (TRIP, '{"summary": "..."}', "too short to be a summary (1 word)"),
        (TRIP, "Bob Smith, bob@example.com, relaybot",
         "only names, nothing said about the messages"),
        (TRIP, "Conversation between Bob Smith and the owner on email.",
         "only names, nothing said about the messages"),
        (TRIP, "Summarise the conversation.", "only common words, nothing said about the messages"),
        (TRIP, "Bob talked about the weather in Lisbon.",
         "it mentions nothing of the messages it covers"),
        (rng("明日の船は九時に出ます"), "ボブさんとの会話です。",
         "it mentions nothing of the messages it covers"),
    ],
)  # fmt: skip
def test_placeholders_echoes_and_refusals_are_rejected_and_say_why(
    texts: list[LogRow], summary: str, why: str
) -> None:
    assert summary_problem(summary, texts, "relaybot") == why


def test_names_and_addresses_never_make_a_summary_about_its_range() -> None:
    """Relatedness comes from what the messages say, not from who said it nor where: the sender's
    name, handle or domain, the channel and the assistant's name are names, even when the
    messages also say them."""
    rows = rng("Bob here, from example.com: the boat leaves at nine")
    for placeholder in ("A conversation with Bob.", "Bob from example com.", "Bob Smith on email."):
        assert summary_problem(placeholder, rows, "relaybot") == (
            "only names, nothing said about the messages"
        ), placeholder
    # a summary in another language than its messages shares no word but names: rejected
    assert summary_problem("Bob organisiert die Abfahrt, das Zelt ist blau.", TRIP, "relaybot") == (
        "it mentions nothing of the messages it covers"
    )


def test_a_line_shape_or_a_marker_the_messages_themselves_hold_is_quoted_not_a_placeholder() -> (
    None
):
    quoted = "[email / bob@example.com] 2026-11-29 04:28 UTC: the boat leaves at nine"
    rows = rng(f"you wrote: {quoted}", ">so the boat leaves at nine")
    assert (
        summary_problem(f"Bob quoted {quoted}; the boat leaves at nine.", rows, "relaybot") is None
    )
    other = "[email / bob@example.com] 2026-11-29 05:00 UTC: the boat leaves at nine"
    assert summary_problem(f"Bob quoted {other}.", rows, "relaybot") == (
        "it copies the messages' lines ([channel / who] time: text), not a summary"
    )
