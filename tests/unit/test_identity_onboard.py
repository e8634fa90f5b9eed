"""`relaybot onboard`: the questions, the TOML it writes, and that load_config accepts it."""

from __future__ import annotations

import io
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import load_config
from gateways.email.onboard import EMAIL_KEYS
from gateways.matrix.onboard import MATRIX_KEYS
from relaybot import cli
from relaybot.onboard import Asker, dumps, run_onboarding, write_atomic
from relaybot.onboard_ask import QUESTIONS
from relaybot.onboard_sections import MODEL_KEYS
from tests.support.servers import free_port


def asker(answers: list[str], said: list[str]) -> Asker:
    feed: Iterator[str] = iter(answers)

    def read(prompt: str) -> str:
        said.append(prompt)
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    return Asker(read=read, secret=read, say=said.append)


def test_dumps_writes_toml_that_reads_back_the_same() -> None:
    data: dict[str, Any] = {
        "top": "level",
        "owner": {
            "name": 'Ada "the Countess" \\ Lovelace\n\tç€😀\x01\x7f',
            "aliases": ["plain", {"address": "@a:m.org", "channel": "matrix"}],
        },
        "model": {"timeout": 2.5, "retries": 3, "on": True, "off": False, "tags": []},
        "roles": {"cli:work": {"role": "pm", "teams": ["core", "ops"]}, "odd key.x": {}},
        "deep": {"a": {"b": {"c": 1}}},
        "floats": {"inf": float("inf"), "ninf": float("-inf")},
    }
    text = dumps(data)
    assert tomllib.loads(text) == data
    assert '"odd key.x"' in text
    assert "[deep.a.b]" in text and "[deep]" not in text  # implicit parents stay implicit


def test_a_value_with_terminal_controls_is_written_escaped_and_reads_back_the_same() -> None:
    hostile = "good\x1b]0;PWNED\x07\x9b31m\u202eevil"  # a model id a server sent
    text = dumps({"model": {"model": hostile}})
    assert all(ch not in text for ch in ("\x1b", "\x07", "\x9b", "\u202e"))  # cat shows it inert
    assert tomllib.loads(text) == {"model": {"model": hostile}}


def test_the_asker_shows_what_a_server_said_without_obeying_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    Asker(read=lambda _q: "", interactive=False).say("models: good\x1b[2J\x9bevil\u202e")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x9b" not in out and "\u202e" not in out
    assert "good\\x1b[2J\\x9bevil\\u202e" in out


def test_write_atomic_replaces_with_mode_0600_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "config.toml"
    write_atomic(path, "a = 1\n")
    write_atomic(path, "a = 2\n")
    assert path.read_text() == "a = 2\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.toml"]


@pytest.fixture
def cfg(home: Path) -> Any:
    return load_config(home, env={})


def test_onboarding_asks_and_writes_a_config_load_config_accepts(cfg: Any, home: Path) -> None:
    said: list[str] = []
    closed = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: the test fails
    answers = [
        "",  # name is required: asked again
        "Ada",
        "ada",  # terminal user (this test's user may differ: a note is shown then)
        "ada@example.org",  # not a Matrix id: asked again
        "@ada:example.org",
        "",  # no e-mail
        "localhost:11434",  # not a URL: asked again
        closed,
        "",  # no API key
        "",  # model name is required
        "llama3",
        "k",  # the endpoint cannot be reached: keep these settings anyway
        "n",  # no Matrix gateway
        "n",  # no e-mail gateway
    ]
    assert run_onboarding(cfg, asker=asker(answers, said)) == 0
    written = load_config(home, env={})
    assert written.owner.name == "Ada"
    aliases = [(a.channel, a.address) for a in written.owner.aliases]  # type: ignore[union-attr]
    assert aliases == [("cli", "ada"), ("matrix", "@ada:example.org")]
    assert written.model.base_url == closed
    assert any("FAILED: cannot connect to" in s for s in said)
    assert written.model.model == "llama3"
    assert written.model.api_key is None
    text = "\n".join(said)
    assert "an answer is needed" in text
    assert "not a Matrix user id" in text
    assert "that base URL cannot be used: not an http:// or https:// URL" in text
    assert (home / "config.toml").read_text().startswith("# relaybot configuration")


def test_no_model_answers_leave_the_model_unset_and_say_how(cfg: Any, home: Path) -> None:
    said: list[str] = []
    assert run_onboarding(cfg, asker=asker(["Ada", "", "", "", "", "n", "n"], said)) == 0
    written = load_config(home, env={})
    assert written.owner.aliases == []
    assert not written.model.configured
    assert any("No model yet" in s for s in said)


