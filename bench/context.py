"""Context build time against history size: relaybot's memory vs a history.jsonl.

For 10k, 100k and 1M messages in memory, time what the worker does for each turn: its
per-scope history window (memory.window: rows new since the last turn, lines ready) into
``build_context`` ("turn"), and the row-by-row way it rests on, ``build_context`` over
``visible_history(store, scope, limit=400)`` — for an owner scope (all
channels) and a ``direct`` scope (one conversation, through the (conversation, id) index) — on a
freshly opened store (cold: reopen the database, the writer's cache is loaded at open) and on the
worker's long-lived store (warm: its cache of the newest rows and the per-row line memo).

Baseline, side by side, the squidbot way: the same messages in one global ``history.jsonl``; read
the whole file and keep the last N lines (N = 400, filtered to the conversation for the direct
scope), parse them and build the same context. Also shown: squidbot's own ``load_history``, which
parses every line of the file.

The databases and JSONL files are generated once per size and cached under bench/out/context/.

    .venv/bin/python -m bench.context            # 10k, 100k, 1M (first run generates ~1 min)
    .venv/bin/python -m bench.context --quick    # 10k and 100k, fewer repetitions
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._common import OUT, SMOKE_HELP, insert_log_rows, machine_note, median, pct, table
from contract import logs
from contract.config import DEFAULT_SYSTEM_PROMPT
from contract.messages import InboundMessage, Privacy, Reply, ReplyKind
from memory.bulk import BulkLoad, log_top, rows_in
from memory.context import build_context
from memory.privacy import Scope, visible_history
from memory.rows import LOG_COLUMNS, LogRow
from memory.store import MemoryStore
from memory.window import HistoryWindows

GENERATOR_VERSION = 1  # bump when the generated rows change: cached files are keyed by it
HISTORY_ROWS = 400  # memory.facade.HISTORY_ROWS
BUDGET = 6000  # WorkerConfig.context_tokens default
ASSISTANT = "relaybot"
T0 = 1_767_225_600.0  # 2026-01-01 UTC; one message every 20 s from there

OWNER_CONV = "cli:owner-laptop"
DIRECT_CONV = "matrix:dm-alice"

# (channel, conversation, sender, privacy, is_owner, weight)
_CONVERSATIONS: list[tuple[str, str, str, Privacy, bool, float]] = [
    ("cli", OWNER_CONV, "owner", Privacy.OWNER, True, 25),
    ("matrix", "matrix:owner-notes", "@me:example.org", Privacy.OWNER, True, 10),
    ("email", "email:owner-inbox", "me@example.org", Privacy.OWNER, True, 5),
    ("matrix", DIRECT_CONV, "@alice:example.org", Privacy.DIRECT, False, 5),
]
for _k in range(30):
    _CONVERSATIONS.append(
        (
            "matrix" if _k % 2 else "email",
            f"{'matrix:dm' if _k % 2 else 'email:thread'}-{_k}",
            f"person{_k}@example.org",
            Privacy.DIRECT,
            False,
            40 / 30,
        )
    )
for _k in range(8):
    _CONVERSATIONS.append(
        ("matrix", f"matrix:room-{_k}", f"@member{_k}:example.org", Privacy.GROUP, False, 15 / 8)
    )

_WORD_TEXT = (
    "the a to of and in is it you that for on was with he as have be at one by this had not are "
    "but from or what all were we when your can said there use an each which she do how their if "
    "will up other about out many then them these so some her would make like him into time has "
    "look two more write go see number no way could people my than first water been call who oil "
    "meeting invoice dentist lisbon trip thursday project review deadline budget coffee train"
)
_WORDS = _WORD_TEXT.split()


# -- generating the history ------------------------------------------------------------------------


def _texts(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choices(_WORDS, k=rng.randint(4, 40))) for _ in range(n)]


def generate_rows(size: int, seed: int = 7) -> Iterator[tuple[tuple[Any, ...], str]]:
    """``size`` rows (inbound message, then the worker's reply) as the worker writes them: the
    INSERT parameters of ``MemoryStore.append_inbound`` / ``append_reply``, and the JSONL line
    squidbot would have appended for the same message."""
    rng = random.Random(seed)
    texts = _texts(rng, 4096)
    weights = [c[5] for c in _CONVERSATIONS]
    picks = rng.choices(range(len(_CONVERSATIONS)), weights=weights, k=size // 2 + 1)
    dumps = json.dumps
    for pair in range(size // 2 + size % 2):
        channel, conv, sender, privacy, is_owner, _w = _CONVERSATIONS[picks[pair]]
        ts = T0 + pair * 20.0
        sid = f"{int(ts * 1000)}-0"
        text = texts[(pair * 31) % 4096]
        iso = datetime.fromtimestamp(ts, UTC).isoformat()
        yield (
            (
                "in",
                sid,
                "message",
                channel,
                conv,
                conv,
                sender,
                sender,
                "owner" if is_owner else None,
                1 if is_owner else 0,
                privacy.value,
                text,
                f"ev-{pair}",
                None,
                ts,
                ts + 0.001,
                "{}",
            ),
            dumps(
                {
                    "role": "user",
                    "content": text,
                    "timestamp": iso,
                    "channel": channel,
                    "sender_id": sender,
                    "conversation": conv,
                    "owner": is_owner,
                }
            ),
        )
        if 2 * pair + 1 >= size:
            return
        reply_id = f"{pair:032x}"
        answer = "echo: " + texts[(pair * 17 + 5) % 4096]
        yield (
            (
                "out",
                sid,
                "reply",
                channel,
                conv,
                conv,
                ASSISTANT,
                ASSISTANT,
                None,
                0,
                privacy.value,
                answer,
                reply_id,
                reply_id,
                ts + 1.0,
                ts + 1.001,
                "{}",
            ),
            dumps(
                {
                    "role": "assistant",
                    "content": answer,
                    "timestamp": datetime.fromtimestamp(ts + 1.0, UTC).isoformat(),
                    "channel": channel,
                    "sender_id": ASSISTANT,
                    "conversation": conv,
                    "owner": False,
                }
            ),
        )


def check_rows_match_the_store() -> None:
    """Write one pair through the store's own API and compare with the generated parameters."""
    (in_p, _), (out_p, _) = list(generate_rows(2))
    with tempfile.TemporaryDirectory() as tmp:
        with MemoryStore(Path(tmp) / "m.sqlite3") as store:
            msg = InboundMessage(
                channel=in_p[3],
                session=in_p[4],
                conversation=in_p[5],
                sender=in_p[6],
                sender_name=in_p[7],
                privacy=Privacy(in_p[10]),
                text=in_p[11],
                ts=in_p[14],
                event_id=in_p[12],
            )
            a = store.append_inbound(msg, in_p[1], is_owner=bool(in_p[9]))
            reply = Reply(
                reply_id=out_p[12],
                answers=out_p[1],
                kind=ReplyKind.REPLY,
                channel=out_p[3],
                session=out_p[4],
                conversation=out_p[5],
                in_reply_to=in_p[12],
                text=out_p[11],
                created=out_p[14],
            )
            b = store.append_reply(reply, sender=ASSISTANT, privacy=Privacy(out_p[10]))
        for row, params in ((a, in_p), (b, out_p)):
            got = [getattr(row, f) for f in _COLUMN_FIELDS]
            want = list(params)
            got[15] = want[15] = 0  # recorded_ts: when it was written
            got[9] = int(got[9])
            if got != want:
                raise SystemExit(f"generated rows differ from the store's:\n{got}\n{want}")


_COLUMN_FIELDS = tuple(LOG_COLUMNS.split(", ")[1:])  # every column but id, in order


def dataset(size: int, regenerate: bool = False) -> tuple[Path, Path, float | None]:
    """The cached database and JSONL for ``size`` rows; generated (and timed) when missing."""
    folder = OUT / "context"
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / f"memory-v{GENERATOR_VERSION}-{size}.sqlite3"
    jl = folder / f"history-v{GENERATOR_VERSION}-{size}.jsonl"
    if db.exists() and jl.exists() and not regenerate:
        return db, jl, None
    for p in (db, jl, Path(f"{db}-wal"), Path(f"{db}-shm")):
        p.unlink(missing_ok=True)
    started = time.perf_counter()
    tmp_db = db.with_suffix(".tmp")
    for p in (tmp_db, Path(f"{tmp_db}-wal"), Path(f"{tmp_db}-shm")):
        p.unlink(missing_ok=True)
    MemoryStore(tmp_db).close()  # the schema, exactly as the worker creates it
    conn = BulkLoad(tmp_db)
    chunk: list[tuple[Any, ...]] = []
    with open(jl.with_suffix(".tmp"), "w", encoding="utf-8") as out:
        lines: list[str] = []
        for params, line in generate_rows(size):
            chunk.append(params)
            lines.append(line)
            if len(chunk) == 100_000:
                insert_log_rows(conn, chunk)
                out.write("\n".join(lines) + "\n")
                chunk, lines = [], []
        if chunk:
            insert_log_rows(conn, chunk)
            out.write("\n".join(lines) + "\n")
    conn.close()  # the WAL checkpointed into the database
    MemoryStore(tmp_db).close()  # as the worker leaves it (PRAGMA optimize)
    Path(f"{tmp_db}-wal").unlink(missing_ok=True)
    Path(f"{tmp_db}-shm").unlink(missing_ok=True)
    os.replace(tmp_db, db)
    os.replace(jl.with_suffix(".tmp"), jl)
    return db, jl, time.perf_counter() - started


# -- the two ways of getting a context ---------------------------------------------------------


def current_row(conversation: str, privacy: Privacy, next_id: int, now: float = T0) -> LogRow:
    """The message being answered (just appended by the worker: the newest row, in id and in
    time, ``now`` being the log's newest recorded_ts)."""
    return LogRow(
        id=next_id,
        direction="in",
        stream_id="9999999999999-0",
        kind="message",
        channel=conversation.split(":", 1)[0],
        session=conversation,
        conversation=conversation,
        sender="owner" if privacy is Privacy.OWNER else "@alice:example.org",
        sender_name="",
        entity=None,
        is_owner=privacy is Privacy.OWNER,
        privacy=privacy.value,
        text="what did we decide about the trip?",
        event_id="ev-now",
        reply_id=None,
        platform_ts=now,
        recorded_ts=now,
    )


def ours(store: MemoryStore, scope: Scope, current: LogRow) -> list[dict[str, str]]:
    """What memory.facade.Memory.context does without its history windows."""
    return build_context(
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        history=visible_history(store, scope, limit=HISTORY_ROWS),
        current=current,
        budget_tokens=BUDGET,
        assistant_name=ASSISTANT,
    )


def ours_turn(windows: HistoryWindows, scope: Scope, current: LogRow) -> list[dict[str, str]]:
    """What memory.facade.Memory.context does: the scope's history window (only
    rows new since the last turn are read and formatted) and one bisect over its lines."""
    rows, ready = windows.history(scope, ASSISTANT)
    return build_context(
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        history=rows,
        current=current,
        budget_tokens=BUDGET,
        assistant_name=ASSISTANT,
        ready=ready,
    )


def _row_from_json(i: int, d: dict[str, Any]) -> LogRow:
    ts = datetime.fromisoformat(d["timestamp"]).timestamp()
    return LogRow(
        id=i,
        direction="in" if d["role"] == "user" else "out",
        stream_id=f"jsonl-{i}",
        kind="message",
        channel=d["channel"],
        session=d["conversation"],
        conversation=d["conversation"],
        sender=d["sender_id"],
        sender_name=d["sender_id"],
        entity=None,
        is_owner=bool(d.get("owner")),
        privacy="owner",
        text=d["content"],
        event_id="",
        reply_id=None,
        platform_ts=ts,
        recorded_ts=ts,
    )


def jsonl_tail(path: Path, conversation: str | None, current: LogRow) -> list[dict[str, str]]:
    """The baseline: load the whole file, keep the last N lines (of the conversation), parse
    them and build the same context."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if conversation is not None:
        needle = f'"conversation": "{conversation}"'
        lines = [line for line in lines if needle in line]
    tail = lines[-HISTORY_ROWS:]
    rows = [_row_from_json(i, json.loads(line)) for i, line in enumerate(tail)]
    return build_context(
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        history=reversed(rows),
        current=current,
        budget_tokens=BUDGET,
        assistant_name=ASSISTANT,
    )


def squidbot_load_history(path: Path, conversation: str | None, current: LogRow) -> Any:
    """squidbot's JsonlMemory.load_history(last_n): parse every line into a deque(maxlen=N)."""
    recent: deque[LogRow] = deque(maxlen=HISTORY_ROWS)
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, raw in enumerate(f):
            line = raw.strip()
            if not line:
                continue
            row = _row_from_json(i, json.loads(line))
            if conversation is None or row.conversation == conversation:
                recent.append(row)
    return build_context(
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        history=reversed(recent),
        current=current,
        budget_tokens=BUDGET,
        assistant_name=ASSISTANT,
    )


# -- timing ----------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], *, reps: int, budget_s: float, min_reps: int = 3) -> list[float]:
    """Milliseconds per call: ``reps`` calls, or fewer once ``budget_s`` is spent."""
    out: list[float] = []
    started = time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
        if len(out) >= min_reps and time.perf_counter() - started > budget_s:
            break
    return out


def measure(size: int, db: Path, jl: Path, quick: bool) -> list[dict[str, Any]]:
    results = []
    with MemoryStore(db, readonly=True) as facts:
        top, newest = log_top(facts)
        in_conv = rows_in(facts, DIRECT_CONV)
    next_id, now = top + 1, newest + 1.0
    reps = 30 if quick else 200
    for scope_name, scope in (
        ("owner", Scope(conversation=OWNER_CONV, privacy=Privacy.OWNER)),
        ("direct", Scope(conversation=DIRECT_CONV, privacy=Privacy.DIRECT)),
    ):
        conversation = None if scope.privacy is Privacy.OWNER else scope.conversation
        current = current_row(scope.conversation, scope.privacy, next_id, now)

        # cold: a fresh store object each time (the worker's cache is loaded when it opens)
        open_ms: list[float] = []
        cold_ms: list[float] = []
        for _ in range(max(5, reps // 4)):
            t = time.perf_counter()
            store = MemoryStore(db)
            t1 = time.perf_counter()
            cold_result = ours(store, scope, current)
            t2 = time.perf_counter()
            store.close()
            open_ms.append((t1 - t) * 1000)
            cold_ms.append((t2 - t1) * 1000)

        # warm: the worker's long-lived store, turn after turn
        store = MemoryStore(db)
        for _ in range(5):
            warm_result = ours(store, scope, current)
        warm_ms = timed(lambda: ours(store, scope, current), reps=reps, budget_s=20)  # noqa: B023
        windows = HistoryWindows(store, limit=HISTORY_ROWS)
        turn_result = ours_turn(windows, scope, current)
        turn_ms = timed(
            lambda: ours_turn(windows, scope, current),  # noqa: B023
            reps=reps * 5,
            budget_s=10,
        )
        store.close()

        base_result = jsonl_tail(jl, conversation, current)
        base_ms = timed(
            lambda: jsonl_tail(jl, conversation, current),  # noqa: B023
            reps=reps // 2,
            budget_s=4 if quick else 15,
        )
        squid_ms = timed(
            lambda: squidbot_load_history(jl, conversation, current),  # noqa: B023
            reps=reps // 4,
            budget_s=3 if quick else 10,
            min_reps=1 if size >= 1_000_000 else 3,
        )

        same = cold_result == warm_result == base_result == turn_result
        history_lines = warm_result[0]["content"].count("\n[")
        results.append(
            {
                "size": size,
                "scope": scope_name,
                "in_scope": size if conversation is None else in_conv,
                "lines": history_lines,
                "same": same,
                "open": open_ms,
                "cold": cold_ms,
                "warm": warm_ms,
                "turn": turn_ms,
                "base": base_ms,
                "squid": squid_ms,
            }
        )
        print(
            f"  {size:>9,} {scope_name:6}: turn p50 {median(turn_ms):.4f} ms, "
            f"warm p50 {median(warm_ms):.3f} ms, cold p50 "
            f"{median(cold_ms):.3f} ms, jsonl tail p50 {median(base_ms):.1f} ms, squidbot "
            f"p50 {median(squid_ms):.0f} ms (same context: {same})",
            flush=True,
        )
    return results


def report(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        rows.append(
            [
                f"{r['size']:,}",
                r["scope"],
                r["in_scope"],
                r["lines"],
                median(r["open"]),
                median(r["cold"]),
                pct(r["cold"], 95),
                round(median(r["turn"]) * 1000, 1),
                median(r["warm"]),
                pct(r["warm"], 95),
                median(r["base"]),
                pct(r["base"], 95),
                median(r["squid"]),
                median(r["base"]) / median(r["warm"]),
                "yes" if r["same"] else "NO",
            ]
        )
    out = [
        table(
            [
                "messages",
                "scope",
                "rows in scope",
                "ctx lines",
                "open ms",
                "cold p50",
                "cold p95",
                "turn p50 us",
                "warm p50",
                "warm p95",
                "jsonl tail p50",
                "jsonl tail p95",
                "squidbot p50",
                "tail/warm",
                "same ctx",
            ],
            rows,
            title="Context build, ms per turn (cold = build on a freshly opened store, open "
            "not included; warm = the worker's store, row by row; turn = what the worker does: "
            "its per-scope history window)",
        )
    ]
    sizes = sorted({r["size"] for r in results})
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        growth = []
        for scope in ("owner", "direct"):
            a = next(r for r in results if r["size"] == lo and r["scope"] == scope)
            b = next(r for r in results if r["size"] == hi and r["scope"] == scope)
            growth.append(
                [
                    scope,
                    f"x{median(b['turn']) / median(a['turn']):.2f}",
                    f"x{median(b['warm']) / median(a['warm']):.2f}",
                    f"x{median(b['cold']) / median(a['cold']):.2f}",
                    f"x{median(b['base']) / median(a['base']):.1f}",
                    f"x{median(b['squid']) / median(a['squid']):.1f}",
                ]
            )
        out.append("")
        out.append(
            table(
                ["scope", "turn", "warm", "cold", "jsonl tail", "squidbot"],
                growth,
                title=f"Growth of the p50 from {lo:,} to {hi:,} messages (x{hi // lo} history)",
            )
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.context", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10k and 100k, fewer repetitions")
    p.add_argument("--sizes", help="comma-separated message counts (default 10000,100000,1000000)")
    p.add_argument("--regenerate", action="store_true", help="rebuild the cached data sets")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (1,000 messages)")
    args = p.parse_args(argv)
    logs.configure("bench", level="WARNING")  # the store logs each migration at INFO
    args.quick = args.quick or args.smoke
    if args.smoke and not args.sizes:
        sizes = [1_000]
    elif args.sizes:
        sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    else:
        sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    print(machine_note())
    check_rows_match_the_store()
    print("generated rows match MemoryStore.append_inbound/append_reply: ok")
    gen = []
    for size in sizes:
        db, jl, secs = dataset(size, args.regenerate)
        gen.append(
            [
                f"{size:,}",
                "generated" if secs is not None else "cached",
                secs if secs is not None else float("nan"),
                db.stat().st_size / 1e6,
                jl.stat().st_size / 1e6,
            ]
        )
    print(
        table(
            ["messages", "data", "seconds", "sqlite MB", "jsonl MB"],
            gen,
            title="Data sets (bench/out/context/)",
        )
    )
    print()
    results = []
    for size in sizes:
        db, jl, _ = dataset(size)
        results.extend(measure(size, db, jl, args.quick))
    print()
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
