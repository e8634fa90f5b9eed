"""A small OpenAI-compatible chat-completions server for tests (stdlib only).

Use it in-process::

    with FakeModelServer() as server:
        client = OpenAIChatClient(base_url=server.base_url, model="fake-model")
        ...
        server.requests   # the JSON bodies received by POST /v1/chat/completions
        server.calls      # how many such POSTs arrived (including failed ones)

or as its own process (from the repository root, so that ``tests`` is importable)::

    python -m tests.support.fakemodel --port 0 --port-file PATH [--log PATH]

which writes the port it listens on to PATH (atomically, then serves until SIGTERM/SIGINT) and,
with ``--log``, appends one JSON line per chat request: ``{"path", "authorization", "body"}``.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``.

``FakeModelServer(models=[...])`` lists those models at ``/v1/models`` (default: its one model);
with ``known_models_only=True`` a completion asking for a model not listed is answered 404
(``model_not_found``), as Ollama and hosted APIs do; with ``api_key="..."`` every request needs
``Authorization: Bearer <that key>`` (else 401); with ``query_key="..."`` every request needs
``?key=<that key>`` in its URL (else 401: a gateway that takes the key in the query string;
its message is ``refusal`` with ``{path}`` the request's path and query and ``{value}`` the
key's value, both as sent: servers echo them).
Every request's path, query included, is kept in ``server.paths`` (``"GET /v1/models?key=.."``).

Behaviour is scripted by directives in the content of the LAST ``role: user`` message (so it
works across processes). ``TEXT`` below is that whole content, unchanged — including any
``[cli / owner] <timestamp>: `` label and the directives themselves. Directives combine; they
are applied in this order:

- ``[[delay:SECONDS]]`` — sleep that long (a float) before doing anything else.
- ``[[flaky:N]]`` — answer HTTP 500 the first N times this exact TEXT arrives, then go on.
- ``[[status:CODE]]`` — answer HTTP CODE with an OpenAI-style error JSON whose message is
  ``scripted status CODE``; with ``[[retry-after:SECONDS]]`` also a ``Retry-After`` header.
- ``[[garbage]]`` — answer 200 with a body that is not JSON.
- ``[[badargs]]`` — answer 200 with a tool call to ``clock`` whose arguments are not JSON.
- ``[[loop]]`` — always answer with a tool call to ``clock`` (even when no tools are offered).
- ``[[tool:NAME]]`` or ``[[tool:NAME:{"json": "args"}]]`` — if the messages after the last user
  message contain no ``role: tool`` result yet, answer with a tool call to NAME (arguments
  ``{}`` or the given JSON); once there is one, answer ``NAME said: <that tool result>``.
- ``tool_choice`` ``"required"`` or ``{"type": "function", "function": {"name": NAME}}`` in the
  request (no directive above matched, and the server was not started with ``ignore_tools``) —
  answer with a call to that tool (the first one offered, for ``"required"``) whose arguments
  fill each required parameter with a value of its type (``relaybot doctor``'s round trip).
- the prompts of the summary jobs (memory/segments.py) — see :func:`_derived_answer`.
- otherwise — answer ``echo: TEXT``; with ``[[dribble:SECONDS]]`` the headers go out at once
  and the body follows in 10 pieces, SECONDS apart (each read is quick, the whole is slow).

Content given as a list of ``{"type": "text", "text": ...}`` parts is joined first. A request
without any user message is answered ``echo: `` (empty TEXT).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

MODEL_ID = "fake-model"

_DELAY = re.compile(r"\[\[delay:([0-9]*\.?[0-9]+)\]\]")
_FLAKY = re.compile(r"\[\[flaky:([0-9]+)\]\]")
_STATUS = re.compile(r"\[\[status:([0-9]{3})\]\]")
_RETRY_AFTER = re.compile(r"\[\[retry-after:([^\]]+)\]\]")
_DRIBBLE = re.compile(r"\[\[dribble:([0-9]*\.?[0-9]+)\]\]")
DRIBBLE_CHUNKS = 10
_TOOL = re.compile(r"\[\[tool:([A-Za-z0-9_-]+)(?::(\{.*?\}))?\]\]")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _last_user(messages: list[Any]) -> tuple[str, list[Any]]:
    """The last user message's text and the messages after it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user":
            return _text(message.get("content")), messages[index + 1 :]
    return "", []


