"""The model client against our fake OpenAI-compatible server, over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from contract.config import ModelConfig
from tests.support.fakemodel import FakeModelServer
from worker.agent import run_turn
from worker.model import ModelError, NoModel
from worker.openai_client import OpenAIChatClient, make_model
from worker.tools import default_tools

KEY = "sk-test-7f3a9c1e5b2d"
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 0.3
BACKOFF = 0.01


def user(text: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a test."},
        {"role": "user", "content": text},
    ]


@pytest.fixture
def server():
    with FakeModelServer() as srv:
        yield srv


@pytest.fixture
def client(server):
    cfg = ModelConfig(
        base_url=server.base_url + "/",
        model="fake-model",
        api_key=KEY,
        timeout=TIMEOUT,
        retries=2,
        backoff=BACKOFF,
    )
    model = OpenAIChatClient.from_config(cfg)
    yield model
    model.close()


def test_echo(server, client):
    completion = client.complete(user("[cli / owner] 2025-01-01 10:00: hello there"), [])
    assert completion.content == "echo: [cli / owner] 2025-01-01 10:00: hello there"
    assert completion.tool_calls == []
    assert completion.finish_reason == "stop"
    assert server.calls == 1
    body = server.requests[0]
    assert body["model"] == "fake-model"
    assert body["messages"] == user("[cli / owner] 2025-01-01 10:00: hello there")
    assert "tools" not in body
    assert "tool_choice" not in body
    assert "temperature" not in body


def test_temperature_and_tools_are_sent(server):
    with OpenAIChatClient(
        base_url=server.base_url, model="m", temperature=0.2, timeout=TIMEOUT
    ) as model:
        model.complete(user("hi"), default_tools().specs())
    body = server.requests[0]
    assert body["temperature"] == 0.2
    assert body["tool_choice"] == "auto"
    assert body["tools"][0]["function"]["name"] == "clock"
    assert server.authorizations == [None]  # no key, no Authorization header


def test_keep_alive_reuses_the_connection(server, client):
    for i in range(3):
        client.complete(user(f"ping {i}"), [])
    assert server.calls == 3
    assert len(set(server.peer_ports)) == 1  # one pooled connection served all three


def test_tool_call_round_trip_through_run_turn(server, client):
    result = run_turn(
        client, user("what time is it? [[tool:clock]]"), default_tools(), max_rounds=3
    )
    assert not result.error
    assert result.rounds == 2
    assert result.tool_calls == 1
    assert result.text.startswith("clock said: ")
    stamp = result.text.removeprefix("clock said: ").split(" ")[0]
    assert stamp.endswith("+00:00")
    first, second = server.requests
    assert first["tool_choice"] == "auto"
    assistant, tool = second["messages"][-2:]
    assert assistant["role"] == "assistant"
    call = assistant["tool_calls"][0]
    assert call["function"]["name"] == "clock"
    assert tool["role"] == "tool"
    assert tool["tool_call_id"] == call["id"]


def test_tool_arguments_reach_the_tool(server, client):
    result = run_turn(
        client,
        user('[[tool:clock:{"timezone": "Asia/Tokyo"}]]'),
        default_tools(),
        max_rounds=3,
    )
    assert "+09:00 (" in result.text
    assert "Asia/Tokyo" in result.text


def test_delay_beyond_timeout_is_retried_then_fails_in_bounded_time(server, client):
    started = time.monotonic()
    with pytest.raises(ModelError) as info:
        client.complete(user("slow [[delay:2]]"), [])
    elapsed = time.monotonic() - started
    assert server.calls == 3  # 1 + 2 retries
    assert elapsed >= 3 * TIMEOUT
    assert elapsed <= client.deadline + 0.3
    message = str(info.value)
    assert message == (
        f"the model at {server.base_url} timed out after 3 attempts ({TIMEOUT:g} s each)"
    )
    assert info.value.kind == "timeout"
    assert info.value.attempts == 3


def test_a_server_dribbling_bytes_cannot_stretch_an_attempt(server):
    # each read is quick (0.1 s apart), but the whole body takes ~1 s
    with OpenAIChatClient(
        base_url=server.base_url, model="m", timeout=TIMEOUT, retries=1, backoff=BACKOFF
    ) as model:
        started = time.monotonic()
        with pytest.raises(ModelError, match="timed out after 2 attempts"):
            model.complete(user("[[dribble:0.1]]"), [])
        assert time.monotonic() - started <= model.deadline + 0.3


def test_overall_deadline_formula():
    model = OpenAIChatClient(
        base_url="http://127.0.0.1:9/v1", model="m", timeout=2, retries=3, backoff=1
    )
    # 4 attempts of 2 s, plus waits of at most 1, 2 and 4 s stretched by the jitter (25 %)
    assert model.deadline == pytest.approx(4 * 2 + (1 + 2 + 4) * 1.25)
    model.close()


def test_flaky_500_is_retried(server, client):
    completion = client.complete(user("[[flaky:2]] try again"), [])
    assert completion.content == "echo: [[flaky:2]] try again"
    assert server.calls == 3


def test_429_honours_retry_after(server):
    with OpenAIChatClient(
        base_url=server.base_url, model="m", timeout=TIMEOUT, retries=1, backoff=BACKOFF
    ) as model:
        started = time.monotonic()
        with pytest.raises(ModelError, match=r"rate limiting requests \(HTTP 429") as info:
            model.complete(user("[[status:429]][[retry-after:0.4]]"), [])
        assert time.monotonic() - started >= 0.4
    assert info.value.status == 429
    assert server.calls == 2


def test_400_is_not_retried(server, client):
    with pytest.raises(ModelError) as info:
        client.complete(user("[[status:400]]"), [])
    assert server.calls == 1
    assert info.value.status == 400
    assert not info.value.retryable
    assert str(info.value) == (
        f"the model at {server.base_url} refused the request (HTTP 400: scripted status 400)"
    )


def test_401_hints_at_the_key(server, client):
    with pytest.raises(ModelError, match="check the API key") as info:
        client.complete(user("[[status:401]]"), [])
    assert server.calls == 1
    assert KEY not in str(info.value)


def test_503_is_retried_then_fails(server, client):
    with pytest.raises(ModelError, match=r"failed \(HTTP 503: scripted status 503\), after 3"):
        client.complete(user("[[status:503]]"), [])
    assert server.calls == 3


def test_garbage_is_retried_then_a_clear_error(server, client):
    with pytest.raises(ModelError) as info:
        client.complete(user("[[garbage]]"), [])
    assert server.calls == 3
    assert info.value.kind == "garbage"
    assert str(info.value) == (
        f"the model at {server.base_url} returned an unusable response "
        "(the body is not JSON), after 3 attempts"
    )


def test_tool_arguments_that_are_not_json_are_retried(server, client):
    with pytest.raises(ModelError, match="arguments of tool call 'clock' are not JSON"):
        client.complete(user("[[badargs]]"), default_tools().specs())
    assert server.calls == 3


def test_loop_is_bounded_by_max_rounds(server, client):
    result = run_turn(client, user("[[loop]]"), default_tools(), max_rounds=2)
    assert server.calls == 3  # two rounds with tools, one final request without
    assert "tools" in server.requests[0]
    assert "tools" in server.requests[1]
    assert "tools" not in server.requests[2]
    assert result.error
    assert result.rounds == 3
    assert result.tool_calls == 2
    assert "stopped after 2 rounds of tool use" in result.text


def test_model_error_becomes_a_reply_in_run_turn(server, client):
    result = run_turn(client, user("[[status:500]]"), default_tools(), max_rounds=3)
    assert result.error
    assert result.text.startswith("Sorry — I could not reach the model: the model ")
    assert "HTTP 500" in result.text
    assert "127.0.0.1" not in result.text  # the reply may go to anyone: no endpoint address


def test_the_endpoint_address_and_a_key_in_its_query_reach_neither_the_reply_nor_the_log(
    server: FakeModelServer,
) -> None:
    """Found by the adversarial review: a stranger's message in a group room got 'the model at
    http://10.255.255.1:8443/v1?key=sk-...' back, and the key was in the worker's log twice."""
    host_port = server.base_url.split("//", 1)[1].split("/", 1)[0]
    url = f"http://admin:hunter2@{host_port}/v1?key=sk-querysecret123#frag"
    c = OpenAIChatClient(base_url=url, model="test-model", timeout=5, retries=0)
    with capture_logs() as logged:
        result = run_turn(c, user("[[status:404]]"), default_tools(), max_rounds=1)
    assert result.error
    assert result.text.startswith("Sorry — I could not reach the model: the model ")
    for secret in ("sk-querysecret123", "hunter2", "admin", host_port):
        assert secret not in result.text
    lines = json.dumps(logged, default=str)
    assert host_port in lines  # the operator's log names the endpoint ...
    for secret in ("sk-querysecret123", "hunter2", "frag"):
        assert secret not in lines  # ... without its secrets


