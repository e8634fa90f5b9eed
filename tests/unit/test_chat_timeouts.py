"""Timeouts that fit together (issue 26): ``relaybot chat`` waits for a reply at least as long
as the model's retries can take (it waited 120 s against ~4 min of retries), and an error reply
ends ``chat -m`` with its own exit status."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from contract.config import Config, ModelConfig
from contract.messages import Reply, ReplyKind
from contract.timeouts import reply_wait
from relaybot import chat, cli
from worker.openai_client import OpenAIChatClient


def waited(monkeypatch: pytest.MonkeyPatch, cfg: Config, argv: list[str]) -> float:
    """The wait ``relaybot chat ARGV`` gives its message (the parts that talk to Redis faked)."""
    seen: list[float] = []

    @contextmanager
    def fake(*_args: Any) -> Iterator[Any]:
        class Term:
            def drain(self) -> None: ...

        yield Term()

    def send_and_await(_rt: Any, _term: Any, _text: str, timeout: float, **_kw: Any) -> int:
        seen.append(timeout)
        return 0

    monkeypatch.setattr(chat, "Runtime", fake)
    monkeypatch.setattr(chat, "_attached", fake)
    monkeypatch.setattr(chat, "_send_and_await", send_and_await)
    args = cli.parse_args(argv)
    code = chat.run_chat(cfg, message=args.message, session="t", timeout=args.timeout)
    assert code == 0
    return seen[0]


def config(tmp_path: Path, **model: Any) -> Config:
    return Config(home=tmp_path, model=ModelConfig(base_url="http://m/v1", model="m", **model))


@pytest.mark.parametrize(
    "model",
    [{}, {"timeout": 300.0, "retries": 5, "backoff": 10.0}, {"timeout": 5.0, "retries": 0}],
)
def test_the_chat_waits_out_the_models_retries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: dict[str, Any]
) -> None:
    cfg = config(tmp_path, **model)
    client = OpenAIChatClient.from_config(cfg.model)
    try:
        worst = client.deadline  # every attempt timing out, every backoff at its longest
    finally:
        client.close()
    wait = waited(monkeypatch, cfg, ["chat", "-m", "hi"])
    assert wait >= worst + 10  # and some room for the queue and the context
    assert wait >= 120
    assert waited(monkeypatch, cfg, ["chat", "-m", "hi", "--timeout", "7"]) == 7  # as asked


def test_without_a_model_the_wait_is_two_minutes(tmp_path: Path) -> None:
    assert reply_wait(Config(home=tmp_path).model) == 120


def test_the_defaults_fit(tmp_path: Path) -> None:
    """[model]'s defaults: 4 attempts of 60 s and 1 + 2 + 4 s of backoff (+25 % jitter)."""
    assert reply_wait(config(tmp_path).model) == pytest.approx(4 * 60 + 7 * 1.25 + 30)


class FakeTerm:
    session = "t"

    def __init__(self, kind: ReplyKind) -> None:
        self.kind = kind

    def taken(self) -> bool:
        return True

    def wait_for(self, sid: str, _timeout: float) -> Reply:
        return Reply(
            reply_id="r1", answers=sid, kind=self.kind, channel="cli", session="cli:t",
            conversation="cli:t", text="Sorry — I could not reach the model", created=0.0,
        )  # fmt: skip


class FakeRuntime:
    def problem(self) -> None:
        return None


@pytest.mark.parametrize(
    ("kind", "code"), [(ReplyKind.REPLY, 0), (ReplyKind.ERROR, 5), (ReplyKind.NOTICE, 0)]
)
def test_an_error_reply_exits_5(kind: ReplyKind, code: int) -> None:
    got = chat._await(FakeRuntime(), FakeTerm(kind), "1-0", 5.0, queue_timeout=None)  # type: ignore[arg-type]
    assert got == code


def test_the_exit_codes_do_not_clash() -> None:
    codes = (
        chat.EXIT_NO_REDIS, chat.EXIT_USAGE, chat.EXIT_TIMEOUT, chat.EXIT_NO_WORKER,
        chat.EXIT_ERROR_REPLY,
    )  # fmt: skip
    assert codes == (1, 2, 3, 4, 5)  # as README's table says


class Clock:
    """time for :func:`chat._await`: it moves only when the chat waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class QueuedTerm:
    """A message the worker takes at ``taken_at`` and answers ``turn`` seconds later."""

    session = "t"

    def __init__(self, clock: Clock, taken_at: float, turn: float) -> None:
        self.clock, self.taken_at, self.turn = clock, taken_at, turn

    def taken(self) -> bool:
        return self.clock.now >= self.taken_at

    def wait_for(self, sid: str, timeout: float) -> Reply | None:
        self.clock.now += timeout
        if self.clock.now < self.taken_at + self.turn:
            return None
        return Reply(
            reply_id="r1", answers=sid, kind=ReplyKind.REPLY, channel="cli", session="cli:t",
            conversation="cli:t", text="at last", created=0.0,
        )  # fmt: skip


class Idle:
    def __init__(self, problem: str | None = None) -> None:
        self._problem = problem

    def problem(self) -> str | None:
        return self._problem

    def worker_died(self) -> None:
        return None


def test_the_timeout_runs_from_when_the_worker_takes_the_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queued 100 s behind a slow turn, then answered 20 s into its own turn: within a 30 s
    timeout (it timed out, exit 3, counting from the send)."""
    clock = Clock()
    monkeypatch.setattr(chat, "time", clock)
    term = QueuedTerm(clock, taken_at=100.0, turn=20.0)
    assert chat._await(Idle(), term, "1-0", 30.0, queue_timeout=300.0) == 0  # type: ignore[arg-type]


def test_the_wait_in_the_queue_has_its_own_bound(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock()
    monkeypatch.setattr(chat, "time", clock)
    term = QueuedTerm(clock, taken_at=1000.0, turn=1.0)
    assert chat._await(Idle(), term, "1-0", 30.0, queue_timeout=60.0) == chat.EXIT_TIMEOUT  # type: ignore[arg-type]
    assert 60 <= clock.now < 62
    assert "did not take your message within 60 s" in capsys.readouterr().err
    clock.now = 0.0
    term = QueuedTerm(clock, taken_at=10.0, turn=100.0)
    assert chat._await(Idle(), term, "1-0", 30.0, queue_timeout=60.0) == chat.EXIT_TIMEOUT  # type: ignore[arg-type]
    assert "no reply within 30 s of the worker taking it" in capsys.readouterr().err


def test_the_interactive_chat_keeps_waiting_for_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """No worker runs: ``chat -m`` exits 4; the interactive chat says so once and waits on (it
    quit the whole chat after 3 s)."""
    clock = Clock()
    monkeypatch.setattr(chat, "time", clock)
    problem = "no worker is running (start one with `relaybot worker` or `honcho start`)"
    term = QueuedTerm(clock, taken_at=600.0, turn=1.0)
    assert chat._await(Idle(problem), term, "1-0", 30.0, queue_timeout=None) == 4  # type: ignore[arg-type]
    said: list[str] = []
    clock.now = 0.0
    live = chat.Live(said.append, lambda: False)
    assert chat._await(Idle(problem), term, "1-0", 30.0, queue_timeout=None, live=live) == 0  # type: ignore[arg-type]
    assert len(said) == 1 and said[0].startswith(problem)