def _completion(
    model: str, *, content: str | None = None, tool_call: dict[str, Any] | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_call is not None:
        message["tool_calls"] = [tool_call]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_call is not None else "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _tool_call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


_SAMPLE = {"string": "ok", "boolean": True, "integer": 1, "number": 1, "array": [], "object": {}}


def _forced_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The tool call a request forces with ``tool_choice`` (None: it forces none)."""
    tools = [t.get("function") for t in body.get("tools") or [] if isinstance(t, dict)]
    tools = [t for t in tools if isinstance(t, dict) and t.get("name")]
    choice = body.get("tool_choice")
    if not tools or choice in (None, "auto", "none"):
        return None
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        tools = [t for t in tools if t["name"] == wanted]
    if not tools:
        return None
    params = tools[0].get("parameters") or {}
    props = params.get("properties") or {}
    args = {
        name: _SAMPLE.get(str((props.get(name) or {}).get("type")), "ok")
        for name in params.get("required") or []
    }
    return _tool_call(str(tools[0]["name"]), json.dumps(args))


PAUSE_PREFIX = "You read the last messages of a conversation."
# a context line (memory/lines.py): ``[cli / owner] 2026-11-22 10:04 UTC: text``
_LINE = re.compile(r"(?P<head>\[[^\]/]* / (?P<who>[^\]]*)\] \S+ \S+ \S+): (?P<text>.*)")
SUMMARY_PREFIX = "Summarise this part of a conversation"


def _derived_answer(text: str) -> str | None:
    """The answers to the summary jobs' prompts (memory/segments.py), or None for any other.

    The pause judgement: ``{"paused": false}`` when the messages hold ``[[open]]``, else true.
    The summary: ``{"summary": "SUMMARY: <who>: <text> | <who>: <text> ..."}``, each message's
    sender label and text (so a test can tell what it covered), or a non-JSON answer when they
    hold ``[[summary-garbage]]``; the prompt's example echoed back (``{"summary": "..."}``) with
    ``[[summary-placeholder]]``, the prompt's first line with ``[[summary-echo]]``, only the
    participants (``A conversation between owner and relaybot.``) with ``[[summary-names]]``,
    the first message line with ``...`` for its text (``[cli / owner] <time>: ...``) with
    ``[[summary-line]]``."""
    if text.startswith(PAUSE_PREFIX):
        return json.dumps({"paused": "[[open]]" not in text})
    if text.startswith(SUMMARY_PREFIX):
        if "[[summary-garbage]]" in text:
            return "Here is a summary, but not as JSON."
        if "[[summary-placeholder]]" in text:
            return json.dumps({"summary": "..."})
        if "[[summary-echo]]" in text:
            return json.dumps({"summary": text.splitlines()[0]})
        lines = [_LINE.match(line) for line in text.split("Messages:\n", 1)[-1].splitlines()]
        said = [m for m in lines if m is not None]
        if "[[summary-names]]" in text:
            who = " and ".join(dict.fromkeys(m["who"] for m in said))
            return json.dumps({"summary": f"A conversation between {who}."})
        if "[[summary-line]]" in text:
            return json.dumps({"summary": f"{said[0]['head']}: ..."})
        parts = [f"{m['who']}: {m['text']}" for m in said]
        return json.dumps({"summary": "SUMMARY: " + " | ".join(parts)})
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    fake: FakeModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (timeout) closes its socket; that is expected here
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like real servers
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        dribble: float = 0.0,
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if dribble > 0:
                step = max(1, len(body) // DRIBBLE_CHUNKS)
                for start in range(0, len(body), step):
                    if self.server.fake.wait(dribble):
                        self.close_connection = True
                        return
                    self.wfile.write(body[start : start + step])
                    self.wfile.flush()
            else:
                self.wfile.write(body)
            self.wfile.flush()
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def _json(
        self,
        status: int,
        data: Any,
        headers: dict[str, str] | None = None,
        dribble: float = 0.0,
    ) -> None:
        self._send(status, json.dumps(data).encode(), headers=headers, dribble=dribble)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._json(
            status,
            {"error": {"message": message, "type": "fake_error", "code": status}},
            headers,
        )

    def _refused(self) -> bool:
        """Whether the request lacks the API key the server wants (then answered 401)."""
        fake = self.server.fake
        key, query_key = fake.api_key, fake.query_key
        if query_key is not None and parse_qs(urlsplit(self.path).query).get("key") != [query_key]:
            sent = [p.partition("=")[2] for p in urlsplit(self.path).query.split("&")]
            message = fake.refusal.format(path=self.path, value=sent[0])  # echoes, as some do
            self._error(401, message)
            return True
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return False
        self._error(401, "Incorrect API key provided")
        return True

    def _route(self) -> str:
        """The request's path without its query (which is kept in ``paths``)."""
        with self.server.fake._lock:
            self.server.fake.paths.append(f"{self.command} {self.path}")
        return urlsplit(self.path).path.rstrip("/")

    def do_GET(self) -> None:
        route = self._route()
        if route in ("/v1/models", "/models"):
            if self._refused():
                return
            listed = self.server.fake.models
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": m, "object": "model", "owned_by": "fake"} for m in listed],
                },
            )
        elif route == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._error(404, f"no route for GET {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self._route() not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route for POST {self.path}")
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            self._error(400, "the request body is not a JSON object")
            return
        fake = self.server.fake
        fake.record(self.path, dict(self.headers.items()), body, self.client_address[1])
        if self._refused():
            return
        if fake.known_models_only and body.get("model") not in fake.models:
            self._error(404, f"The model `{body.get('model')}` does not exist")
            return
        messages = body.get("messages")
        if not isinstance(messages, list):
            self._error(400, "messages must be a list")
            return
        self._answer(fake, body, messages)

    def _answer(self, fake: FakeModelServer, body: dict[str, Any], messages: list[Any]) -> None:
        text, after = _last_user(messages)
        model = str(body.get("model") or fake.model)

        delay = _DELAY.search(text)
        if delay and fake.wait(float(delay.group(1))):
            self._error(503, "the fake model server is stopping")
            return

        flaky = _FLAKY.search(text)
        if flaky and fake.seen(text) <= int(flaky.group(1)):
            self._error(500, "scripted flaky failure")
            return

        status = _STATUS.search(text)
        if status:
            code = int(status.group(1))
            retry_after = _RETRY_AFTER.search(text)
            headers = {"Retry-After": retry_after.group(1)} if retry_after else None
            self._error(code, f"scripted status {code}", headers)
            return

        scripted = fake.task_answer(text)
        if scripted is not None:
            self._json(200, _completion(model, content=scripted))
            return

        derived = _derived_answer(text)
        if derived is not None:
            self._json(200, _completion(model, content=derived))
            return

        if "[[garbage]]" in text:
            self._send(200, b"<html>this is not JSON {", content_type="text/html")
            return

        if "[[badargs]]" in text:
            call = _tool_call("clock", "{not json")
            self._json(200, _completion(model, tool_call=call))
            return

        if "[[loop]]" in text:
            self._json(200, _completion(model, tool_call=_tool_call("clock", "{}")))
            return

        tool = _TOOL.search(text)
        if tool:
            results = [m for m in after if isinstance(m, dict) and m.get("role") == "tool"]
            name = tool.group(1)
            if results:
                said = _text(results[-1].get("content"))
                self._json(200, _completion(model, content=f"{name} said: {said}"))
            else:
                call = _tool_call(name, tool.group(2) or "{}")
                self._json(200, _completion(model, tool_call=call))
            return

        forced = None if fake.ignore_tools else _forced_tool(body)
        if forced is not None:
            self._json(200, _completion(model, tool_call=forced))
            return

        dribble = _DRIBBLE.search(text)
        pause = float(dribble.group(1)) if dribble else 0.0
        self._json(200, _completion(model, content=f"echo: {text}"), dribble=pause)


