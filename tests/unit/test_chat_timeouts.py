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

    def send_and_await(_rt: Any, _term: Any, _text: str, timeout: float) -> int:
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
    got = chat._await(FakeRuntime(), FakeTerm(kind), "1-0", 5.0)  # type: ignore[arg-type]
    assert got == code


def test_the_exit_codes_do_not_clash() -> None:
    codes = (
        chat.EXIT_NO_REDIS, chat.EXIT_USAGE, chat.EXIT_TIMEOUT, chat.EXIT_NO_WORKER,
        chat.EXIT_ERROR_REPLY,
    )  # fmt: skip
    assert codes == (1, 2, 3, 4, 5)  # as README's table says
