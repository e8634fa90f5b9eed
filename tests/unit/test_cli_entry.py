"""The ``relaybot`` entry point: --version, the command word, ``.env``, private files, and how
the terminal chat shows a reply (issue 13)."""

from __future__ import annotations

import io
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from contract.config import Config, load_config
from contract.messages import Reply
from relaybot import chat, chat_render, cli, envfile, private


@pytest.fixture(autouse=True)
def _umask() -> object:
    """cli.main sets the process's umask (077): give the other tests theirs back."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """cli.main points structlog at this test's captured stderr, closed once the test ends: the
    tests after this one log through the configuration they had."""
    config = structlog.get_config()
    yield
    structlog.configure(**config)


@pytest.fixture(autouse=True)
def _restore_environ() -> Iterator[None]:
    """load_dotenv_here sets os.environ behind monkeypatch's back: put it back after each test
    (a leaked RELAYBOT_MODEL or REDIS_URL changes what later tests load)."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


def test_version_is_printed_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as done:
            cli.main([flag])
        assert done.value.code == 0
        assert capsys.readouterr().out == f"relaybot {cli.version()}\n"
    assert cli.version()[0].isdigit()


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["redis-cli", "--scan", "--pattern", "rb:*"], ["--scan", "--pattern", "rb:*"]),
        (["-v", "redis-cli", "-n", "0", "--raw", "TIME"], ["-n", "0", "--raw", "TIME"]),
        (["redis-cli"], []),
    ],
)  # fmt: skip
def test_everything_after_the_redis_cli_word_is_redis_clis(
    argv: list[str], extra: list[str]
) -> None:
    args = cli.parse_args(argv)
    assert (args.command, args.args) == ("redis-cli", extra)


def test_redis_cli_as_a_word_of_another_command_is_just_a_word() -> None:
    args = cli.parse_args(["memory", "search", "redis-cli", "--limit", "3"])
    assert args.command == "memory"
    assert (args.query, args.limit) == (["redis-cli"], 3)