class FakeModelServer:
    """The fake server, run on a background thread; see the module docstring."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model: str = MODEL_ID,
        log_path: Path | str | None = None,
        ignore_tools: bool = False,
        models: list[str] | None = None,
        known_models_only: bool = False,
        api_key: str | None = None,
        query_key: str | None = None,
        refusal: str = "Missing or wrong key in {path}",
    ) -> None:
        self.host = host
        self.query_key = query_key
        self.refusal = refusal
        self.paths: list[str] = []
        self.model = model
        self.ignore_tools = ignore_tools  # a model that answers in text even when told to call
        self.models = list(models) if models is not None else [model]
        self.known_models_only = known_models_only
        self.api_key = api_key
        self.log_path = Path(log_path) if log_path else None
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.peer_ports: list[int] = []  # the client's port per request: same port, same connection
        self._port = port
        self._lock = threading.Lock()
        self._seen: Counter[str] = Counter()
        self._stopping = threading.Event()
        # a test's scripted answers to the jobs' prompts: the prompt's first line -> its answer
        self.tasks: dict[str, Callable[[str], str]] = {}
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeModelServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _Server((self.host, self._port), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()  # wakes handlers sleeping on [[delay:...]]
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- state ----------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the fake model server is not running")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def authorizations(self) -> list[str | None]:
        """The ``Authorization`` header of each chat request (None when absent)."""
        with self._lock:
            return [
                next((v for k, v in h.items() if k.lower() == "authorization"), None)
                for h in self.request_headers
            ]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.paths.clear()
            self.request_headers.clear()
            self.peer_ports.clear()
            self._seen.clear()

    def record(
        self, path: str, headers: dict[str, str], body: dict[str, Any], peer_port: int = 0
    ) -> None:
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(headers)
            self.peer_ports.append(peer_port)
            if self.log_path is not None:
                auth = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
                line = json.dumps({"path": path, "authorization": auth, "body": body})
                with self.log_path.open("a", encoding="utf-8") as fh:
                    fh.write(line + "\n")

    def task_answer(self, text: str) -> str | None:
        """The test's scripted answer to a prompt whose first line it registered in
        :attr:`tasks` (a layer-2 job's ``TASK: ...`` prompts), or None."""
        handler = self.tasks.get(text.split("\n", 1)[0].strip())
        return None if handler is None else handler(text)

    def seen(self, text: str) -> int:
        """Count one more sighting of ``text`` and return the count."""
        with self._lock:
            self._seen[text] += 1
            return self._seen[text]

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; True if the server is stopping meanwhile."""
        return self._stopping.wait(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible model server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, help="write the port here once listening")
    parser.add_argument("--log", type=Path, help="append each chat request here as a JSON line")
    parser.add_argument("--model", default=MODEL_ID)
    args = parser.parse_args(argv)

    server = FakeModelServer(args.host, args.port, model=args.model, log_path=args.log).start()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.port_file is not None:
        tmp = args.port_file.with_name(args.port_file.name + ".tmp")
        tmp.write_text(f"{server.port}\n", encoding="utf-8")
        os.replace(tmp, args.port_file)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
