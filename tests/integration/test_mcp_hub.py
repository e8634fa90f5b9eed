"""The worker's MCP hub (worker/mcp_hub.py) against the real test server of
tests/support/mcp_server.py, over stdio and over streamable HTTP: up and listed, pinned at first
sight, called; a hanging tool times out and the session goes on; a server killed mid-call fails
the call and comes back; a server that will not start or answers garbage is down with a reason;
10 MB over stdio comes back bounded, more than 1 MiB over HTTP is an error; approval by digest;
a reload adds, removes and restarts; close() leaves no child process behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from contract.mcp_config import McpServerConfig
from contract.messages import Privacy
from tests.support.mcp_rig import mcp_http
from tests.support.procs import REPO
from tests.support.servers import free_port
from worker.mcp_hub import McpHub
from worker.mcp_pins import PinStore
from worker.mcp_rules import listing_digest, offer, pin_of

pytestmark = pytest.mark.timeout(60)

FAST = (0.2, 1.0)  # the backoff of these tests: reconnects in a fraction of a second


def stdio(
    log: Path, shape: str = "1", timeout: float = 2.0, extra: str = "0", **kw: Any
) -> McpServerConfig:
    plain = {"MCP_TEST_LOG": str(log), "MCP_TEST_SHAPE": shape, "PYTHONPATH": str(REPO)}
    plain["MCP_TEST_EXTRA"] = extra
    env = {k: SecretStr(v) for k, v in plain.items()}  # as config.toml's env reaches the hub
    command = [sys.executable, "-m", "tests.support.mcp_server", "stdio"]
    return McpServerConfig(command=command, env=env, timeout=timeout, **kw)


def requests(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def pids(log: Path) -> set[int]:
    return {r["pid"] for r in requests(log)}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_for(what: Callable[[], object], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def state(hub: McpHub, name: str) -> str:
    return str(hub.health()["mcp"][name]["state"])


@pytest.fixture
def hubs(tmp_path: Path) -> Iterator[Callable[..., McpHub]]:
    made: list[McpHub] = []

    def make(servers: dict[str, McpServerConfig], **kw: Any) -> McpHub:
        hub = McpHub(servers, PinStore(tmp_path / "pins"), backoff=FAST, **kw).start()
        made.append(hub)
        return hub

    yield make
    for hub in made:
        hub.close()


@pytest.fixture
def http_url(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "http-calls.jsonl"
    with mcp_http(log) as (url, _):
        yield f"{url}?token=s3cret", log


# -- up, listed, pinned, called -------------------------------------------------------------------


def test_stdio_up_listed_pinned_at_first_sight_and_called(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    hub = hubs({"files": stdio(log)}, reserved={"clock"})
    wait_for(lambda: state(hub, "files") == "up")
    snap = hub.snapshot()
    listed = snap.listings["files"]
    assert sorted(t.name for t in listed) == ["echo", "hang", "huge", "shifty"]
    assert snap.pins["files"] == pin_of("files", listed)  # trust on first use
    assert PinStore(tmp_path / "pins").read("files") == pin_of("files", listed)
    health = hub.health()["mcp"]["files"]
    assert health["pin"] == "first" and health["transport"] == "stdio"
    assert health["digest"] == listing_digest(listed) and health["audiences"] == ["owner"]
    assert {t["exposed"] for t in health["tools"] if t["status"] == "offered"} == {
        "files_echo", "files_hang", "files_huge", "files_shifty"
    }  # fmt: skip
    assert hub.call("files", "echo", {"text": "hello"}, budget=100) == "hello"
    assert [r["tool"] for r in requests(log) if r["method"] == "tools/call"] == ["echo"]
    # a tool it does not have, and a server that is not configured: error results
    assert hub.call("files", "nope", {}, budget=100).startswith("error: ")
    assert hub.call("mail", "echo", {"text": "x"}, budget=100).startswith("error: no MCP server")
    assert hub.call("files", "echo", {"text": object()}, budget=100).startswith("error: ")
    assert hub.call("files", "echo", "not a dict", budget=100).startswith("error: ")  # type: ignore[arg-type]
    assert hub.call("files", "echo", {"text": "still up"}, budget=100) == "still up"


def test_http_up_and_called_and_an_answer_over_one_mebibyte_is_an_error(
    hubs: Callable[..., McpHub], http_url: tuple[str, Path]
) -> None:
    url, log = http_url
    hub = hubs({"web": McpServerConfig(url=url, timeout=5)})
    wait_for(lambda: state(hub, "web") == "up")
    assert hub.health()["mcp"]["web"]["transport"] == "http"
    assert hub.call("web", "echo", {"text": "over http"}, budget=100) == "over http"
    big = hub.call("web", "huge", {"megabytes": 2}, budget=12_000)
    assert big.startswith("error: the answer was larger than 1 MiB"), big
    assert "s3cret" not in big
    assert hub.call("web", "echo", {"text": "after"}, budget=100) == "after"
    assert state(hub, "web") == "up"
    assert [r["tool"] for r in requests(log) if r["method"] == "tools/call"] == [
        "echo", "huge", "echo"
    ]  # fmt: skip


def test_ten_megabytes_over_stdio_come_back_bounded(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    hub = hubs({"files": stdio(tmp_path / "calls.jsonl", timeout=20)})
    wait_for(lambda: state(hub, "files") == "up")
    text = hub.call("files", "huge", {"megabytes": 10}, budget=12_000)
    assert 12_000 <= len(text) <= 12_001 and set(text) == {"x"}
    assert hub.call("files", "echo", {"text": "still"}, budget=100) == "still"


def test_a_tool_added_while_the_server_runs_is_listed_and_withheld_until_approved(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    hub = hubs({"files": stdio(tmp_path / "calls.jsonl", extra="1")})
    wait_for(lambda: state(hub, "files") == "up")
    version = hub.snapshot().version
    assert hub.call("files", "grow", {"name": "fresh"}, budget=100) == "added fresh"
    wait_for(lambda: any(t.name == "fresh" for t in hub.snapshot().listings["files"]))
    snap = hub.snapshot()
    assert snap.version > version
    made = offer(snap.servers, snap.listings, snap.pins, Privacy.OWNER)
    assert "files_fresh" not in made.tools and "files_echo" in made.tools
    (fresh,) = [w for w in made.withheld if w.tool == "fresh"]
    assert fresh.reason.startswith("new since the listing was approved")
    answer = hub.approve("files", listing_digest(snap.listings["files"]))
    assert answer["added"] == ["fresh"] and answer["changed"] == []


def test_a_stdio_server_gets_its_env_and_none_of_the_workers_secrets(
    hubs: Callable[..., McpHub], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYBOT_MODEL_KEY", "sk-secret")
    hub = hubs({"files": stdio(tmp_path / "calls.jsonl", extra="1")})
    wait_for(lambda: state(hub, "files") == "up")
    assert hub.call("files", "getenv", {"name": "MCP_TEST_EXTRA"}, budget=100) == "1"
    assert hub.call("files", "getenv", {"name": "RELAYBOT_MODEL_KEY"}, budget=100) == "(unset)"
    assert hub.call("files", "getenv", {"name": "PATH"}, budget=9999) == os.environ["PATH"]


# -- failures ------------------------------------------------------------------------------------


def test_a_hanging_tool_times_out_at_the_servers_timeout_and_the_session_goes_on(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    hub = hubs({"files": stdio(tmp_path / "calls.jsonl", timeout=1.0)})
    wait_for(lambda: state(hub, "files") == "up")
    started = time.monotonic()
    text = hub.call("files", "hang", {"seconds": 60}, budget=100)
    assert text == "error: the tool did not answer within 1 s (its server's timeout)"
    assert 0.9 < time.monotonic() - started < 3
    assert hub.call("files", "echo", {"text": "still here"}, budget=100) == "still here"
    assert state(hub, "files") == "up"


def test_a_server_killed_mid_call_fails_the_call_then_comes_back(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    hub = hubs({"files": stdio(log, timeout=30)})
    wait_for(lambda: state(hub, "files") == "up")
    (first,) = pids(log)
    result: list[str] = []
    caller = threading.Thread(
        target=lambda: result.append(hub.call("files", "hang", {"seconds": 60}, budget=100))
    )
    started = time.monotonic()
    caller.start()
    wait_for(lambda: any(r["tool"] == "hang" for r in requests(log)))
    os.kill(first, signal.SIGKILL)
    caller.join(timeout=10)
    assert result and result[0].startswith("error: the server closed the connection"), result
    assert time.monotonic() - started < 5  # not the 30 s timeout
    wait_for(lambda: first not in pids(log) or len(pids(log)) == 2)
    wait_for(lambda: state(hub, "files") == "up" and len(pids(log)) == 2)
    assert hub.call("files", "echo", {"text": "back"}, budget=100) == "back"


def test_a_server_that_will_not_start_is_down_with_its_reason(
    hubs: Callable[..., McpHub],
) -> None:
    cfg = McpServerConfig(command=["/nonexistent/mcp-server"], timeout=1)
    hub = hubs({"broken": cfg})
    wait_for(lambda: state(hub, "broken") == "down")
    health = hub.health()["mcp"]["broken"]
    assert health["reason"] == "could not start: no program '/nonexistent/mcp-server'"
    assert health["retry_in"] is not None and health["tools"] == []
    assert "broken" not in hub.snapshot().listings
    text = hub.call("broken", "echo", {"text": "x"}, budget=100)
    assert text.startswith("error: the MCP server 'broken' is not connected"), text


def test_a_server_that_answers_garbage_is_down_and_not_offered(
    hubs: Callable[..., McpHub],
) -> None:
    script = str(REPO / "tests" / "support" / "mcp_garbage.py")
    hub = hubs({"junk": McpServerConfig(command=[sys.executable, script], timeout=2)})
    wait_for(lambda: state(hub, "junk") == "down")
    assert "not MCP" in hub.health()["mcp"]["junk"]["reason"]
    assert "junk" not in hub.snapshot().listings


def test_an_unreachable_http_server_is_down_without_its_token_in_the_reason(
    hubs: Callable[..., McpHub],
) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp?token=s3cret"
    hub = hubs({"web": McpServerConfig(url=url, timeout=1)})
    wait_for(lambda: state(hub, "web") == "down")
    reason = hub.health()["mcp"]["web"]["reason"]
    assert reason and "s3cret" not in reason and "token" not in reason, reason


# -- pins and approval ---------------------------------------------------------------------------


def test_a_changed_tool_is_withheld_until_approved_by_its_digest(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    first = hubs({"mail": stdio(log, shape="1")})
    wait_for(lambda: state(first, "mail") == "up")
    first.close()

    hub = hubs({"mail": stdio(log, shape="2")})  # shifty grew a bcc parameter
    wait_for(lambda: state(hub, "mail") == "up")
    snap = hub.snapshot()
    made = offer(snap.servers, snap.listings, snap.pins, Privacy.OWNER)
    assert "mail_shifty" not in made.tools and "mail_echo" in made.tools
    health = hub.health()["mcp"]["mail"]
    assert health["pin"] == "ok"
    (shifty,) = [t for t in health["tools"] if t["name"] == "shifty"]
    assert shifty["status"] == "withheld" and "changed since it was approved" in shifty["reason"]

    assert hub.approve("nope", None) == {
        "ok": False,
        "error": "no MCP server named 'nope' is configured",
    }
    wrong = hub.approve("mail", "0" * 64)
    assert wrong["ok"] is False and "changed since they were shown" in str(wrong["error"])
    assert hub.snapshot().version == snap.version  # nothing written

    answer = hub.approve("mail", health["digest"])
    assert answer["ok"] is True and answer["changed"] == ["shifty"]
    assert answer["added"] == [] and answer["removed"] == []
    assert answer["tools"] == {"shifty": "Sends the text. Also sends a copy to bcc."}
    assert PinStore(tmp_path / "pins").read("mail") == pin_of("mail", snap.listings["mail"])
    after = hub.snapshot()
    assert after.version > snap.version
    assert "mail_shifty" in offer(after.servers, after.listings, after.pins, Privacy.OWNER).tools


def test_an_unreadable_pin_is_never_overwritten_and_nothing_of_it_is_offered(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    (tmp_path / "pins").mkdir()
    pin_file = tmp_path / "pins" / "files.json"
    pin_file.write_text("{not a pin")
    hub = hubs({"files": stdio(tmp_path / "calls.jsonl")})
    wait_for(lambda: state(hub, "files") == "up")
    health = hub.health()["mcp"]["files"]
    assert health["pin"].startswith("unreadable: ")
    assert all(t["status"] == "withheld" for t in health["tools"])
    snap = hub.snapshot()
    assert snap.pins["files"] is None
    assert offer(snap.servers, snap.listings, snap.pins, Privacy.OWNER).tools == {}
    assert pin_file.read_text() == "{not a pin"
    assert hub.approve("files", health["digest"])["ok"] is True  # the owner's approval replaces it
    assert PinStore(tmp_path / "pins").read("files") is not None


def test_approving_a_server_that_is_down_is_refused(hubs: Callable[..., McpHub]) -> None:
    hub = hubs({"broken": McpServerConfig(command=["/nonexistent/mcp-server"], timeout=1)})
    wait_for(lambda: state(hub, "broken") == "down")
    answer = hub.approve("broken", None)
    assert answer["ok"] is False and "not connected" in str(answer["error"])


# -- reload and close ----------------------------------------------------------------------------


def test_configure_adds_applies_restarts_and_removes(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    hub = hubs({})
    assert hub.health() == {"mcp": {}}
    hub.configure({"files": stdio(log)})
    wait_for(lambda: "files" in hub.snapshot().listings)
    (first,) = pids(log)

    # audiences and timeout: at once, no restart
    version = hub.snapshot().version
    hub.configure({"files": stdio(log, audiences=["owner", "group"], timeout=1.0)})
    snap = hub.snapshot()
    assert snap.version > version and snap.servers["files"].audiences == ["owner", "group"]
    assert "files" in snap.listings
    started = time.monotonic()
    assert hub.call("files", "hang", {"seconds": 60}, budget=100).startswith("error: the tool")
    assert time.monotonic() - started < 3  # the new timeout
    assert pids(log) == {first}

    # env changed: restarted (a new process), the old one ended
    hub.configure({"files": stdio(log, shape="2")})
    wait_for(lambda: "files" in hub.snapshot().listings and len(pids(log)) == 2)
    wait_for(lambda: gone(first))
    (second,) = pids(log) - {first}

    # removed: its listing gone at once, its process ended
    hub.configure({})
    assert hub.snapshot().listings == {} and hub.health() == {"mcp": {}}
    wait_for(lambda: gone(second))
    assert hub.call("files", "echo", {"text": "x"}, budget=10).startswith("error: no MCP server")


def test_close_terminates_every_stdio_server_and_is_idempotent(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    hub = hubs({"a": stdio(logs[0]), "b": stdio(logs[1])})
    wait_for(lambda: len(hub.snapshot().listings) == 2)
    caller = threading.Thread(
        target=hub.call, args=("a", "hang", {"seconds": 60}), kwargs={"budget": 9}
    )
    caller.start()
    wait_for(lambda: any(r["tool"] == "hang" for r in requests(logs[0])))
    children = pids(logs[0]) | pids(logs[1])
    assert len(children) == 2
    started = time.monotonic()
    hub.close()
    caller.join(timeout=10)
    assert not caller.is_alive()
    assert time.monotonic() - started < 10
    assert all(gone(pid) for pid in children), children
    hub.close()
    assert hub.snapshot().listings == {}
    assert hub.call("a", "echo", {"text": "x"}, budget=10).startswith("error: ")


def test_an_http_server_killed_mid_call_fails_the_call_then_comes_back_when_it_does(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    log, port = tmp_path / "http.jsonl", free_port()
    env = {"PATH": os.environ["PATH"], "MCP_TEST_LOG": str(log), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "tests.support.mcp_server", "http", "--port", str(port)]

    def serve() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
        wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0)
        return proc

    proc = serve()
    try:
        hub = hubs({"web": McpServerConfig(url=f"http://127.0.0.1:{port}/mcp", timeout=30)})
        wait_for(lambda: state(hub, "web") == "up")
        result: list[str] = []
        caller = threading.Thread(
            target=lambda: result.append(hub.call("web", "hang", {"seconds": 60}, budget=100))
        )
        started = time.monotonic()
        caller.start()
        wait_for(lambda: any(r["tool"] == "hang" for r in requests(log)))
        proc.kill()
        proc.wait()
        caller.join(timeout=10)
        assert result and result[0].startswith("error: "), result
        assert time.monotonic() - started < 5  # not the 30 s timeout
        text = hub.call("web", "echo", {"text": "x"}, budget=100)
        assert text.startswith("error: "), text
        wait_for(lambda: state(hub, "web") == "down")
        proc = serve()
        wait_for(lambda: state(hub, "web") == "up")
        assert hub.call("web", "echo", {"text": "back"}, budget=100) == "back"
    finally:
        proc.kill()
        proc.wait()


# -- a url server that needs a header (an API key) ------------------------------------------------


def test_a_url_server_behind_a_bearer_token_is_reached_with_its_headers_and_never_without(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    """``headers`` go with every request (the server refuses a request without its token,
    tests/support/mcp_server.py --token); without them the server is down with a reason that
    says so, and the token is in no health fact, reason or result."""
    log = tmp_path / "guarded.jsonl"
    with mcp_http(log, "--token", "t0ps3cret") as (url, _):
        keyed = McpServerConfig(url=url, headers={"Authorization": SecretStr("Bearer t0ps3cret")})
        hub = hubs({"keyed": keyed, "bare": McpServerConfig(url=url)})
        wait_for(lambda: state(hub, "keyed") == "up" and state(hub, "bare") == "down")
        assert hub.call("keyed", "echo", {"text": "in"}, budget=100) == "in"
        assert [r["arguments"] for r in requests(log) if r["method"] == "tools/call"] == [
            {"text": "in"}
        ]
        bare = hub.health()["mcp"]["bare"]
        assert "HTTP error status" in bare["reason"] and "headers" in bare["reason"], bare
        assert "t0ps3cret" not in json.dumps(hub.health())
        assert any(r["method"] == "unauthorized" for r in requests(log))


def test_a_url_server_that_goes_away_while_idle_is_found_down_by_its_ping(
    tmp_path: Path,
) -> None:
    """No call is needed to learn that an HTTP server went away: a quiet one is pinged
    (``ping_every``), found down, and its tools are no longer offered."""
    log, port = tmp_path / "idle.jsonl", free_port()
    env = {"PATH": os.environ["PATH"], "MCP_TEST_LOG": str(log), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "tests.support.mcp_server", "http", "--port", str(port)]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    cfg = McpServerConfig(url=f"http://127.0.0.1:{port}/mcp", timeout=2)
    hub = McpHub({"web": cfg}, PinStore(tmp_path / "pins"), backoff=FAST, ping_every=0.3)
    try:
        wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0)
        hub.start()
        wait_for(lambda: state(hub, "web") == "up")
        time.sleep(1.0)  # quiet: pinged and answered, still up
        assert state(hub, "web") == "up"
        assert any(r["method"] == "ping" for r in requests(log))
        proc.kill()
        proc.wait()
        wait_for(lambda: state(hub, "web") == "down", timeout=10)
        assert "web" not in hub.snapshot().listings
    finally:
        hub.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_broken_answer_is_said_to_be_one_and_bytes_not_utf8_are_replaced(
    hubs: Callable[..., McpHub],
) -> None:
    """A server up and listed whose answer is JSON cut short (the client cannot match it to its
    call): the call ends at its timeout with an error that says the server wrote something
    that is not MCP, and the session goes on. An answer whose text holds bytes that are not
    UTF-8 is read with U+FFFD in their place, and later calls are still answered (the SDK's
    strict decoding used to stop reading the server for good)."""
    script = str(REPO / "tests" / "support" / "mcp_raw.py")
    hub = hubs(
        {
            "cut": McpServerConfig(command=[sys.executable, script, "cut"], timeout=1),
            "bytes": McpServerConfig(command=[sys.executable, script, "bytes"], timeout=2),
        }
    )
    wait_for(lambda: state(hub, "cut") == "up" and state(hub, "bytes") == "up")
    text = hub.call("cut", "t", {}, budget=100)
    assert text.startswith("error: no answer within 1 s") and "not MCP" in text, text
    assert state(hub, "cut") == "up"
    for _ in range(2):
        assert hub.call("bytes", "t", {}, budget=100) == "\ufffd\ufffd broken"


def test_a_stopping_worker_gives_up_its_calls_at_once(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    """``stopping()`` (the worker's first SIGTERM: worker/consumer.py ``on_stop``): a call
    hanging for a 100 s timeout ends now with an error result, and no new call is made."""
    log = tmp_path / "calls.jsonl"
    hub = hubs({"files": stdio(log, timeout=100)})
    hub.wait_ready(30)
    assert state(hub, "files") == "up"
    result: list[str] = []
    caller = threading.Thread(
        target=lambda: result.append(hub.call("files", "hang", {}, budget=100))
    )
    caller.start()
    wait_for(lambda: any(r["tool"] == "hang" for r in requests(log)))
    started = time.monotonic()
    hub.stopping()
    caller.join(timeout=5)
    assert time.monotonic() - started < 2
    assert result == ["error: the worker is stopping; the call was given up"]
    calls = len([r for r in requests(log) if r["method"] == "tools/call"])
    after = hub.call("files", "echo", {"text": "x"}, budget=100)
    assert after == "error: the worker is stopping; the call was not made"
    assert len([r for r in requests(log) if r["method"] == "tools/call"]) == calls


def test_wait_ready_waits_for_the_first_word_of_each_server_and_no_longer(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    hub = hubs({"files": stdio(tmp_path / "c.jsonl"),
                "gone": McpServerConfig(command=["/nonexistent/srv"])})  # fmt: skip
    started = time.monotonic()
    hub.wait_ready(30)
    assert time.monotonic() - started < 25
    assert (state(hub, "files"), state(hub, "gone")) == ("up", "down")
    assert "files" in hub.snapshot().listings
    hung = hubs(
        {"never": McpServerConfig(command=[sys.executable, "-c", "import time; time.sleep(60)"])}
    )
    started = time.monotonic()
    hung.wait_ready(0.5)  # a server that never answers: given up on after the wait
    assert 0.4 < time.monotonic() - started < 3 and state(hung, "never") == "starting"
    stopped = time.monotonic()
    hung.wait_ready(30, stop=lambda: True)  # the worker told to stop: no wait
    assert time.monotonic() - stopped < 0.5


def test_a_url_server_that_answers_ping_with_an_error_is_alive(tmp_path: Path) -> None:
    """A server without ``ping`` answers it "method not found": it answered, so it is up (it
    used to be taken for gone every 30 s, its tools withdrawn for a moment each time)."""
    log, port = tmp_path / "noping.jsonl", free_port()
    env = {"PATH": os.environ["PATH"], "MCP_TEST_LOG": str(log), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "tests.support.mcp_raw_http", str(port)]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    cfg = McpServerConfig(url=f"http://127.0.0.1:{port}/mcp", timeout=2)
    hub = McpHub({"old": cfg}, PinStore(tmp_path / "pins"), backoff=FAST, ping_every=0.2)
    try:
        wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0)
        hub.start().wait_ready(20)
        assert state(hub, "old") == "up"
        since = hub.health()["mcp"]["old"]["since"]
        wait_for(lambda: sum(r["method"] == "ping" for r in requests(log)) >= 4)
        assert state(hub, "old") == "up" and hub.health()["mcp"]["old"]["since"] == since
        assert sum(r["method"] == "initialize" for r in requests(log)) == 1
        assert hub.call("old", "t", {}, budget=100) == "ok"
    finally:
        hub.close()
        proc.kill()
        proc.wait(timeout=10)


def test_a_server_that_says_its_tools_changed_in_a_loop_is_listed_once_a_second(
    hubs: Callable[..., McpHub], tmp_path: Path
) -> None:
    """``tools/list_changed`` after every listing (a storm): at most one listing a second, and
    nothing logged or published while the listing stays the same (it used to relist thousands
    of times a second, a log line each)."""
    log = tmp_path / "storm.jsonl"
    script = str(REPO / "tests" / "support" / "mcp_raw.py")
    cfg = McpServerConfig(command=[sys.executable, script, "storm"],
                          env={"MCP_TEST_LOG": SecretStr(str(log))})  # fmt: skip
    hub = hubs({"storm": cfg})
    hub.wait_ready(20)
    version = hub.snapshot().version
    time.sleep(3)
    listings = sum(r["method"] == "tools/list" for r in requests(log))
    assert 2 <= listings <= 6, listings
    assert hub.snapshot().version == version  # the same listing: no new snapshot
    assert state(hub, "storm") == "up" and hub.call("storm", "t", {}, budget=100) == "ok"
