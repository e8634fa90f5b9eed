"""An erasure reaches the copies made by quoting (memory/erasure.py, memory/copies.py).

A reply mail keeps the earlier mail it quotes in ``extra.quoted``: the owner mails a secret,
relaybot answers, the owner replies to the answer quoting it. Erasing the first row must take the
secret out of the later row's quote, and name its stream entry for the worker to delete."""

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

SECRET = "31-7-22"
_n = itertools.count(1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    s = MemoryStore(tmp_path / "memory.sqlite3")
    yield s
    s.close()


def mail(
    store: MemoryStore,
    text: str,
    *,
    quoted: str = "",
    conversation: str = "email:ada@example.org",
    reply: str = "ok",
) -> tuple[LogRow, LogRow]:
    n = next(_n)
    extra: dict[str, Any] = {"quoted": quoted} if quoted else {}
    msg = InboundMessage(
        kind=Kind.MESSAGE,
        channel="email",
        session=conversation,
        conversation=conversation,
        sender="ada@example.org",
        sender_name="Ada",
        privacy=Privacy.OWNER,
        text=text,
        ts=1_795_000_000.0 + n,
        event_id=f"<m{n}@example.org>",
        extra=extra,
    )
    sid = f"email/{1_795_000_000_000 + n}-0"
    with store.transaction():
        row = store.append_inbound(msg, sid, is_owner=True)
        out = store.append_reply(
            Reply(
                reply_id=f"r{n}",
                answers=sid,
                kind=ReplyKind.REPLY,
                channel="email",
                session=conversation,
                conversation=conversation,
                text=reply,
                created=msg.ts + 1,
            ),
            sender="relaybot",
            privacy=Privacy.OWNER,
        )
    return row, out


def everything(store: MemoryStore) -> str:
    rows = store.conn.execute("SELECT text, extra FROM log").fetchall()
    return json.dumps([list(r) for r in rows])


def erase_id(store: MemoryStore, row_id: int) -> dict[str, Any]:
    return erase(
        store, kind="id", target=str(row_id), reason="x", requested_by="ada", stream_id="cli/9-0"
    )


def test_a_later_reply_quoting_the_erased_mail_loses_its_quote(store: MemoryStore) -> None:
    first, _echo = mail(
        store,
        f"my locker combination is {SECRET}",
        reply=f"echo: my locker combination is {SECRET}",
    )
    quoting, _ = mail(
        store,
        "Thanks, also note my gym is on Tuesdays.",
        quoted="On Mon, 24 Nov 2026 at 14:39, relaybot <bot@example.org> wrote:\n"
        f"> echo: my locker\n> combination is {SECRET}",
    )
    assert SECRET in everything(store)
    erase_id(store, first.id)
    assert SECRET not in everything(store)
    text, extra = store.conn.execute(
        "SELECT text, extra FROM log WHERE id = ?", (quoting.id,)
    ).fetchone()
    assert text == "Thanks, also note my gym is on Tuesdays."  # the new text is kept
    assert "quoted" not in json.loads(extra) and json.loads(extra)["quote_erased"] > 0
    erasure = int(store.conn.execute("SELECT id FROM erasure").fetchone()[0])
    assert quoting.stream_id in copies_of(store.conn, erasure).entries  # its stream entry too


def test_a_quote_of_the_text_elsewhere_goes_and_unrelated_quotes_stay(store: MemoryStore) -> None:
    before, _ = mail(store, "hello", quoted="> an older quote", conversation="email:t0")
    first, _ = mail(store, f"my locker combination is {SECRET}", conversation="email:t1")
    elsewhere, _ = mail(
        store, "fwd", quoted=f"> My locker combination\n> is {SECRET}", conversation="email:t2"
    )
    unrelated, _ = mail(store, "hi", quoted="> the weather is fine", conversation="email:t3")
    plan = plan_erasure(store.conn, "id", str(first.id))
    assert plan.quote_ids == [elsewhere.id]
    erase_id(store, first.id)
    assert SECRET not in everything(store)
    kept = dict(store.conn.execute("SELECT id, extra FROM log WHERE direction = 'in'").fetchall())
    assert json.loads(kept[before.id])["quoted"] == "> an older quote"
    assert json.loads(kept[unrelated.id])["quoted"] == "> the weather is fine"
