"""memory.context.HistoryLines: the worker's ready-made history gives the very same context as
going row by row, for every budget, with the current message first, absent, or not stored, and
after the lines were added piece by piece and compacted many times."""

from __future__ import annotations

import random

import pytest

from memory.context import build_context
from memory.lines import HistoryLines
from memory.rows import LogRow
from memory.sections import CuratedSection, NotesSection

NAME = "relaybot"


def row(i: int, text: str, *, direction: str = "in") -> LogRow:
    return LogRow(
        id=i,
        direction=direction,
        stream_id=f"{i}-0",
        kind="message",
        channel="cli",
        session="cli:a",
        conversation="cli:a",
        sender="owner",
        sender_name="",
        entity="owner",
        is_owner=True,
        privacy="owner",
        text=text,
        event_id=f"e{i}",
        reply_id=None,
        platform_ts=1_790_000_000.0 + i,
        recorded_ts=1_790_000_000.0 + i,
    )


def context(rows: list[LogRow], current: LogRow, budget: int, ready: HistoryLines | None):
    return build_context(
        system_prompt="You are relaybot.",
        history=rows,
        current=current,
        budget_tokens=budget,
        assistant_name=NAME,
        sections=[CuratedSection("# MEMORY\n- tea"), NotesSection(["#1 a note"])],
        ready=ready,
    )


@pytest.mark.parametrize("limit", [1, 7, 40])
def test_ready_lines_give_the_same_context_as_the_rows(limit: int) -> None:
    rnd = random.Random(limit)
    log: list[LogRow] = []  # oldest first
    ready = HistoryLines(NAME, limit)
    compared = 0
    for step in range(300):
        new = [
            row(
                len(log) + k + 1,
                "word " * rnd.choice([0, 1, 3, 30, 300]) + "\nsecond line" * (k % 2),
            )
            for k in range(rnd.randint(1, 3))
        ]
        log += new
        ready.extend(list(reversed(new)))
        newest_first = list(reversed(log))[:limit]  # what the window's rows are
        current = newest_first[0]
        cases = [
            current,  # the usual: the current message is the newest row
            row(0, "not stored (degraded memory)"),
            row(len(log) + 1, "stored after these rows were read"),
        ]
        if len(newest_first) > 1:
            cases.append(newest_first[1])  # an older one: newer rows are here
        for cur in cases:
            for budget in (0, 20, 60, 150, 400, 2_000, 50_000):
                assert context(newest_first, cur, budget, ready) == context(
                    newest_first, cur, budget, None
                ), (step, cur.id, budget)
                compared += 1
    assert compared >= 6_000


def test_lines_for_another_assistant_name_are_not_used() -> None:
    rows = [row(2, "two"), row(1, "one")]
    ready = HistoryLines("someone-else", 10)
    ready.extend(rows)
    got = context(rows, rows[0], 5_000, ready)
    assert got == context(rows, rows[0], 5_000, None)
    assert "[cli / owner]" in got[0]["content"]
