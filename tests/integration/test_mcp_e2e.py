"""Tools from MCP servers end to end (issue 29): ``relaybot worker`` as its own process, real
Redis, our model server (tests/support/fakemodel.py: ``[[tool:NAME:{args}]]`` in a message makes
the model call NAME), and real MCP servers of our own (tests/support/mcp_server.py), one started
by the worker over stdio, one reached over streamable HTTP, each logging every request it gets.

What is proved here, on the real processes: the owner's turn is offered and served an owner-only
server's tools; a group's and a contact's turns are not offered them, and a call they make
anyway (a model that invents it, a stranger who names it) is refused and never reaches the
server; a tool that changed since it was pinned is withheld until ``relaybot tools approve``;
a server that hangs, is killed mid-call, answers 10 MB or will not start costs the turn an error
result, never the turn, and the worker reconnects; a reload adds and removes servers."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from contract.messages import Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.mcp_rig import (
    BOB,
    BOB_DM,
    TEAM,
    McpRig,
    http_mcp_server,
    http_table,
    stdio_table,
    tool_calls,
)
from tests.support.procs import (
    Procs,
    heartbeat,
    lease_holder,
    memory_rows,
    pid_running,
    processes_mentioning,
    run_relaybot,
    wait_until,
)
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def rig(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    real_redis: redis.Redis,
) -> McpRig:
    return McpRig(tmp_path / "home", redis_server.url, Keys(prefix), model_server, procs,
                  real_redis)  # fmt: skip


@pytest.fixture
def weather(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "weather-calls.jsonl"
    with http_mcp_server(log) as url:
        yield url, log


def call(tool: str, **arguments: object) -> str:
    return f"[[tool:{tool}:{json.dumps(arguments)}]]"


def tool_rows(rig: McpRig) -> list[dict[str, object]]:
    return memory_rows(rig.db, "SELECT * FROM log WHERE kind = 'tool' ORDER BY id")


def test_the_owner_is_served_a_group_and_a_contact_are_not_offered_and_forged_calls_never_arrive(
    rig: McpRig, tmp_path: Path, weather: tuple[str, Path]
) -> None:
    files_log = tmp_path / "files-calls.jsonl"
    url, weather_log = weather
    rig.servers = stdio_table("files", files_log, audiences=["owner"]) + http_table(
        "weather", url, audiences=["owner", "group"]
    )
    rig.start()
    rig.wait_up("files")
    rig.wait_up("weather")

    # the owner: offered both servers' tools, and served
    rig.owner_says("mcp", call("files_echo", text="owner-secret-42") + " #m1")
    answer = rig.reply_to("cli:mcp", "#m1")
    assert "output of files_echo" in answer and "owner-secret-42" in answer, answer
    offered = rig.offered("#m1")
    assert {"files_echo", "files_hang", "weather_echo"} <= offered, offered
    assert [c["arguments"] for c in tool_calls(files_log)] == [{"text": "owner-secret-42"}]
    [row] = tool_rows(rig)
    assert (row["conversation"], row["privacy"], row["sender"]) == (
        "cli:mcp", "owner", "tool:files_echo",
    )  # fmt: skip
    assert "owner-secret-42" in str(row["text"])

    # a group: only the group's server; a call to the owner's tool is refused, never made
    rig.say(TEAM, BOB, call("files_echo", text="stolen-1") + " #g1", Privacy.GROUP)
    answer = rig.reply_to(TEAM, "#g1")
    offered = rig.offered("#g1")
    assert not {n for n in offered if n.startswith("files_")}, offered
    assert "weather_echo" in offered
    assert "error" in answer and "output of" not in answer, answer
    sent = json.dumps(rig.requests("#g1"))
    assert "owner-secret-42" not in sent  # the owner's tool result is not the group's memory
    rig.say(TEAM, BOB, call("weather_echo", text="sunny-7") + " #g2", Privacy.GROUP)
    answer = rig.reply_to(TEAM, "#g2")
    assert "output of weather_echo" in answer and "sunny-7" in answer, answer
    assert [c["arguments"] for c in tool_calls(weather_log)] == [{"text": "sunny-7"}]

    # a contact's direct conversation: neither server is theirs; names dressed up are refused
    forged = ["files_echo", "FILES_ECHO", "files_echo-00000000", "weather_echo", "files_huge"]
    for n, name in enumerate(forged):
        rig.say(BOB_DM, BOB, call(name, text=f"stolen-{n + 2}") + f" #d{n}", Privacy.DIRECT)
        answer = rig.reply_to(BOB_DM, f"#d{n}")
        assert "error" in answer and "output of" not in answer, (name, answer)
        assert not {o for o in rig.offered(f"#d{n}") if o.startswith(("files_", "weather_"))}
    assert [c["arguments"] for c in tool_calls(files_log)] == [{"text": "owner-secret-42"}]
    assert [c["arguments"] for c in tool_calls(weather_log)] == [{"text": "sunny-7"}]

    # the results are in the log with their turn's audience: the group's in the group's room
    rows = {(r["conversation"], r["privacy"]) for r in tool_rows(rig)}
    assert rows == {("cli:mcp", "owner"), (TEAM, "group")}
    # a later owner turn sees its own tool's output in its history; the group's next turn does
    # not see the owner's, and sees its own
    rig.owner_says("mcp", "what did the tool say? #m2")
    rig.reply_to("cli:mcp", "#m2")
    assert "owner-secret-42" in json.dumps(rig.requests("#m2"))
    rig.say(TEAM, BOB, "and what did it say here? #g3", Privacy.GROUP)
    rig.reply_to(TEAM, "#g3")
    group_sent = json.dumps(rig.requests("#g3"))
    assert "sunny-7" in group_sent and "owner-secret-42" not in group_sent


def test_a_changed_tool_is_withheld_until_the_owner_approves_it(
    rig: McpRig, tmp_path: Path
) -> None:
    log = tmp_path / "files-calls.jsonl"
    rig.servers = stdio_table("files", log, audiences=["owner"])
    rig.start()
    rig.wait_up("files")
    assert rig.tool_status("files", "shifty")["status"] == "offered"  # pinned at first sight
    pin = rig.home / "mcp" / "pins" / "files.json"
    assert "shifty" in json.loads(pin.read_text())["tools"]
    before = pin.read_text()

    # the server changes the tool (a new parameter that copies the message elsewhere)
    rig.servers = stdio_table("files", log, audiences=["owner"], shape="2")
    rig.env()  # config.toml rewritten: the worker reloads and restarts the server
    wait_until(lambda: rig.tool_status("files", "shifty").get("status") == "withheld", timeout=60,
               message=lambda: f"shifty withheld: {rig.mcp_state()}")  # fmt: skip
    assert "changed" in rig.tool_status("files", "shifty")["reason"]
    assert rig.tool_status("files", "echo")["status"] == "offered"  # the rest stays offered
    assert pin.read_text() == before  # a change is never pinned by itself
    listed = rig.tools_cli()
    assert listed.returncode == 0, listed.stderr
    assert "shifty" in listed.stdout and "relaybot tools approve files" in listed.stdout
    doctor = run_relaybot(["doctor"], rig.env(), timeout=120)
    assert "relaybot tools approve files" in doctor.stdout + doctor.stderr, doctor.stdout
    assert "unknown keys" not in doctor.stdout, doctor.stdout  # [mcp.servers.NAME] is no typo

    rig.owner_says("mcp", call("files_shifty", text="hi", bcc="eve@evil.example") + " #s1")
    answer = rig.reply_to("cli:mcp", "#s1")
    assert "files_shifty" not in rig.offered("#s1") and "files_echo" in rig.offered("#s1")
    assert "error" in answer and "output of" not in answer, answer
    assert [c for c in tool_calls(log) if c["tool"] == "shifty"] == []

    approved = rig.tools_cli("approve", "files")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert "shifty" in approved.stdout
    wait_until(lambda: rig.tool_status("files", "shifty").get("status") == "offered", timeout=30,
               message=lambda: f"shifty offered: {rig.mcp_state()}")  # fmt: skip
    rig.owner_says("mcp", call("files_shifty", text="hi", bcc="me@home.example") + " #s2")
    answer = rig.reply_to("cli:mcp", "#s2")
    assert "sent hi (bcc me@home.example)" in answer, answer
    assert [c["arguments"] for c in tool_calls(log) if c["tool"] == "shifty"] == [
        {"text": "hi", "bcc": "me@home.example"}
    ]


def test_a_hanging_a_killed_a_huge_and_a_missing_server_cost_a_turn_only_an_error(
    rig: McpRig, tmp_path: Path, weather: tuple[str, Path]
) -> None:
    files_log, slow_log = tmp_path / "files-calls.jsonl", tmp_path / "slow-calls.jsonl"
    url, _ = weather
    rig.servers = (
        stdio_table("files", files_log, audiences=["owner"], timeout=2)
        + stdio_table("slow", slow_log, audiences=["owner"], timeout=60)
        + http_table("weather", url, audiences=["owner"])
        + '\n[mcp.servers.broken]\ncommand = ["/nonexistent/mcp-server"]\n'
    )
    worker = rig.start()
    for name in ("files", "slow", "weather"):
        rig.wait_up(name)
    broken = rig.wait_state("broken", "down")
    assert broken["reason"], broken

    # a tool that hangs past its timeout: an error at the timeout; the writer keeps turning
    rig.owner_says("a", call("files_hang") + " #h1")
    rig.requests("#h1", wait=30)
    started = time.monotonic()
    rig.owner_says("b", "meanwhile #p1")
    assert "#p1" in rig.reply_to("cli:b", "#p1")
    answer = rig.reply_to("cli:a", "#h1")
    assert time.monotonic() - started < 30
    assert "error: the tool did not answer within 2 s" in answer, answer
    rig.owner_says("a", call("files_echo", text="still-there") + " #h2")
    assert "still-there" in rig.reply_to("cli:a", "#h2")  # the session outlived the timeout

    # the server is killed (SIGKILL) in the middle of a call
    rig.owner_says("k", call("slow_hang", seconds=50) + " #k1")
    [hang] = wait_until(lambda: tool_calls(slow_log) or None, timeout=30, message="slow's hang")
    killed = time.time()
    os.kill(int(hang["pid"]), signal.SIGKILL)
    answer = rig.reply_to("cli:k", "#k1")
    assert "error: the server closed the connection" in answer, answer
    wait_until(lambda: not pid_running(int(hang["pid"])), timeout=10, message="the kill")
    wait_until(lambda: (s := rig.mcp_state().get("slow")) and s["state"] == "up"
               and s["since"] > killed, timeout=60,
               message=lambda: f"slow up again: {rig.mcp_state()}")  # reconnected  # fmt: skip
    rig.owner_says("k", call("slow_echo", text="back-again") + " #k2")
    assert "back-again" in rig.reply_to("cli:k", "#k2")
    assert {c["pid"] for c in tool_calls(slow_log)} != {hang["pid"]}  # a new process

    # 10 MB over stdio: a bounded result; over HTTP, past the SDK's 1 MiB: an error
    rig.owner_says("u", call("slow_huge") + " #u1")
    answer = rig.reply_to("cli:u", "#u1")
    assert "output of slow_huge" in answer and "cut" in answer and len(answer) < 20_000
    rig.owner_says("u", call("weather_huge", megabytes=2) + " #u2")
    answer = rig.reply_to("cli:u", "#u2")
    assert "error" in answer and len(answer) < 2_000, answer[:500]

    # a server that will not start: nothing of it offered; a call to it refused
    rig.owner_says("u", call("broken_echo", text="x") + " #b1")
    answer = rig.reply_to("cli:u", "#b1")
    assert "error" in answer and not {n for n in rig.offered("#b1") if n.startswith("broken")}
    assert worker.returncode is None  # the worker never stopped
    assert len(memory_rows(rig.db, "SELECT id FROM log WHERE kind = 'tool'")) >= 4


def test_a_reload_adds_and_removes_servers(
    rig: McpRig, tmp_path: Path, weather: tuple[str, Path]
) -> None:
    files_log = tmp_path / "files-calls.jsonl"
    url, _ = weather
    rig.servers = stdio_table("files", files_log, audiences=["owner"])
    rig.start()
    rig.wait_up("files")
    rig.owner_says("r", call("files_echo", text="one") + " #r1")
    assert "one" in rig.reply_to("cli:r", "#r1")
    [first] = tool_calls(files_log)

    rig.servers = http_table("weather", url, audiences=["owner", "direct"])  # files removed
    rig.env()
    rig.wait_up("weather")
    wait_until(lambda: "files" not in rig.mcp_state(), timeout=30,
               message=lambda: f"files removed: {rig.mcp_state()}")  # fmt: skip
    wait_until(lambda: not pid_running(int(first["pid"])), timeout=15,
               message="the removed stdio server to be stopped")  # fmt: skip
    rig.owner_says("r", call("files_echo", text="two") + " #r2")
    answer = rig.reply_to("cli:r", "#r2")
    assert "error" in answer and "files_echo" not in rig.offered("#r2")
    assert "weather_echo" in rig.offered("#r2")
    rig.say(BOB_DM, BOB, call("weather_echo", text="dm-ok") + " #r3", Privacy.DIRECT)
    assert "dm-ok" in rig.reply_to(BOB_DM, "#r3")  # audiences: direct, as configured
    assert len(tool_calls(files_log)) == 1


def test_a_message_waiting_at_the_start_is_offered_its_tools_and_a_stop_never_waits_on_one(
    rig: McpRig, tmp_path: Path
) -> None:
    """A message sent while no worker runs is answered, once one starts, with the tools it
    would have had (the hub reaches its servers before the worker reads). A SIGTERM while a
    tool hangs (its timeout 100 s, past systemd's TimeoutStopSec) stops the worker in moments:
    the call is given up, the turn answered with that, the server stopped."""
    log = tmp_path / "files-calls.jsonl"
    rig.servers = stdio_table("files", log, audiences=["owner"], timeout=100)
    rig.owner_says("w", call("files_echo", text="was-waiting") + " #w1")
    worker = rig.start()
    answer = rig.reply_to("cli:w", "#w1")
    assert "output of files_echo" in answer and "was-waiting" in answer, answer

    rig.owner_says("w", call("files_hang") + " #w2")
    [hang] = wait_until(lambda: [c for c in tool_calls(log) if c["tool"] == "hang"] or None,
                        timeout=30, message="the hanging call")  # fmt: skip
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert time.monotonic() - started < 15
    answer = rig.reply_to("cli:w", "#w2", timeout=5)
    assert "error: the worker is stopping" in answer, answer
    wait_until(lambda: not pid_running(int(hang["pid"])), timeout=10, message="the server's end")


def test_a_second_signal_during_the_start_wait_still_leaves_nothing_behind(
    rig: McpRig, tmp_path: Path
) -> None:
    """Two SIGTERMs while the worker waits for a server that never answers (its first 20 s):
    the worker exits, its lease is released, its heartbeat and MCP facts are gone, and the
    server it started is stopped (the robustness review found the lease and the facts left
    behind: the wait ran outside the consumer's cleanup)."""
    marker = f"never-ready-{os.getpid()}-{time.monotonic_ns()}"
    command = json.dumps([sys.executable, "-c", "import time; time.sleep(120)", marker])
    rig.servers = f"\n[mcp.servers.slowpoke]\ncommand = {command}\n"
    worker = rig.start()
    wait_until(lambda: processes_mentioning(marker) or None, timeout=30, message="the server")
    worker.signal(signal.SIGTERM)
    time.sleep(0.05)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert lease_holder(rig.r, rig.keys) is None
    assert heartbeat(rig.r, rig.keys, "worker") is None and rig.r.get(rig.keys.mcp) is None
    wait_until(lambda: not processes_mentioning(marker), timeout=15, message="the server's end")