def test_dotenv_of_the_current_directory_is_read_as_honcho_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in ("RELAYBOT_HOME", "REDIS_URL", "RELAYBOT_REDIS_PREFIX", "RELAYBOT_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("RELAYBOT_DOTENV")  # the test suite's "none"
    (tmp_path / ".env").write_text(
        "RELAYBOT_HOME=./data\n"
        "REDIS_URL=redis://:pa${x}ss@127.0.0.1:6390/0\n"  # taken literally, as honcho does
        "RELAYBOT_REDIS_PREFIX=app:\n"
        "RELAYBOT_MODEL=from-dotenv\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("RELAYBOT_MODEL", "from-shell")  # .env wins, as for honcho's processes
    monkeypatch.chdir(tmp_path)
    assert envfile.load_dotenv_here() == tmp_path / ".env"
    cfg = load_config()
    assert cfg.home == tmp_path / "data"
    assert cfg.redis.url is not None
    assert cfg.redis.url.get_secret_value() == "redis://:pa${x}ss@127.0.0.1:6390/0"
    assert cfg.redis.prefix == "app:"
    assert cfg.model.model == "from-dotenv"
    assert "sets RELAYBOT_MODEL, over the value this shell has" in capsys.readouterr().err


def test_a_nul_byte_in_dotenv_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELAYBOT_DOTENV")
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_bytes(b"RELAYBOT_HOME=/tmp/x\nFOO=a\x00b\n")
    with pytest.raises(envfile.EnvFileError, match="line 2: a NUL byte"):
        envfile.load_dotenv_here()


def test_no_dotenv_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAYBOT_DOTENV")
    monkeypatch.chdir(tmp_path)
    before = dict(os.environ)
    assert envfile.load_dotenv_here() is None
    assert dict(os.environ) == before


def test_relaybot_dotenv_names_another_file_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELAYBOT_MODEL", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("RELAYBOT_MODEL=here\n", encoding="utf-8")
    (tmp_path / "other.env").write_text("RELAYBOT_MODEL=other\n", encoding="utf-8")
    monkeypatch.setenv("RELAYBOT_DOTENV", "")
    assert envfile.load_dotenv_here() is None
    assert "RELAYBOT_MODEL" not in os.environ
    monkeypatch.setenv("RELAYBOT_DOTENV", str(tmp_path / "other.env"))
    assert envfile.load_dotenv_here() == tmp_path / "other.env"
    assert os.environ["RELAYBOT_MODEL"] == "other"


def test_a_relaybot_dotenv_that_names_no_file_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("RELAYBOT_MODEL=here\n", encoding="utf-8")
    monkeypatch.setenv("RELAYBOT_DOTENV", str(tmp_path / "typo.env"))
    with pytest.raises(envfile.EnvFileError, match=r"typo\.env does not exist"):
        envfile.load_dotenv_here()
    monkeypatch.setenv("RELAYBOT_DOTENV", str(tmp_path))  # a directory
    with pytest.raises(envfile.EnvFileError, match="is not a file"):
        envfile.load_dotenv_here()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_loose_files_under_the_home_are_made_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "redis").mkdir(parents=True)
    (home / "logs").mkdir()
    for name in ("memory.sqlite3", "memory.sqlite3-wal", "config.toml", "logs/worker.log"):
        (home / name).write_text("x")
        os.chmod(home / name, 0o644)
    os.chmod(home / "redis", 0o755)
    os.chmod(home, 0o755)
    (home / "private.txt").write_text("x")
    os.chmod(home / "private.txt", 0o600)
    outside = tmp_path / "shared.txt"
    outside.write_text("x")
    os.chmod(outside, 0o644)
    (home / "link").symlink_to(outside)  # a link is left alone, and so is its target
    cfg = Config(home=home)

    loose = {x.path: x.mode for x in private.loose_paths(cfg)}
    assert loose == {
        home: 0o755,
        home / "redis": 0o755,
        home / "memory.sqlite3": 0o644,
        home / "memory.sqlite3-wal": 0o644,
        home / "config.toml": 0o644,
        home / "logs/worker.log": 0o644,
    } | ({home / "logs": mode(home / "logs")} if mode(home / "logs") & 0o077 else {})
    done, failed = private.tighten(cfg)
    assert failed == []
    assert {x.path for x in done} == set(loose)
    assert mode(home) == 0o700
    assert mode(home / "redis") == 0o700
    assert mode(home / "memory.sqlite3") == 0o600
    assert mode(home / "logs/worker.log") == 0o600
    assert mode(outside) == 0o644
    assert private.loose_paths(cfg) == []  # said once: nothing left to tighten


def test_memory_and_matrix_store_outside_the_home_are_private_too(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "var"
    home.mkdir(mode=0o700)
    (elsewhere / "matrix").mkdir(parents=True)
    db = elsewhere / "memory.sqlite3"
    for path in (db, elsewhere / "memory.sqlite3-shm", elsewhere / "matrix" / "session.json"):
        path.write_text("x")
        os.chmod(path, 0o644)
    os.chmod(elsewhere / "matrix", 0o755)
    os.chmod(elsewhere, 0o755)
    cfg = Config.model_validate(
        {"home": home, "memory": {"path": db}, "matrix": {"store_path": elsewhere / "matrix"}}
    )
    private.tighten(cfg)
    assert mode(db) == mode(elsewhere / "memory.sqlite3-shm") == 0o600
    assert mode(elsewhere / "matrix") == 0o700
    assert mode(elsewhere / "matrix" / "session.json") == 0o600
    assert mode(elsewhere) != 0o700  # the directory it was put in is the owner's business


def test_a_command_tightens_the_home_and_creates_private_files(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    os.chmod(home, 0o755)
    db = home / "memory.sqlite3"
    db.write_bytes(b"")
    os.chmod(db, 0o644)
    os.umask(0o022)
    assert cli.main(["memory", "status"]) in (0, 1)
    assert mode(home) == 0o700
    assert mode(db) == 0o600
    new = home / "new-file"
    new.write_text("x")
    new.parent.joinpath("new-dir").mkdir()
    assert mode(new) == 0o600
    assert mode(home / "new-dir") == 0o700
    assert "home.permissions_tightened" in capsys.readouterr().err


# -- the chat ------------------------------------------------------------------------------------


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def reply(text: str, kind: str = "reply", created: float | None = None) -> Reply:
    return Reply.model_validate(
        {
            "reply_id": "r1",
            "answers": "cli:1-0",
            "kind": kind,
            "channel": "cli",
            "session": "cli:s",
            "conversation": "cli:s",
            "text": text,
            "created": time.time() if created is None else created,
        }
    )


def test_a_reply_in_a_pipe_is_exactly_its_text() -> None:
    out = io.StringIO()
    view = chat_render.ReplyView(out, "relaybot")
    view.show(reply("**bold** and `code`"))
    view.show(reply("it failed", kind="error"))
    assert out.getvalue() == "**bold** and `code`\n! it failed\n"


def test_a_reply_on_a_terminal_is_rendered_with_who_and_when() -> None:
    out = Tty()
    created = time.mktime((2026, 11, 24, 14, 32, 0, 0, 0, -1))
    view = chat_render.ReplyView(out, "Robin")
    view.show(reply("# Plan\n\n- **bold** item\n- `code`", created=created))
    shown = out.getvalue()
    assert "Robin · " in shown and "14:32" in shown
    assert "**" not in shown and "# Plan" not in shown  # Markdown rendered, not echoed
    assert "bold" in shown and "item" in shown and "Plan" in shown
    assert "\x1b[" in shown  # styled


def test_the_time_says_the_day_only_when_it_is_not_today() -> None:
    now = time.mktime((2026, 11, 24, 18, 0, 0, 0, 0, -1))
    assert chat_render.stamp(now - 3600, now) == "17:00"
    assert chat_render.stamp(now - 86400, now) == "2026-11-23 18:00"
    assert chat_render.header(reply("x", kind="error", created=now), "relaybot", now) == (
        "relaybot (error) · 18:00"
    )


def test_status_in_short() -> None:
    status = {
        "worker_lease": {"holder": "worker@host:12"},
        "group": {"pending": 2},
        "dead_letters": 1,
        "heartbeats": {"worker": {"stale": False}, "jobs": {"stale": True}},
    }
    cfg = Config.model_validate(
        {"home": "/tmp/x", "model": {"base_url": "http://m/v1", "model": "llama"}}
    )
    text = chat.short_status(status, cfg, "ada-1")
    assert "session:  ada-1" in text
    assert "worker:   running (worker@host:12)" in text
    assert "2 pending, 1 dead letters" in text
    assert "llama at http://m/v1" in text
    assert "alive:    worker (stale: jobs)" in text
    assert "home:     /tmp/x" in text
    none = chat.short_status(
        {"worker_lease": None, "group": None, "dead_letters": 0, "heartbeats": {}},
        Config(home=Path("/tmp/x")),
        "s",
    )
    assert "worker:   none running" in none
    assert "not configured" in none
    keyed = Config.model_validate(
        {"home": "/tmp/x", "model": {"base_url": "http://u:pw9@m/v1?key=sk-q7", "model": "l"}}
    )
    shown = chat.short_status(status, keyed, "s")
    assert "l at http://m/v1" in shown and "sk-q7" not in shown and "pw9" not in shown


def test_a_session_name_is_checked_before_anything_is_sent() -> None:
    assert chat.bad_session("ada-1a2b3c") is None
    assert chat.bad_session("work") is None
    for bad in ("a b", "a*b", "-x", "", "x" * 300):
        assert "cannot name a session" in (chat.bad_session(bad) or ""), bad


TRICKY_DOTENV = [
    "RELAYBOT_HOME=/tmp/h#x",  # shlex: a comment from the #
    "SPACED=a b  c",
    "QUOTED='a b # c'",
    'DOUBLE="a\\"b\\\\c $HOME"',
    "BACKSLASH=a\\ b\\\\c\\n",
    "NEWLINE=one\\ntwo\\tthree",
    "EMPTY=",
    "EMPTY_QUOTED=''",
    "export EXPORTED=1",
    "  INDENTED = spaced  ",
    "# a comment",
    "",
    "URL=redis://:pa${x}ss@127.0.0.1:6390/0?x=1&y=2",
    "NOEQUALS",
    "1BAD=x",
    "LATER=first",
    "LATER=second",
    "UNICODE=café ✓",
    "EQ=a=b==c",
]


def test_dotenv_values_are_exactly_what_honcho_gives_its_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from honcho.command import _read_env  # what `honcho start` reads .env with

    (tmp_path / ".env").write_text("\n".join(TRICKY_DOTENV) + "\n", encoding="utf-8")
    honcho = _read_env(str(tmp_path), ".env")
    values, ignored = envfile.parse(tmp_path / ".env")
    assert values == honcho
    assert values["RELAYBOT_HOME"] == "/tmp/h"  # python-dotenv said /tmp/h#x
    assert "EMPTY" not in values and "EXPORTED" not in values
    numbers = {line: n for n, line in enumerate(TRICKY_DOTENV, 1)}
    assert ignored == [numbers[x] for x in ("EMPTY=", "export EXPORTED=1", "NOEQUALS", "1BAD=x")]

    for name in values:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("RELAYBOT_DOTENV")
    monkeypatch.chdir(tmp_path)
    assert envfile.load_dotenv_here() == tmp_path / ".env"
    assert {name: os.environ[name] for name in values} == honcho
    assert load_config().home == Path("/tmp/h")


def test_a_line_honcho_ignores_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RELAYBOT_DOTENV")
    monkeypatch.delenv("RELAYBOT_REDIS_PREFIX", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("# ok\n\nexport RELAYBOT_REDIS_PREFIX=x:\n", encoding="utf-8")
    envfile.load_dotenv_here()
    assert "RELAYBOT_REDIS_PREFIX" not in os.environ  # as honcho: not set
    err = capsys.readouterr().err
    assert f"{tmp_path / '.env'} line 3 sets nothing" in err


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"OK=1\n\xff\n", ".env line 2: not UTF-8 text"),
        (b"OK=1\nRELAYBOT_HOME='/tmp/unclosed\n", ".env line 2: No closing quotation"),
        (b"A=1\\", ".env line 1: No escaped character"),
    ],
)
def test_a_damaged_dotenv_is_a_clear_error_and_help_and_version_still_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    said: str,
) -> None:
    monkeypatch.delenv("RELAYBOT_DOTENV")
    monkeypatch.setenv("RELAYBOT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_bytes(content)
    assert cli.main(["status"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "Traceback" not in err
    assert "OK" not in os.environ  # nothing of a damaged file is used
    for flag in (["--version"], ["--help"], ["memory", "--help"]):
        with pytest.raises(SystemExit) as done:
            cli.main(flag)
        assert done.value.code == 0
        assert capsys.readouterr().out


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis://:s3cret@127.0.0.1:badport/0", "the port is not a number"),
        ("redis://:s3cret@127.0.0.1:70000/0", "the port is not a number"),
        ("http://s3cret@x", "not a Redis URL"),
        ("redis://:s3cret@127.0.0.1:6379/zero", "the database"),
    ],
)
def test_a_malformed_redis_url_is_a_configuration_error_that_hides_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    url: str,
    said: str,
) -> None:
    monkeypatch.setenv("RELAYBOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("REDIS_URL", url)
    for command in (["status"], ["chat", "-m", "hi"], ["worker", "--no-wait"]):
        assert cli.main(command) == cli.EXIT_CONFIG
        err = capsys.readouterr().err
        assert "REDIS_URL" in err and said in err, err
        assert "s3cret" not in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["h%41x", "h?x=1", "h#x", "h %20 ?#%"])
def test_the_embedded_sockets_url_names_the_socket_whatever_the_home(
    tmp_path: Path, name: str
) -> None:
    from redis.connection import parse_url

    from contract.bus import redis_url

    cfg = Config(home=tmp_path / name)
    assert parse_url(redis_url(cfg))["path"] == str(tmp_path / name / "redis" / "redis.sock")


def test_a_replys_single_line_breaks_are_kept_on_a_terminal() -> None:
    out = Tty()
    chat_render.ReplyView(out, "relaybot").show(reply("line one\n/new\nline three\n\n- a\n- b"))
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in out.getvalue().splitlines()]
    assert "line one" in lines and "/new" in lines and "line three" in lines
    assert any(line.endswith(" a") and line.startswith("•") for line in lines)  # still Markdown
