"""The log formats (contract/logs.py): which one is chosen, what a console line looks like, the
same masking in both; and the start-up wait for Redis saying so at once, then periodically."""

from __future__ import annotations

import io
import json
import logging
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import structlog
from structlog.testing import capture_logs

from contract import logs
from contract.bus import wait_for_redis
from contract.config import load_config

T = TypeVar("T")


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_environment_wins_over_the_config_and_auto_follows_the_stream() -> None:
    pipe = io.StringIO()
    assert logs.choose_format("console", pipe, env={"RELAYBOT_LOG_FORMAT": "json"}) == "json"
    assert logs.choose_format("json", Tty(), env={"RELAYBOT_LOG_FORMAT": "console"}) == "console"
    assert logs.choose_format("json", Tty(), env={}) == "json"
    assert logs.choose_format("console", pipe, env={}) == "console"
    assert logs.choose_format("auto", Tty(), env={}) == "console"
    assert logs.choose_format(None, pipe, env={}) == "json"  # pytest is not honcho
    assert logs.choose_format(None, pipe, env={"RELAYBOT_LOG_FORMAT": "auto"}) == "json"


def test_a_process_started_by_honcho_is_recognised() -> None:
    """honcho pipes each process's output to a person's terminal: console lines there."""
    with subprocess.Popen(["bash", "-c", "exec -a honcho sleep 30"]) as fake:
        try:
            assert _eventually(lambda: logs.under_honcho(fake.pid))
        finally:
            fake.kill()
    with subprocess.Popen(["bash", "-c", "exec -a honcho bash -c 'sleep 30; true'"]) as fake:
        try:  # a Procfile line run by a shell that does not exec: honcho is the grandparent
            child = _eventually(lambda: _children(fake.pid))
            assert _eventually(lambda: logs.under_honcho(child[0]))
        finally:
            fake.kill()
    assert not logs.under_honcho()  # pytest's parent is not honcho
    assert not logs.under_honcho(2**22 + 12345)  # no such process


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _eventually(check: Callable[[], T]) -> T | None:
    """``check`` once the exec has happened (a condition with a deadline, not a sleep)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.01)
    return None


def console_lines(**fields: object) -> list[str]:
    out = io.StringIO()
    assert logs.configure("test", stream=out, fmt="console", env={}) == "console"
    log = structlog.get_logger("t")
    log.warning("redis.waiting", **fields)
    return out.getvalue().splitlines()


def test_a_console_line_is_readable_without_colours_and_masks_secrets() -> None:
    [line] = console_lines(
        url="redis://relay:hunter2@10.0.0.1:6379/0", api_key="sk-live-1", tries=3
    )
    assert "\x1b[" not in line  # no colours: the stream is not a terminal
    assert "[warning  ] redis.waiting" in line
    assert "url=redis://relay:***@10.0.0.1:6379/0" in line
    assert "api_key=***" in line and "tries=3" in line and "process=test" in line
    assert "hunter2" not in line and "sk-live-1" not in line


def test_a_console_line_shows_a_senders_escape_sequences_instead_of_sending_them() -> None:
    [line] = console_lines(sender="@eve\x1b]0;EVIL\x07:m.org", subject="a\x9b2Jb")
    assert "\x1b" not in line and "\x07" not in line and "\x9b" not in line
    assert "sender=@eve\\x1b]0;EVIL\\x07:m.org" in line and "subject=a\\x9b2Jb" in line
    out = io.StringIO()
    logs.configure("test", stream=out, fmt="console", env={})
    logging.getLogger("nio").warning("from \x1b[2J%s", "\x9b")
    assert "\x1b" not in out.getvalue() and "\x9b" not in out.getvalue()
    assert "from \\x1b[2J\\x9b" in out.getvalue()


def test_stdlib_loggers_go_through_the_same_format_and_masking() -> None:
    out = io.StringIO()
    logs.configure("test", stream=out, fmt="console", env={})
    logging.getLogger("rq.worker").warning("lost redis://u:pw123@h:1/0")
    text = out.getvalue()
    assert "pw123" not in text and "redis://u:***@h:1/0" in text
    assert not text.lstrip().startswith("{")


def test_colours_only_on_a_terminal_and_never_with_no_color() -> None:
    tty = Tty()
    logs.configure("test", stream=tty, env={})
    structlog.get_logger("t").info("hello")
    assert "\x1b[" in tty.getvalue()
    quiet = Tty()
    logs.configure("test", stream=quiet, env={"NO_COLOR": "1"})
    structlog.get_logger("t").info("hello")
    assert "\x1b[" not in quiet.getvalue() and "hello" in quiet.getvalue()


def test_the_config_key_and_its_variable(tmp_path: Path) -> None:
    home = tmp_path
    (home / "config.toml").write_text('[logs]\nformat = "json"\n')
    assert load_config(home, env={}).logs.format == "json"
    assert load_config(home, env={"RELAYBOT_LOG_FORMAT": "console"}).logs.format == "console"


def test_waiting_for_redis_is_said_at_once_then_periodically(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = load_config(tmp_path, env={"REDIS_URL": f"redis://u:s3cret@127.0.0.1:{port}/0"})
    with capture_logs() as captured, pytest.raises(Exception, match="gave up after"):
        wait_for_redis(cfg, timeout=0.5, poll=0.01, say_every=0.1)
    waiting = [c for c in captured if c["event"] == "redis.waiting"]
    assert waiting[0]["log_level"] == "info" and waiting[0]["waited_s"] < 0.1
    assert 3 <= len(waiting) <= 7  # every say_every, not every poll
    assert all(c["log_level"] == "warning" for c in waiting[1:])
    assert "s3cret" not in waiting[0]["url"] and "127.0.0.1" in waiting[0]["url"]


def test_nio_says_what_it_does_with_each_event_only_at_debug() -> None:
    out = io.StringIO()
    logs.configure("gateway", stream=out, fmt="json", env={})
    nio = logging.getLogger("nio.rooms")
    nio.info("Room !x:hs handling event of type RoomMemberEvent")
    nio.warning("a real problem")
    text = out.getvalue()
    assert "handling event" not in text and "a real problem" in text
    verbose = io.StringIO()
    logs.configure("gateway", level="DEBUG", stream=verbose, fmt="json", env={})
    logging.getLogger("nio.rooms").info("Room !x:hs handling event of type RoomMemberEvent")
    assert "handling event" in verbose.getvalue()


def test_nio_debug_lines_never_show_even_at_debug() -> None:
    """nio's debug lines hold whole responses: a login's access token, a sync's message bodies."""
    verbose = io.StringIO()
    logs.configure("gateway", level="DEBUG", stream=verbose, fmt="json", env={})
    logging.getLogger("nio.responses").debug(
        "Validating response schema SyncResponse: {'body': 'my passport number is X1'}"
    )
    logging.getLogger("nio.client.async_client").debug("sync payload: my passport number")
    structlog.get_logger("t").debug("ours.debug")
    assert "passport" not in verbose.getvalue() and "ours.debug" in verbose.getvalue()


