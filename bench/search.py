"""search_history latency against history size: the FTS5 search vs squidbot's JSONL scan.

For 10k, 100k and 1M messages in memory, time ``memory.search.search`` -- what the model's
``search_history`` tool and ``relaybot memory search`` run -- on the worker's long-lived store, for
a mix of queries (rare, middling and common words, pairs, a question in words) and scopes (the
owner: everything; a group; a direct conversation, which also sees what that person said
elsewhere; the owner with a days / channel filter; newest-first order). Also: the CLI's way, a
read-only open of the database and one search.

Baseline, side by side in the same run: squidbot's ``search_history`` over the same messages in
one ``history.jsonl``: read the file line by line, parse each line, skip lines older than the
cutoff, and keep lines whose content contains the query (case-insensitive substring), stopping
after ``max_results`` matches (it returns the oldest ones). Same queries, same limit (10).

The history is generated (a Zipf vocabulary of 50,000 words plus English function words, 42
conversations as in bench/context.py) and written with the store's own INSERT into a database
that ``MemoryStore`` created, so the FTS5 index is built by the schema's triggers as the worker
builds it; databases and JSONL files are cached under bench/out/search/.

    .venv/bin/python -m bench.search            # 10k, 100k, 1M (the first run generates ~1.5 min)
    .venv/bin/python -m bench.search --quick    # 10k and 100k, fewer repetitions
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from pathlib import Path
from typing import Any

from bench._common import OUT, SMOKE_HELP, insert_log_rows, machine_note, median, pct, table
from bench.context import _CONVERSATIONS, ASSISTANT, T0
from contract import logs
from contract.messages import Privacy
from memory.bulk import BulkLoad, first_sender_entity
from memory.privacy import Scope
from memory.search import SearchQuery, clear_cache, search
from memory.store import MemoryStore

GENERATOR_VERSION = 1
VOCABULARY = 50_000
LIMIT = 10
STEP = 20.0  # seconds between messages (as bench/context.py)

_FUNCTION_TEXT = (
    "the a to of and in is it you that for on was with he as have be at by this had not are but "
    "from or what all were we when your can said there an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two "
    "more go see no way could people my than first been call who its now find long down day did "
    "get come made may part i me just ok yes thanks sure think know want need really good"
)
_FUNCTION = _FUNCTION_TEXT.split()
_SYLLABLES_TEXT = (
    "ka lo mi ter an su ve ra po di ne to sha qui bel mor en ix da re li no fa gu tem bri so cal "
    "vin ru pe ho"
)
_SYLLABLES = _SYLLABLES_TEXT.split()


# -- the history -----------------------------------------------------------------------------------


def vocabulary(rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))))
    out = sorted(words)
    rng.shuffle(out)
    return out


@dataclass(frozen=True)
class Corpus:
    words: list[str]
    cum: list[float]  # cumulative Zipf weights of ``words``
    share: list[float]  # each word's share of the content words

    @staticmethod
    def make(seed: int = 11) -> Corpus:
        rng = random.Random(seed)
        words = vocabulary(rng)
        weights = [1.0 / (r + 10) ** 1.05 for r in range(len(words))]
        total = sum(weights)
        return Corpus(words, list(accumulate(weights)), [w / total for w in weights])

    def text(self, rng: random.Random) -> str:
        n = rng.randint(3, 30)
        content = rng.choices(self.words, cum_weights=self.cum, k=n)
        out = [w if rng.random() < 0.55 else rng.choice(_FUNCTION) for w in content]
        return " ".join(out)

    def expected_df(self, rank: int, size: int) -> float:
        """Messages holding the word of this rank, roughly (9 content words per message)."""
        return size * (1 - math.exp(-9.0 * self.share[rank]))


def generate(size: int, corpus: Corpus, seed: int = 5) -> Iterator[tuple[tuple[Any, ...], str]]:
    """(INSERT parameters as MemoryStore.append_inbound/append_reply write them, JSONL line)."""
    rng = random.Random(seed)
    weights = [c[5] for c in _CONVERSATIONS]
    channel, conv, sender, privacy, is_owner, _w = _CONVERSATIONS[0]
    for n in range(size):
        pair = n // 2
        if n % 2 == 0:  # a message and the assistant's reply in the same conversation
            channel, conv, sender, privacy, is_owner, _w = rng.choices(
                _CONVERSATIONS, weights=weights
            )[0]
        ts = T0 + pair * STEP + (n % 2)
        sid = f"{int(T0 * 1000) + pair}-0"
        text = corpus.text(rng)
        iso = datetime.fromtimestamp(ts, UTC).isoformat()
        if n % 2 == 0:
            entity = "owner" if is_owner else f"e-{zlib.crc32(sender.encode()):08x}"
            owner = 1 if is_owner else 0
            params: tuple[Any, ...] = ("in", sid, "message", channel, conv, conv, sender, sender,
                                       entity, owner, privacy.value, text, f"ev-{pair}", None,
                                       ts, ts + 0.001, "{}")  # fmt: skip
            role, who = "user", sender
        else:
            reply = f"r-{pair}"
            params = ("out", sid, "reply", channel, conv, conv, ASSISTANT, ASSISTANT, None, 0,
                      privacy.value, text, reply, reply, ts, ts + 0.001, "{}")  # fmt: skip
            role, who = "assistant", ASSISTANT
        line = json.dumps(
            {
                "role": role,
                "content": text,
                "timestamp": iso,
                "channel": channel,
                "sender_id": who,
            }
        )
        yield params, line


def dataset(size: int, corpus: Corpus, regenerate: bool = False) -> tuple[Path, Path, float | None]:
    folder = OUT / "search"
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / f"memory-v{GENERATOR_VERSION}-{size}.sqlite3"
    jl = folder / f"history-v{GENERATOR_VERSION}-{size}.jsonl"
    if db.exists() and jl.exists() and not regenerate:
        return db, jl, None
    started = time.perf_counter()
    tmp = db.with_suffix(".tmp")
    for p in (db, jl, tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        p.unlink(missing_ok=True)
    MemoryStore(tmp).close()  # the schema (log, FTS5 index and its triggers) as the worker has it
    conn = BulkLoad(tmp)
    chunk: list[tuple[Any, ...]] = []
    lines: list[str] = []
    with open(jl.with_suffix(".tmp"), "w", encoding="utf-8") as out:
        for params, line in generate(size, corpus):
            chunk.append(params)
            lines.append(line)
            if len(chunk) == 50_000:
                insert_log_rows(conn, chunk)
                out.write("\n".join(lines) + "\n")
                chunk, lines = [], []
        if chunk:
            insert_log_rows(conn, chunk)
            out.write("\n".join(lines) + "\n")
    conn.optimize_index()  # as after a quiet night
    conn.close()  # the WAL checkpointed into the database
    MemoryStore(tmp).close()  # PRAGMA optimize, as the worker leaves it
    Path(f"{tmp}-wal").unlink(missing_ok=True)
    Path(f"{tmp}-shm").unlink(missing_ok=True)
    os.replace(tmp, db)
    os.replace(jl.with_suffix(".tmp"), jl)
    return db, jl, time.perf_counter() - started


# -- the queries -----------------------------------------------------------------------------------


def queries(corpus: Corpus) -> list[tuple[str, str]]:
    """(class, text): 5 of each, chosen by how many of 1M messages hold the words."""
    rng = random.Random(3)

    def band(lo: float, hi: float) -> list[str]:
        ranks = [r for r in range(VOCABULARY) if lo <= corpus.expected_df(r, 1_000_000) <= hi]
        return [corpus.words[r] for r in rng.sample(ranks, min(10, len(ranks)))]

    rare, mid, common = band(20, 200), band(1_000, 5_000), band(20_000, 60_000)
    out: list[tuple[str, str]] = []
    out += [("rare word", w) for w in rare[:5]]
    out += [("middling word", w) for w in mid[:5]]
    out += [("common word", w) for w in common[:5]]
    out += [("two words", f"{a} {b}") for a, b in zip(mid[5:10], rare[5:10], strict=True)]
    out += [("common pair", f"{a} {b}") for a, b in zip(common[5:10], mid[:5], strict=True)]
    out += [
        ("question", f"what did we say about the {a} and {b}?")
        for a, b in zip(mid[5:10], common[:5], strict=True)
    ]
    return out


# -- the two searches ------------------------------------------------------------------------------


def squidbot_search(path: Path, query: str, days: int, max_results: int) -> list[Any]:
    """squidbot's search_history (_scan_history): stream the file, parse each line, substring."""
    needle = query.lower()
    cutoff = datetime.now(UTC) - timedelta(days=days) if days > 0 else None
    contexts: list[list[Any]] = []
    previous = None
    pending: int | None = None
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if cutoff is not None and datetime.fromisoformat(message["timestamp"]) < cutoff:
                continue
            if pending is not None:
                contexts[pending][2] = message
                pending = None
                if len(contexts) >= max_results:
                    break
            content = message.get("content")
            if (
                message.get("role") in ("user", "assistant")
                and content
                and needle in content.lower()
            ):
                contexts.append([previous, message, None])
                pending = len(contexts) - 1
            previous = message
    return contexts