def test_connection_refused_is_retried_then_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens here once the socket is closed
    with (
        OpenAIChatClient(
            base_url=f"http://127.0.0.1:{port}/v1",
            model="m",
            timeout=TIMEOUT,
            retries=2,
            backoff=BACKOFF,
        ) as model,
        pytest.raises(ModelError) as info,
    ):
        model.complete(user("hi"), [])
    assert info.value.kind == "connect"
    assert info.value.attempts == 3
    assert str(info.value).startswith(f"the model at http://127.0.0.1:{port}/v1 could not be")


def test_api_key_is_sent_as_bearer_and_never_logged(server, client):
    secret_text = "my very private message"
    with capture_logs() as logs:
        client.complete(user(secret_text), [])
        with pytest.raises(ModelError) as info:
            client.complete(user("[[status:401]]"), [])
        with pytest.raises(ModelError):
            client.complete(user("[[garbage]]"), [])
        run_turn(client, user("[[tool:clock]]"), default_tools(), max_rounds=2)
    assert server.authorizations[0] == f"Bearer {KEY}"
    assert all(auth == f"Bearer {KEY}" for auth in server.authorizations)
    assert logs, "the client logs its attempts"
    events = {entry["event"] for entry in logs}
    assert {"model.request", "model.response", "model.attempt_failed"} <= events
    dumped = json.dumps(logs, default=str)
    assert KEY not in dumped
    assert secret_text not in dumped
    assert KEY not in str(info.value)
    assert KEY not in repr(client)
    response = next(e for e in logs if e["event"] == "model.response")
    assert response["status"] == 200
    assert isinstance(response["latency_ms"], int)


