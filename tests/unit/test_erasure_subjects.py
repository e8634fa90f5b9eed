"""An erased mail's subject leaves the replies of its thread (memory/subjects.py).

Bob mails "Subject: the Zanzibar merger"; Alice answers in the thread ("Re: the Zanzibar
merger"). Erasing Bob's mail must take the subject out of Alice's row (text and extra), name her
stream entry and Message-ID for the worker (deleted, and her cached headers blanked), and leave
mails of other threads, and earlier mails, as they were."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.messages import InboundMessage, Kind, Privacy, Reply, ReplyKind
from memory.copies import copies_of
from memory.erasure import erase, plan_erasure
from memory.rows import LogRow
from memory.store import MemoryStore
from memory.subjects import bare, without_subject

SUBJECT = "the Zanzibar merger"
_n = itertools.count(1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    s = MemoryStore(tmp_path / "memory.sqlite3")
    yield s
    s.close()


def mail(
    store: MemoryStore, sender: str, subject: str, body: str, *, thread: str = "<t1@example.org>"
) -> LogRow:
    n = next(_n)
    conversation = f"email:{thread.strip('<>')}/bob+alice"
    msg = InboundMessage(
        kind=Kind.MESSAGE,
        channel="email",
        session=conversation,
        conversation=conversation,
        sender=sender,
        privacy=Privacy.GROUP,
        text=f"Subject: {subject}\n\n{body}" if subject else body,
        ts=1_795_000_000.0 + n,
        event_id=f"<m{n}@example.org>",
        extra={"subject": subject, "thread": thread, "to": [], "cc": []},
    )
    with store.transaction():
        return store.append_inbound(msg, f"email/{1_795_000_000_000 + n}-0", is_owner=False)


def row(store: MemoryStore, row_id: int) -> tuple[str, dict[str, Any]]:
    text, extra = store.conn.execute(
        "SELECT text, extra FROM log WHERE id = ?", (row_id,)
    ).fetchone()
    return str(text), json.loads(extra)


def erase_id(store: MemoryStore, row_id: int) -> dict[str, Any]:
    return erase(
        store, kind="id", target=str(row_id), reason="x", requested_by="o", stream_id="cli/9-0"
    )


def test_the_replies_in_its_thread_lose_the_erased_subject(store: MemoryStore) -> None:
    earlier = mail(store, "alice@example.org", "Re: the Zanzibar merger", "before it, oddly")
    bobs = mail(store, "bob@example.org", SUBJECT, "we buy them on Friday")
    reply = mail(store, "alice@example.org", "RE: Re:  The Zanzibar  Merger", "great news")
    fwd = mail(store, "carol@example.org", "Fwd: the zanzibar merger (update)", "see below")
    other = mail(store, "alice@example.org", SUBJECT, "same words, another thread", thread="<t2>")
    unrelated = mail(store, "alice@example.org", "Re: lunch", "at noon")

    plan = plan_erasure(store.conn, "id", str(bobs.id))
    assert plan.subject_ids == [reply.id, fwd.id]
    result = erase_id(store, bobs.id)

    text, extra = row(store, reply.id)
    assert text == "great news"
    assert extra["subject"] == "" and extra["subject_erased"] == result["erasure"]
    assert extra["thread"] == "<t1@example.org>"  # the rest of it stays
    assert row(store, fwd.id)[0] == "see below"
    everything = json.dumps(store.conn.execute("SELECT text, extra FROM log").fetchall())
    # text and extra of the earlier mail and of the one in another thread
    assert everything.casefold().count("zanzibar") == 4
    assert row(store, earlier.id)[1]["subject"] == "Re: the Zanzibar merger"
    assert row(store, other.id)[1]["subject"] == SUBJECT
    assert row(store, unrelated.id)[1]["subject"] == "Re: lunch"
    hits = store.conn.execute(
        "SELECT count(*) FROM log_fts WHERE log_fts MATCH 'zanzibar'"
    ).fetchone()[0]
    assert hits == 2  # the index follows

    copies = copies_of(store.conn, result["erasure"])
    assert {reply.stream_id, fwd.stream_id} <= copies.entries
    assert copies.subject_event_ids == {("email", reply.event_id), ("email", fwd.event_id)}


def test_a_mail_without_a_subject_takes_none_away(store: MemoryStore) -> None:
    bobs = mail(store, "bob@example.org", "", "no subject here")
    reply = mail(store, "alice@example.org", "Re: anything", "hi")
    assert plan_erasure(store.conn, "id", str(bobs.id)).subject_ids == []
    erase_id(store, bobs.id)
    assert row(store, reply.id)[1]["subject"] == "Re: anything"


def test_subjects_compare_without_prefixes_case_and_blanks() -> None:
    assert bare("Re: AW: Fwd:  The   Plan ") == "the plan"
    assert bare("RE[2]: the plan") == "the plan"
    assert without_subject("Subject: Re: x\n\nbody", "Re: x") == "body"
    assert without_subject("Subject: Re: x", "Re: x") == ""
    assert without_subject("Subject: Re: xy\n\nbody", "Re: x") == "Subject: Re: xy\n\nbody"
    assert without_subject("body", "Re: x") == "body"


def test_the_reply_that_answered_such_a_mail_is_erased_its_input_held_the_subject(
    store: MemoryStore,
) -> None:
    bobs = mail(store, "bob@example.org", SUBJECT, "we buy them on Friday")
    alices = mail(store, "alice@example.org", f"Re: {SUBJECT}", "great news")
    with store.transaction():
        answer = store.append_reply(
            Reply(
                reply_id="r-alice",
                answers=alices.stream_id,
                kind=ReplyKind.REPLY,
                channel="email",
                session=alices.conversation,
                conversation=alices.conversation,
                text="Glad the Zanzibar merger works out",
                created=alices.ts + 1,
            ),
            sender="relaybot",
            privacy=Privacy.GROUP,
        )
    result = erase_id(store, bobs.id)
    assert result["derived_replies"] == 1
    assert row(store, answer.id)[0] == ""
    assert row(store, alices.id)[0] == "great news"
    copies = copies_of(store.conn, result["erasure"])
    assert "r-alice" in copies.reply_ids
