"""The cost of a turn's context with layer-1 summaries, against the same turn without, at 10k,
100k and 1M messages.

The databases of bench/context.py (generated once, cached under bench/out/context/) are copied and
given summaries as the jobs would leave them: one per 50 consecutive rows of every conversation,
each ~600 characters of the same words. Then, on the worker's long-lived store, the turn as the
worker builds it (its history window into ``build_context``, bench.context.ours_turn) is timed
side by side with the same turn plus the summaries section (memory/summary_view.section_summaries:
the conversation's own summaries and, in the owner's scope, the related ones of others, rendered
within the section's share), for an owner scope and a direct scope. p50 and p95 in ms.

    .venv/bin/python -m bench.summary_context            # 10k, 100k, 1M
    .venv/bin/python -m bench.summary_context --quick    # 10k and 100k
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import SMOKE_HELP, machine_note, median, pct, table
from bench.context import (
    _WORDS,
    ASSISTANT,
    BUDGET,
    DIRECT_CONV,
    HISTORY_ROWS,
    OWNER_CONV,
    current_row,
    dataset,
    timed,
)
from contract import logs
from contract.config import DEFAULT_SYSTEM_PROMPT
from contract.messages import Privacy
from memory.bulk import BulkLoad, log_top
from memory.context import build_context
from memory.privacy import Scope
from memory.store import MemoryStore
from memory.summary_view import SummariesSection, line, section_summaries
from memory.window import HistoryWindows

PER_SUMMARY = 50


def add_summaries(db: Path) -> int:
    """One summary per PER_SUMMARY rows of each conversation (direct SQL, as apply leaves them)."""
    rng = random.Random(11)
    made: list[tuple[Any, ...]] = []
    with BulkLoad(db) as load:
        for conv in load.conversations():
            rows = load.conversation_rows(conv)
            for k in range(0, len(rows) - PER_SUMMARY + 1, PER_SUMMARY):
                part = rows[k : k + PER_SUMMARY]
                text = " ".join(rng.choices(_WORDS, k=110))
                made.append(
                    (conv, part[0][1], part[0][2], part[0][0], part[-1][0], len(part), part[0][3],
                     part[-1][3], text, "model", f"{conv}@{part[0][0]}-{part[-1][0]}#v1",
                     part[-1][3]),
                )  # fmt: skip
        load.insert_summaries(made)
    return len(made)


def turn(windows: HistoryWindows, scope: Scope, current: Any, with_summaries: bool) -> Any:
    rows, ready = windows.history(scope, ASSISTANT)
    sections = []
    if with_summaries:
        lines = [line(s) for s in section_summaries(
            windows.store.conn, scope, conversation=scope.conversation, before_id=current.id,
            text=current.text)]  # fmt: skip
        if lines:
            sections.append(SummariesSection(lines))
    return build_context(
        system_prompt=DEFAULT_SYSTEM_PROMPT, history=rows, current=current, budget_tokens=BUDGET,
        assistant_name=ASSISTANT, ready=ready, sections=sections,
    )  # fmt: skip


def measure(size: int, work: Path, quick: bool) -> list[list[Any]]:
    src, _jl, _ = dataset(size)
    db = work / f"summaries-{size}.sqlite3"
    shutil.copy(src, db)
    made = add_summaries(db)
    out = []
    with MemoryStore(db) as store:
        next_id = log_top(store)[0] + 1
        for name, scope in (
            ("owner", Scope(conversation=OWNER_CONV, privacy=Privacy.OWNER)),
            ("direct", Scope(conversation=DIRECT_CONV, privacy=Privacy.DIRECT)),
        ):
            current = current_row(scope.conversation, scope.privacy, next_id)
            windows = HistoryWindows(store, limit=HISTORY_ROWS)
            shown = len(section_summaries(store.conn, scope, conversation=scope.conversation,
                                      before_id=current.id, text=current.text))  # fmt: skip
            reps = 100 if quick else 500
            results = {}
            for _ in range(2):  # alternate: the same period for both
                for label in ("without", "with"):
                    ms = timed(lambda w=label == "with": turn(windows, scope, current, w),  # noqa: B023
                               reps=reps, budget_s=5)  # fmt: skip
                    results.setdefault(label, []).extend(ms)
            out.append([f"{size:,}", name, made, shown,
                        median(results["without"]), pct(results["without"], 95),
                        median(results["with"]), pct(results["with"], 95)])  # fmt: skip
            print(f"  {size:>9,} {name}: without {median(results['without']):.3f} ms, with "
                  f"{median(results['with']):.3f} ms", flush=True)  # fmt: skip
    db.unlink()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.summary_context")
    p.add_argument("--quick", action="store_true", help="10k and 100k only")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (1,000 messages)")
    args = p.parse_args(argv)
    logs.configure("bench", level="WARNING")
    print(machine_note())
    if args.smoke:
        args.quick, sizes = True, (1_000,)
    else:
        sizes = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sumctx-") as tmp:
        for size in sizes:
            rows += measure(size, Path(tmp), args.quick)
    print()
    print(table(["messages", "scope", "summaries", "summary lines", "without p50", "without p95",
                 "with p50", "with p95"], rows,
                title="Turn context build (ms), without and with summaries"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
