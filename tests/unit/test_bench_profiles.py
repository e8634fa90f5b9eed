"""bench.profiles on a tiny conversation in LoCoMo's format: the replay model's answers, the
mapping of the dataset's evidence to log ids, the leak check's own eye, and the last line's keys.

The sample is made up here (the real data set is never copied into the project): two speakers,
six sessions (bench.locomo's split makes 3 a direct conversation with Ana, 6 one with Ben), each
with its ``session_N_observation``, and single-hop questions whose evidence is an observed turn.
The whole run (:func:`test_the_run_prints_its_figures_last`) goes through the job's real prompts
(worker/profile_job.py), so its fact count also checks that the replay model reads them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import profiles
from bench._common import REPO
from bench.locomo import ingest, load
from contract.messages import Privacy
from memory.privacy import Scope
from memory.store import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
SPEAKERS = ("Ana", "Ben")
HOBBIES = ("pottery", "camping", "violin", "marathon", "adoption", "painting")


def sample_json(name: str = "t1") -> dict[str, Any]:
    raw: dict[str, Any] = {"speaker_a": SPEAKERS[0], "speaker_b": SPEAKERS[1]}
    qa: list[dict[str, Any]] = []
    for s in range(1, 7):
        turns = []
        # session 3 (direct with Ana) opens with Ben: his turn is the assistant's, and the first
        # has no inbound to answer, so it is not recorded (an observation on it has no row)
        order = (1, 0, 1, 0) if s == 3 else (0, 1, 0, 1)
        for i, who in enumerate(order):
            hobby = HOBBIES[(s + i) % len(HOBBIES)]
            turns.append({"speaker": SPEAKERS[who], "dia_id": f"D{s}:{i + 1}",
                          "text": f"I took up {hobby} number {s}{i} this month."})  # fmt: skip
        raw[f"session_{s}"] = turns
        raw[f"session_{s}_date_time"] = f"1:5{s} pm on {s + 7} May, 2023"
        obs: dict[str, list[list[Any]]] = {SPEAKERS[0]: [], SPEAKERS[1]: []}
        for i, turn in enumerate(turns):
            hobby = HOBBIES[(s + i) % len(HOBBIES)]
            evidence: Any = turn["dia_id"] if i % 2 else [turn["dia_id"]]
            obs[turn["speaker"]].append([f"{turn['speaker']} loves {hobby} {s}{i}.", evidence])
            qa.append({"question": f"What does {turn['speaker']} love, {hobby} {s}{i}?",
                       "answer": hobby, "evidence": [turn["dia_id"]], "category": 4})  # fmt: skip
        raw[f"session_{s}_observation"] = obs
    raw["qa"] = qa
    return raw


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "data"
    (root / profiles.DATA_SET).mkdir(parents=True)
    (root / profiles.DATA_SET / "t1.json").write_text(json.dumps(sample_json()), encoding="utf-8")
    monkeypatch.setenv("RELAYBOT_BENCH_DATA", str(root))
    return root


def ask(model: profiles.ReplayModel, prompt: str, system: str = "") -> Any:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    done = model.complete(messages, [])
    return json.loads(done.content or "")


def replay() -> profiles.ReplayModel:
    obs = profiles.observations(sample_json())
    # session 1's turns are log rows 11..14, session 2's 21..24
    log_to_dia = {10 * s + t: f"D{s}:{t}" for s in (1, 2) for t in range(1, 5)}
    return profiles.ReplayModel(obs, log_to_dia)


PROFILE = """TASK: profile facts
Entities:
E0: the owner, Olive
E1: Ana
E2: Ben (matrix:ben)