def test_a_key_echoed_by_the_server_is_redacted():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"message": f"Incorrect API key: {KEY}"}})

    model = OpenAIChatClient(
        base_url="http://model.invalid/v1",
        model="m",
        api_key=KEY,
        timeout=TIMEOUT,
        transport=httpx.MockTransport(handler),
    )
    with capture_logs() as logs, pytest.raises(ModelError) as info:
        model.complete(user("hi"), [])
    assert "Incorrect API key: ***" in str(info.value)
    assert KEY not in str(info.value)
    assert KEY not in json.dumps(logs, default=str)


@pytest.mark.parametrize("status", [400, 500])
def test_a_request_echoed_in_an_error_is_not_shown_or_logged(status):
    """A server that quotes the prompt in its error (validation errors often do): the message's
    text reaches no log line and no error reply (an erasure could not reach a log line); the
    status still shows."""
    secret = "my passport number is QX-55-31"

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        quoted = json.dumps(body["messages"])[:150]
        return httpx.Response(status, json={"error": {"message": f"invalid input: {quoted}"}})

    model = OpenAIChatClient(
        base_url="http://model.invalid/v1",
        model="m",
        timeout=TIMEOUT,
        retries=1,
        backoff=0.01,
        transport=httpx.MockTransport(handler),
    )
    with capture_logs() as logs, pytest.raises(ModelError) as info:
        model.complete(user(secret), [])
    assert f"HTTP {status}" in str(info.value)
    assert "repeats part of the request" in str(info.value)
    assert "QX-55-31" not in str(info.value)
    assert "QX-55-31" not in json.dumps(logs, default=str)