def test_an_existing_config_is_kept_unless_forced_and_then_merged(
    cfg: Any, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "config.toml").write_text(
        '[owner]\nname = "Old"\n\n[model]\ntimeout = 5.0\nmodel = "old"\n\n'
        '[redis]\nprefix = "mine:"\n\n[roles]\n"cli:work" = "architect"\n'
    )
    assert run_onboarding(cfg, asker=asker(["Ada"], [])) == 1
    assert "--force" in capsys.readouterr().err
    answers = ["Ada", "", "", "", f"http://127.0.0.1:{free_port()}/v1", "key", "new", "k", "n", "n"]
    assert run_onboarding(cfg, force=True, asker=asker(answers, [])) == 0
    written = load_config(home, env={})
    assert written.owner.name == "Ada"
    assert written.redis.prefix == "mine:"
    assert written.roles["cli:work"].role == "architect"
    assert (written.model.model, written.model.timeout) == ("new", 5.0)
    assert written.model.api_key is not None and written.model.api_key.get_secret_value() == "key"


def test_a_config_that_is_not_toml_is_kept_aside_by_force_and_written_anew(
    cfg: Any, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The troubleshooting table says `relaybot onboard` rewrites a broken file: it refused,
    "not valid TOML; fix or remove it", even with --force."""
    broken = '[owner]\nname = "Ada\n'
    (home / "config.toml").write_text(broken)
    assert run_onboarding(cfg, asker=asker(["Ada"], [])) == 1
    err = capsys.readouterr().err
    assert "not valid TOML" in err and "--force" in err
    said: list[str] = []
    answers = ["Ada", "", "", "", "", "n", "n"]
    assert run_onboarding(cfg, force=True, asker=asker(answers, said)) == 0
    assert load_config(home, env={}).owner.name == "Ada"
    (kept,) = home.glob("config.toml.broken-*")
    assert kept.read_text() == broken
    assert any(str(kept) in s for s in said)


def test_running_out_of_answers_cancels_and_writes_nothing(
    cfg: Any, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_onboarding(cfg, asker=asker(["Ada", ""], [])) == 1
    assert "cancelled" in capsys.readouterr().err
    assert not (home / "config.toml").exists()
    # five wrong answers in a row also end it
    bad = ["Ada", "", *["nope"] * 5]
    assert run_onboarding(cfg, asker=asker(bad, [])) == 1
    assert not (home / "config.toml").exists()


def test_the_command_reads_its_answers_from_stdin(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("contract.logs.configure", lambda *_a, **_k: None)  # keep test logging
    monkeypatch.setattr("sys.stdin", io.StringIO("Ada\n\n\nada@example.org\n\nn\nn\n"))
    assert cli.main(["onboard"]) == 0
    assert "Wrote" in capsys.readouterr().out
    written = load_config(home, env={})
    assert [(a.channel, a.address) for a in written.owner.aliases] == [  # type: ignore[union-attr]
        ("email", "ada@example.org")
    ]


def test_every_question_of_a_section_has_a_flag() -> None:
    assert {*MODEL_KEYS, *MATRIX_KEYS, *EMAIL_KEYS} <= set(QUESTIONS)


def test_without_input_flags_answer_and_a_missing_name_is_named(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("contract.logs.configure", lambda *_a, **_k: None)
    assert cli.main(["onboard", "--no-input"]) == 1
    assert "--name is needed" in capsys.readouterr().err
    assert not (home / "config.toml").exists()
    assert cli.main(["onboard", "--no-input", "--name", "Ada", "--emails", "a@x.org"]) == 0
    written = load_config(home, env={})
    assert written.owner.name == "Ada" and not written.model.configured
    assert not written.matrix.configured and not written.email.configured
    assert (home / "config.toml").stat().st_mode & 0o777 == 0o600


def test_the_next_steps_name_relaybot_as_it_can_be_typed_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "Start chatting with: relaybot chat" was wrong in a clone whose venv is not activated
    (relaybot is not on PATH there): the next steps name the program that ran."""
    from relaybot import onboard

    me = tmp_path / ".venv" / "bin" / "relaybot"
    me.parent.mkdir(parents=True)
    me.touch()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(onboard.sys, "argv", [str(me), "onboard"])
    monkeypatch.setattr(onboard.shutil, "which", lambda _name: None)
    assert onboard.command_name() == ".venv/bin/relaybot"
    monkeypatch.setattr(onboard.shutil, "which", lambda _name: str(me))
    assert onboard.command_name() == "relaybot"
    monkeypatch.setattr(onboard.sys, "argv", ["/usr/lib/python3/relaybot/__main__.py"])
    assert onboard.command_name() == "relaybot"