Transcript:
[log 11] Ana (E1): I took up camping number 10 this month.
[log 12] Ben (E2): I took up violin number 11 this month.
[log 13] Ana (E1): I took up marathon number 12 this month.
"""


def test_profile_facts_are_the_sessions_observations_on_the_transcripts_rows() -> None:
    model = replay()
    facts = ask(model, PROFILE, system="You derive facts.")["facts"]
    assert [(f["entity"], f["text"], f["evidence"]) for f in facts] == [
        ("E1", "Ana loves camping 10.", [11]),
        ("E1", "Ana loves marathon 12.", [13]),
        ("E2", "Ben loves violin 11.", [12]),
    ]
    assert {f["kind"] for f in facts} == {"preference"}
    assert all(f["confidence"] == profiles.CONFIDENCE for f in facts)
    # D1:4 (row 14) is not in the transcript: its observation has no row and is skipped, counted
    assert model.counts["skipped: evidence has no row"] == 1
    assert model.counts["observations"] == 4


def test_a_speaker_who_is_no_entity_of_the_range_is_skipped() -> None:
    model = replay()
    prompt = PROFILE.replace("E2: Ben (matrix:ben)\n", "").replace("Ben (E2)", "relaybot")
    facts = ask(model, prompt)["facts"]
    assert {f["entity"] for f in facts} == {"E1"}
    assert model.counts["skipped: speaker is no entity of the range"] == 1


def test_a_name_that_only_starts_like_a_speaker_is_not_that_speaker() -> None:
    model = replay()
    prompt = PROFILE.replace("E1: Ana", "E1: Anabel").replace("E0: the owner, Olive", "E0: Ana")
    facts = ask(model, prompt)["facts"]
    assert {f["entity"] for f in facts} == {"E2"}  # neither Anabel nor the owner's E0


def test_rows_the_model_does_not_know_give_no_facts() -> None:
    model = replay()
    facts = ask(model, "TASK: profile facts\nE1: Ana\n[log 999] Ana (E1): hello\n")["facts"]
    assert facts == []


def test_the_other_tasks_get_the_neutral_answers() -> None:
    model = replay()
    same = "TASK: same insight\nKnown facts:\nF4 [E1 Ana · preference] x\n\nNew facts:\n"
    same += "N0 [E1 Ana · preference] y\nN1 [E2 Ben · event] z\n"
    assert ask(model, same) == {
        "decisions": [
            {"new": 0, "same_as": None, "contradicts": None},
            {"new": 1, "same_as": None, "contradicts": None},
        ]
    }
    assert ask(model, "TASK: still relevant\nF4 [preference] x\n") == {"stale": []}
    assert ask(model, "TASK: capability gaps\n[log 1] Ana (E1): book a flight\n") == {"gaps": []}
    assert ask(model, "TASK: something else\n") == {}
    assert ask(model, "no task line at all") == {}
    assert model.name == "replay"


def test_observations_read_both_evidence_shapes_and_skip_junk() -> None:
    raw = {
        "session_2_observation": {
            "Ana": [["one", "D2:1"], ["two", ["D2:2", "D2:3"]], ["", "D2:4"], ["short"]],
            "Ben": "not a list",
        },
        "session_x_observation": {"Ana": [["no", "D1:1"]]},
    }
    got = profiles.observations(raw)
    assert [(o.text, o.evidence) for o in got[2]] == [
        ("one", ("D2:1",)),
        ("two", ("D2:2", "D2:3")),
    ]
    assert list(got) == [2]


def test_kinds_from_a_few_words() -> None:
    assert profiles.kind_of("Ana loves pottery") == "preference"
    assert profiles.kind_of("Ben is planning a trip") == "need"
    assert profiles.kind_of("Ana's kids go to school") == "relationship"
    assert profiles.kind_of("Ben works as a nurse") == "identity"
    assert profiles.kind_of("Ana ran a race") == "event"


def test_fact_lines_and_their_ids_are_read_from_what_is_shown() -> None:
    text = (
        "## What is known\n"
        "[Ana · preference · 0.80 · log 12, 40] Ana loves tea\n"
        '[Ben · event · 0.50 · log 7] Ben moved (contradicts log 3, 5: "Ben stayed")\n'
        "[matrix / x] 2026-01-01 (log 1..9): a summary line, not a fact\n"
    )
    assert profiles.shown_ids(text) == [[12, 40], [7, 3, 5]]


def test_the_leak_check_sees_a_direct_row_shown_elsewhere() -> None:
    direct = frozenset({"matrix:dm-ana", "matrix:dm-ben"})
    group = profiles.Audience(Scope("matrix:room", Privacy.GROUP), direct)
    assert group.may_see(("matrix:room", "in", "e-ana"))
    assert not group.may_see(("matrix:dm-ana", "in", "e-ana"))
    with_ben = profiles.Audience(Scope("matrix:dm-ben", Privacy.DIRECT, "e-ben"), direct)
    assert with_ben.may_see(("matrix:dm-ben", "out", None))  # its own conversation
    assert not with_ben.may_see(("matrix:dm-ana", "in", "e-ana"))  # Ana's private words
    assert not with_ben.may_see(("matrix:dm-ana", "out", None))  # the assistant's words there
    assert with_ben.may_see(("matrix:dm-ana", "in", "e-ben"))  # what Ben said himself
    # a group scope that names an entity is still not a person's direct scope
    odd = profiles.Audience(Scope("matrix:room", Privacy.GROUP, "e-ben"), direct)
    assert not odd.may_see(("matrix:dm-ana", "in", "e-ben"))


def test_data_and_samples_follow_the_benchmarks_conventions() -> None:
    assert REPO == ROOT
    assert profiles.DATA.resolve() == ROOT.parent / "shared" / "data" / profiles.DATA_SET
    assert not profiles.DATA.is_absolute() or ROOT in profiles.DATA.parents
    assert isinstance(profiles.SAMPLES, tuple)
    assert profiles.SAMPLES
    assert all(isinstance(s, str) for s in profiles.SAMPLES)


def test_the_run_prints_its_figures_last(
    data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("contract.logs.configure", lambda *_a, **_k: None)  # keep test logging
    assert profiles.main(["--samples", "t1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = json.loads(out[-1])
    assert set(profiles.JSON_KEYS) <= set(last)
    assert last["leaks"] == 0
    assert last["evidence_outside_range"] == 0
    # 24 observations; in each direct session the other speaker's opening turn was never
    # recorded (no row) and their other one is the assistant's words (no entity of the range)
    assert last["observations"] == 24
    assert last["skipped"] == 4
    assert last["facts"] == 20
    assert last["facts_from_direct"] == 4  # session 3's Ana's two, session 6's Ben's two
    assert last["lines_checked"] > 0
    for key in profiles.JSON_KEYS[3:]:
        assert 0.0 <= last[key] <= 1.0
    # every question's evidence is an observed turn: with profiles the owner is shown at least
    # as much as without
    assert last["any5_with_profiles"] >= last["any5_messages"]
    assert last["all10_with_profiles"] >= last["all10_messages"]
    assert any(line.startswith("privacy: OK") for line in out)


def test_the_sample_is_read_as_locomo_reads_it(data: Path) -> None:
    sample = load("t1")
    assert profiles.split(sample) == {3: "Ana", 6: "Ben"}
    assert len(sample.questions) == 24


def test_evidence_outside_the_given_ranges_is_counted(data: Path, tmp_path: Path) -> None:
    sample = load("t1")
    with MemoryStore(tmp_path / "m.sqlite3") as store:
        ingest(store, sample, profiles.split(sample))
        given = profiles.ranges(store, sample)
        model = profiles.ReplayModel(
            profiles.observations(sample_json()), profiles.log_map(store, sample)
        )
        profiles.derive(store, model, given)
        facts, outside = profiles.stored(store, given)
        assert (facts, outside) == (20, 0)
        # a run that gave other ranges (each one row shorter) finds every fact outside them
        shorter = [replace(r, last_id=r.last_id - 1) for r in given]
        assert profiles.stored(store, shorter) == (20, 20)
