"""Every benchmark runs, at its smallest size, so a broken benchmark fails CI.

Each ``bench/<name>.py`` is run as ``python -m bench.<name> --smoke`` in a subprocess with the
project's interpreter, from the repository root, as bench/README.md says to run it: it starts its
own servers (redis-server, the worker, a model endpoint) as its full run does. A run passes when it
exits 0 and prints its result line(s) with figures in them (``RESULTS``: regular expressions over
its stdout, one line each). The figures themselves are not checked: at this size they mean nothing.

bench.locomo, bench.summaries and bench.profiles read the LoCoMo dev data from
``../shared/data/locomo-dev`` next to the repository (bench/README.md, "Data"). A checkout with no
../shared next to it (a clean clone anywhere) runs them on a small sample in LoCoMo's format that
the test writes itself (``$RELAYBOT_BENCH_DATA``): the smoke run checks that the benchmark works,
not its figures, so it runs wherever the suite does and is never skipped.

About 65 s for all of them on the CI's 2 cores (each run's time is in ``pytest --durations``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NUM = r"[\d,]+(?:\.\d+)?"  # a figure as bench._common.table prints it ('-' is nan: not one)

# benchmark -> the lines its smoke run must print (re.MULTILINE, searched in stdout)
RESULTS: dict[str, tuple[str, ...]] = {
    "pipeline": (
        rf"^unix\s+relaybot\s+1\s+300\s+{NUM}\s+{NUM}\s.*\bok$",  # throughput, checked
        rf"^unix\s+relaybot\s+50\s+{NUM}\s.*\bok$",  # latency, checked
        rf"^unix\s+-?{NUM}\s+-?{NUM}\s+-?{NUM}$",  # added over the bare bus
    ),
    "context": (
        rf"^1,000\s+owner\s+1,000\s+{NUM}\s.*\byes$",  # 'same ctx': all builds agree
        rf"^1,000\s+direct\s+{NUM}\s.*\byes$",
    ),
    "coldstart": (
        r"^Cold start, zero-config \(1 of 1 runs ok\)$",  # the three chats answered
        rf"^the chat process XADDs 'hi' \(stream id\)\s+{NUM}\s",
        rf"^first reply / floor\s+{NUM}$",
        rf"^relaybot chat, worker running: total\s+{NUM}\s",
        # issue 26's four ratios to python -c pass of the same run, each beside its aim
        rf"^relaybot --version / python -c pass\s+{NUM}\s+6\s+(within|over)$",
        rf"^relaybot --help / python -c pass\s+{NUM}\s+6\s+(within|over)$",
        rf"^cold chat, first reply / python -c pass\s+{NUM}\s+30\s+(within|over)$",
        rf"^chat to a running worker \(total\) / python -c pass\s+{NUM}\s+15\s+(within|over)$",
    ),
    "search": (
        rf"^\s+1,000: owner p50 {NUM} ms, p95 {NUM} ms; squidbot p50 {NUM} ms$",
        rf"^question\s+{NUM}\s+{NUM}\s",
    ),
    "locomo": (
        rf"^all \(n={NUM}\)\s+BM25\s+{NUM}\s",
        rf"^\s+search_history\s+{NUM}\s",
        r"^privacy: OK \(no private turn reached another scope\)$",
    ),
    "summaries": (
        rf"^\s+\+ summaries \(dataset\)\s+{NUM}\s",
        rf"^segments on\s+{NUM}\s+{NUM}\s+{NUM}$",
    ),
    "profiles": (  # no fact outside its range, none leaked (checked), the figures last
        r"^privacy: OK \(no fact of a direct conversation reached another scope\)$",
        r'^\{"facts": \d+, "evidence_outside_range": 0, "leaks": 0, .*\}$',
    ),
    "soak": (rf"^messages 200, achieved {NUM} msg/s; .*; check: ok$",),
    "concurrency": (
        r"^\| 0\.20 \| 2 \| 4 \| .* \| ok \|$",  # N sessions at once
        r"^\| 0\.20 \| at once \| 2 \| .* \| ok \|$",  # collect vs followup
        r"^\| 0\.20 \| 2 \| 2 \| .* \| ok \|$",  # owner priority
    ),
    "summary_context": (rf"^1,000\s+direct\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}$",),
    "schedule": (  # every item and message answered once (0 missing, 0 doubled), checked
        rf"^scheduled\s+100\s+100\s+0\s+0\s+{NUM}\s+{NUM}\s+{NUM}\s.*\sok$",
        rf"^plain XADD\s+100\s+100\s+0\s+0\s+{NUM}\s+{NUM}\s+{NUM}\s.*\sok$",
        r'^\{"bench": "schedule", .*"ok": true\}$',  # the figures, last
    ),
}


def benchmarks() -> list[str]:
    return sorted(p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_"))


def test_every_benchmark_has_a_smoke_run() -> None:
    assert benchmarks() == sorted(RESULTS), "a benchmark without a smoke run (add it to RESULTS)"


LOCOMO = ROOT.parent / "shared" / "data" / "locomo-dev"
TOPICS = ("pottery", "camping", "violin", "marathon", "adoption", "painting")


def locomo_sample(root: Path) -> Path:
    """A LoCoMo-shaped sample '26' (the smoke runs' one conversation) under ``root``: two
    speakers, six sessions with their times, summaries and observations (bench.locomo's privacy
    check makes sessions 3 and 6 direct ones, one per speaker), single-hop questions with their
    evidence.
    Made up here: the real data set is never copied into the project."""
    speakers = ("Ana", "Ben")
    raw: dict[str, object] = {"speaker_a": speakers[0], "speaker_b": speakers[1], "qa": []}
    qa: list[dict[str, object]] = []
    for s in range(1, 7):
        turns = []
        observed: dict[str, list[list[str]]] = {who: [] for who in speakers}
        for i in range(4):
            topic = TOPICS[(s + i) % len(TOPICS)]
            who = speakers[i % 2]
            dia = f"D{s}:{i + 1}"
            text = f"{who} talks about {topic} class number {s * 10 + i} on the weekend."
            turns.append({"speaker": who, "dia_id": dia, "text": text})
            observed[who].append([f"{who} takes a {topic} class.", dia])  # bench.profiles
            qa.append({"question": f"What did {who} say about {topic} {s * 10 + i}?",
                       "answer": topic, "evidence": [dia], "category": 4})  # fmt: skip
        raw[f"session_{s}"] = turns
        raw[f"session_{s}_observation"] = observed
        raw[f"session_{s}_date_time"] = f"1:5{s} pm on {s + 7} May, 2023"
        said = ", ".join(TOPICS[(s + i) % len(TOPICS)] for i in range(4))  # not names only
        raw[f"session_{s}_summary"] = (
            f"In session {s} {speakers[0]} and {speakers[1]} talk: {said}."
        )
    raw["qa"] = qa
    data = root / "locomo-dev"
    data.mkdir(parents=True, exist_ok=True)
    (data / "26.json").write_text(json.dumps(raw), encoding="utf-8")
    return root


def bench_env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment without relaybot's settings (a benchmark sets up its own); the
    LoCoMo data next to the repository, or a sample of its shape (:func:`locomo_sample`)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELAYBOT_", "OPENAI_")) and k != "REDIS_URL"
    }
    env["RELAYBOT_DOTENV"] = ""  # a developer's .env never reaches a test
    if not (LOCOMO / "26.json").is_file():
        env["RELAYBOT_BENCH_DATA"] = str(locomo_sample(tmp_path / "data"))
    return env


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(RESULTS))
def test_the_benchmark_runs(name: str, tmp_path: Path) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--smoke"],
        cwd=ROOT,
        env=bench_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    secs = time.monotonic() - started
    said = f"bench.{name} --smoke ({secs:.1f} s), stdout:\n{proc.stdout[-4000:]}\nstderr:\n"
    said += proc.stderr[-4000:]
    assert proc.returncode == 0, f"exit {proc.returncode}: {said}"
    missing = [p for p in RESULTS[name] if not re.search(p, proc.stdout, re.MULTILINE)]
    assert not missing, f"no result line {missing}: {said}"