def scopes(db: Path) -> list[tuple[str, Scope, dict[str, Any]]]:
    with MemoryStore(db, readonly=True) as facts:
        entity = first_sender_entity(facts, "matrix:dm-alice")
    owner = Scope("cli:owner-laptop", Privacy.OWNER, "owner")
    return [
        ("owner", owner, {}),
        ("group", Scope("matrix:room-3", Privacy.GROUP), {}),
        ("direct", Scope("matrix:dm-alice", Privacy.DIRECT, entity), {}),
        ("owner, last 30 days", owner, {"days": 30.0}),
        ("owner, channel email", owner, {"channel": "email"}),
        ("owner, newest first", owner, {"order": "time"}),
    ]


def timed(fn: Callable[[], Any], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def measure(
    size: int, db: Path, jl: Path, qs: list[tuple[str, str]], quick: bool
) -> dict[str, Any]:
    reps = 3 if quick else 7
    # "now" for the days filter: the end of the generated history
    now = T0 + (size // 2) * STEP + 3600
    per_scope: dict[str, list[float]] = {}
    per_class: dict[str, list[float]] = {}
    hits: dict[str, int] = {}
    firsts: dict[str, list[float]] = {}
    with MemoryStore(db, readonly=True) as store:
        for name, scope, extra in scopes(db):
            times: list[float] = []
            found = 0
            for cls, text in qs:
                query = SearchQuery(text=text, limit=LIMIT, **extra)
                for _ in range(2):  # warm up this query's pages
                    result = search(store, scope, query, now=now)
                found += len(result.hits)
                t = timed(lambda: search(store, scope, query, now=now), reps)  # noqa: B023
                times += t
                if name == "owner":
                    per_class.setdefault(cls, []).extend(t)
            per_scope[name] = times
            hits[name] = found
            if name in ("group", "direct"):  # the first search in a scope lists its ids
                first: list[float] = []
                for _cls, text in qs[::5]:
                    clear_cache()
                    query = SearchQuery(text=text, limit=LIMIT, **extra)
                    first += timed(lambda: search(store, scope, query, now=now), 1)  # noqa: B023
                firsts[name] = first
    cli: list[float] = []
    for _cls, text in qs[:: 3 if quick else 1]:

        def once() -> None:
            with MemoryStore(db, readonly=True) as store:
                search(store, scopes(db)[0][1], SearchQuery(text=text, limit=LIMIT), now=now)  # noqa: B023

        cli += timed(once, 1)
    # the baseline: one run per query (at 1M each reads the whole file), a time budget
    base_class: dict[str, list[float]] = {}
    base_all: list[float] = []
    budget = time.perf_counter() + (60 if quick else 240)
    for cls, text in qs:
        t = timed(lambda: squidbot_search(jl, text, 0, LIMIT), 1)  # noqa: B023
        base_class.setdefault(cls, []).extend(t)
        base_all += t
        if time.perf_counter() > budget and len(base_all) >= 6:
            break
    return {
        "size": size,
        "scopes": per_scope,
        "hits": hits,
        "firsts": firsts,
        "classes": per_class,
        "cli": cli,
        "base_classes": base_class,
        "base": base_all,
    }


def report(results: list[dict[str, Any]]) -> str:
    out = []
    rows = []
    for r in results:
        base = r["base"]
        for name, times in r["scopes"].items():
            rows.append(
                [
                    f"{r['size']:,}" if name == "owner" else "",
                    name,
                    r["hits"][name],
                    median(times),
                    pct(times, 95),
                    max(times),
                    median(base) / median(times) if name == "owner" else float("nan"),
                    pct(base, 95) / pct(times, 95) if name == "owner" else float("nan"),
                ]
            )
        for name, first in r["firsts"].items():
            rows.append(["", f"{name}: first search in the scope", "", median(first),
                         pct(first, 95), max(first), float("nan"), float("nan")])  # fmt: skip
        rows.append(["", "CLI: open read-only + search", "", median(r["cli"]), pct(r["cli"], 95),
                     max(r["cli"]), float("nan"), float("nan")])  # fmt: skip
        rows.append(["", "squidbot JSONL scan (baseline)", "", median(base), pct(base, 95),
                     max(base), float("nan"), float("nan")])  # fmt: skip
    out.append(
        table(
            ["messages", "search", "hits", "p50 ms", "p95 ms", "max ms", "x p50", "x p95"],
            rows,
            title=f"search_history, ms per search (limit {LIMIT}; 30 queries per scope; "
            "x = baseline / ours, owner scope)",
        )
    )
    big = results[-1]
    crow = []
    for cls, times in big["classes"].items():
        base = big["base_classes"].get(cls, [])
        crow.append(
            [
                cls,
                median(times),
                pct(times, 95),
                median(base) if base else float("nan"),
                (median(base) / median(times)) if base else float("nan"),
            ]
        )
    out.append("")
    out.append(
        table(
            ["query class (owner scope)", "p50 ms", "p95 ms", "squidbot p50 ms", "x p50"],
            crow,
            title=f"By query class at {big['size']:,} messages",
        )
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10k and 100k, fewer repetitions")
    p.add_argument("--sizes", help="comma-separated message counts (default 10000,100000,1000000)")
    p.add_argument("--regenerate", action="store_true", help="rebuild the cached data sets")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (1,000 messages)")
    args = p.parse_args(argv)
    logs.configure("bench", level="WARNING")
    args.quick = args.quick or args.smoke
    if args.smoke and not args.sizes:
        sizes = [1_000]
    elif args.sizes:
        sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    else:
        sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    print(machine_note())
    corpus = Corpus.make()
    qs = queries(corpus)
    gen = []
    for size in sizes:
        db, jl, secs = dataset(size, corpus, args.regenerate)
        gen.append([f"{size:,}", "generated" if secs is not None else "cached",
                    secs if secs is not None else float("nan"), db.stat().st_size / 1e6,
                    jl.stat().st_size / 1e6])  # fmt: skip
    print(table(["messages", "data", "seconds", "sqlite MB", "jsonl MB"], gen,
                title="Data sets (bench/out/search/)"))  # fmt: skip
    print("queries:", "; ".join(f"{c}: {t!r}" for c, t in qs[::5]), "...")
    results = []
    for size in sizes:
        db, jl, _ = dataset(size, corpus)
        r = measure(size, db, jl, qs, args.quick)
        results.append(r)
        print(
            f"  {size:>9,}: owner p50 {median(r['scopes']['owner']):.2f} ms, p95 "
            f"{pct(r['scopes']['owner'], 95):.2f} ms; squidbot p50 {median(r['base']):.1f} ms",
            flush=True,
        )
    print()
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