def test_credentials_in_base_url_are_not_shown():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="down")

    model = OpenAIChatClient(
        base_url="http://user:hunter2@model.invalid/v1",
        model="m",
        retries=0,
        timeout=TIMEOUT,
        transport=httpx.MockTransport(handler),
    )
    with pytest.raises(ModelError) as info:
        model.complete(user("hi"), [])
    assert "hunter2" not in str(info.value)
    assert "model.invalid" in str(info.value)


def test_no_model_text():
    model = make_model(ModelConfig())
    assert isinstance(model, NoModel)
    completion = model.complete(user("echo me please"), [])
    assert completion.content is not None
    assert completion.content.startswith("No model is configured")
    for hint in ("config.toml", "[model]", "base_url", "model", "api_key"):
        assert hint in completion.content
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "RELAYBOT_MODEL"):
        assert var in completion.content
    assert "echo me please" not in completion.content
    assert completion.tool_calls == []


def test_make_model_builds_the_client(server):
    model = make_model(ModelConfig(base_url=server.base_url, model="fake-model"))
    assert isinstance(model, OpenAIChatClient)
    assert model.name == "fake-model"
    assert model.complete(user("hi"), []).content == "echo: hi"
    model.close()


def test_models_endpoint(server):
    response = httpx.get(f"{server.base_url}/models", timeout=2)
    assert response.status_code == 200
    assert response.json()["data"][0]["id"] == "fake-model"


def test_fake_server_runs_as_a_process(tmp_path):
    port_file = tmp_path / "port"
    log_file = tmp_path / "requests.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.fakemodel",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--log",
            str(log_file),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert proc.poll() is None, "the fake model server exited early"
            assert time.monotonic() < deadline, "no port file after 10 s"
            time.sleep(0.02)
        port = int(port_file.read_text())
        with OpenAIChatClient(
            base_url=f"http://127.0.0.1:{port}/v1", model="fake-model", api_key=KEY
        ) as model:
            assert model.complete(user("across processes"), []).content == (
                "echo: across processes"
            )
            assert model.complete(user("[[flaky:1]] x"), []).content == "echo: [[flaky:1]] x"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert len(lines) == 3
    assert lines[0]["path"] == "/v1/chat/completions"
    assert lines[0]["authorization"] == f"Bearer {KEY}"
    assert lines[0]["body"]["messages"][-1]["content"] == "across processes"


def test_an_echoed_secret_is_masked_in_any_case_and_as_basic_auth() -> None:
    """Adversary round 2: a server echoed 'BEARER SK-...' and 'Basic <base64 user:password>'."""
    import base64

    from worker.openai_parse import mask, url_secrets

    secrets = [*url_secrets("http://admin:hunter2pw@h:1/v1?key=sk-querysecret"), "sk-apikey42"]
    basic = base64.b64encode(b"admin:hunter2pw").decode()
    echoed = f"HTTP 502: rejected BEARER SK-APIKEY42, Basic {basic}, /v1?KEY=SK-QUERYSECRET"
    shown = mask(echoed, secrets)
    for secret in ("SK-APIKEY42", basic, "SK-QUERYSECRET", "hunter2pw"):
        assert secret.casefold() not in shown.casefold()
    assert shown.startswith("HTTP 502: rejected BEARER ***")
