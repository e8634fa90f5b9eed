"""What ``honcho start`` shows a person (issue 26): one time per line (honcho's; relaybot's own
console lines carry none under honcho), no rq internals and no per-request model lines at the
default level, and an unconfigured gateway or model said at info, not as a warning."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.e2e.test_procfile import BIN, REPO, App, base_env
from tests.support.fakemodel import FakeModelServer

pytestmark = pytest.mark.e2e

ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?")
HONCHO_LINE = re.compile(r"^(\d\d:\d\d:\d\d) (\S+) +\| (.*)$")


def test_honcho_output_is_one_readable_line_per_event(
    tmp_path, model_server: FakeModelServer
) -> None:
    model = model_server
    app = App(
        tmp_path,
        {"RELAYBOT_HOME": str(tmp_path / "home"), "OPENAI_BASE_URL": model.base_url,
         "RELAYBOT_MODEL": "fake-model"},
    )  # fmt: skip
    app.start()
    try:
        app.wait_for_heartbeats(("worker", "jobs"))
        done = app.relaybot("chat", "-m", "hello honcho", "--session", "out")
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 30
        wanted = ("turn.done", "matrix.not_configured", "email.not_configured")
        while not all(w in app.log() for w in wanted) and time.monotonic() < deadline:
            time.sleep(0.1)  # honcho shows a line once it read it from the pipe
    finally:
        app.stop()
    log = app.log()
    log = log.split("sending SIGTERM", 1)[0]  # while it runs (stopping is another story)
    ours = [m for line in log.splitlines() if (m := HONCHO_LINE.match(line))]
    ours = [m for m in ours if m.group(2).split(".")[0] in ("worker", "jobs", "matrix", "email")]
    assert ours, log
    for m in ours:  # honcho's time, and no second one of ours
        assert not ISO_TIME.search(m.group(3)), m.group(0)
    text = "\n".join(m.group(0) for m in ours)
    assert re.search(r"worker\.1 +\| \[info\s*\] turn\.done\b", text), text
    assert re.search(r"matrix\.1 +\| \[info\s*\] matrix\.not_configured\b", text), text
    assert re.search(r"email\.1 +\| \[info\s*\] email\.not_configured\b", text), text
    for internal in ("Listening on", "started with PID", "cleaning registries", "subscribing"):
        assert internal not in text, text  # rq's own lines: debug
    assert "model.request" not in text and "model.response" not in text, text
    assert not re.search(r"\[(warning|error)", text), text


def test_the_readmes_cli_only_honcho_line_answers_a_chat(tmp_path, model_server) -> None:
    """The README's CLI-only setup, ``honcho start redis worker`` as it writes it: the chat in
    another terminal is answered, and nothing else was started."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(
        r"CLI-only setup needs\s+nothing but .*?`(honcho start [a-z ]+)`", readme, re.S
    )
    assert found, "the README names no honcho line for a CLI-only setup"
    names = found.group(1).split()[2:]
    assert names == ["redis", "worker"]
    app = App(
        tmp_path,
        {"RELAYBOT_HOME": str(tmp_path / "home"), "OPENAI_BASE_URL": model_server.base_url,
         "RELAYBOT_MODEL": "fake-model"},
    )  # fmt: skip
    with app.output.open("wb") as out:
        app.honcho = subprocess.Popen(
            [str(BIN / "honcho"), "start", "-f", str(REPO / "Procfile"), "-d", str(app.dir),
             *names],
            cwd=app.dir, env=base_env(), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        app.wait_for_heartbeats(("worker",))
        done = app.relaybot("chat", "-m", "just the terminal", "--session", "clionly")
        assert done.returncode == 0, done.stderr + app.log()
        assert done.stdout.startswith("echo: [cli / owner] ")
        running = " ".join(" ".join(p.cmdline()) for p in app.processes())
        assert "relaybot worker" in running and "relaybot jobs" not in running
        assert "gateway" not in running
    finally:
        app.stop()