def test_a_redis_that_does_not_answer_is_said_at_once_too(tmp_path: Path) -> None:
    """A host that drops packets, or a stopped server, answers nothing: the first try gives up
    after a second, not after the socket timeout (10 s: the line came after 20-30 s)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the kernel; nothing ever answers
        port = silent.getsockname()[1]
        home = tmp_path
        (home / "config.toml").write_text("[redis]\nsocket_timeout = 3\n")
        cfg = load_config(home, env={"REDIS_URL": f"redis://127.0.0.1:{port}/0"})
        started = time.monotonic()
        with capture_logs() as captured, pytest.raises(Exception, match="gave up after"):
            wait_for_redis(cfg, timeout=0.5, poll=0.01)
    first = next(c for c in captured if c["event"] == "redis.waiting")
    assert first["waited_s"] < 2.0
    assert "Timeout" in first["error"]
    assert time.monotonic() - started < 6  # the probe (1 s), then one try of socket_timeout


def test_a_lines_time_is_utc_to_the_microsecond_with_a_z() -> None:
    from datetime import UTC, datetime, timedelta

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    samples = [0.0, 1.5, 1_764_000_000.25, 1_764_000_059.999_999_7, 1_795_727_336.138_273_5]
    for t in [*samples, time.time()]:
        # exact integer microseconds: datetime.fromtimestamp rounds t itself (half to even on a
        # binary float), which may land one microsecond apart from round(t * 1e6) (CI saw it)
        expected = epoch + timedelta(microseconds=round(t * 1_000_000))
        stamp = expected.isoformat(timespec="microseconds").replace("+00:00", "Z")
        assert logs.utc_stamp(t) == stamp
    stream = io.StringIO()
    logs.configure("worker", stream=stream, fmt="json")
    before = time.time()
    structlog.get_logger("t").info("x.done")
    stamp = json.loads(stream.getvalue().splitlines()[-1])["timestamp"]
    when = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    assert before - 0.001 <= when <= time.time() + 0.001
    structlog.reset_defaults()


def test_the_json_line_is_what_structlogs_json_renderer_writes() -> None:
    class Thing:
        def __repr__(self) -> str:
            return "<thing>"

    class Own:
        def __structlog__(self) -> str:
            return "own"

    reference = structlog.processors.JSONRenderer()
    ours = logs.JsonLine()
    for event in (
        {"event": "turn.done", "ms": 0.30000000000000004, "error": None, "rounds": 1},
        {"event": "x", "text": 'héllo \u2028 \x1b[31m "q" \\', "big": 10**30, "neg": -1.5e-7},
        {"event": "x", "nested": {"a": [1, 2.5, None, True], "b": {}}, "empty": []},
        {"event": "x", "thing": Thing(), "own": Own(), "inf": float("inf")},
    ):
        assert ours(None, "info", dict(event)) == reference(None, "info", dict(event))


def test_a_json_traceback_never_shows_the_frames_local_variables() -> None:
    """A failing tool's traceback listed each frame's locals: the message text and the tool's
    arguments (the adversarial review)."""
    stream = io.StringIO()
    logs.configure("worker", stream=stream, fmt="json")

    def tool(text: str) -> None:
        arguments = {"query": "LEAKQ3"}
        raise OverflowError(f"too large ({len(text)} {len(arguments)})")

    try:
        tool("MSGTEXT secret words")
    except OverflowError:
        structlog.get_logger("t").warning("tool.failed", exc_info=True)
    structlog.reset_defaults()
    line = stream.getvalue().splitlines()[-1]
    record = json.loads(line)
    assert record["exception"][0]["exc_type"] == "OverflowError"
    assert "MSGTEXT" not in line and "LEAKQ3" not in line
