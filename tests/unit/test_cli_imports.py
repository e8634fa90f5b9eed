"""What ``relaybot --version`` and ``--help`` import (issue 26, "Start-up that feels instant").

A command that starts nothing must not pay for what the others need: no structlog (with rich
and, where installed, Twisted), no Redis client (which imports redis.asyncio), no pydantic
configuration, no httpx, no channel registry (entry points), no rq, nio or mail clients. Each
case runs the command as a process and lists the modules it held when it exited; ``python -X
importtime -m relaybot --version`` shows the same with their times (bench/coldstart.py measures
the time itself: no test asserts one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relaybot import cli
from tests.support.procs import among, modules_at_exit

REPO = Path(__file__).resolve().parents[2]

# modules (and their submodules) a command that starts nothing must not import
HEAVY = (
    "structlog",
    "rich",
    "twisted",
    "redis",
    "httpx",
    "pydantic",
    "pydantic_core",
    "rq",
    "nio",
    "aiosmtplib",
    "aioimaplib",
    "asyncio",
    "sqlite3",
    "contract.config",
    "contract.channels",
    "contract.logs",
    "contract.bus",
    "gateways",
    "worker",
    "memory",
    "deploy",
    "relaybot.cli_memory",
    "relaybot.cli_reminders",
    "relaybot.doctor",
    "relaybot.onboard_ask",
)


def imported(args: list[str]) -> list[str]:
    """The modules ``relaybot ARGS`` had imported when it exited 0."""
    done, modules = modules_at_exit(args, {**os.environ, "RELAYBOT_DOTENV": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "relaybot.cli" in modules, done.stderr[-2000:]
    return modules


@pytest.mark.parametrize("args", [["--version"], ["-V"], ["--help"], ["-v", "--help"]])
def test_version_and_help_import_nothing_a_command_needs(args: list[str]) -> None:
    assert among(imported(args), HEAVY) == []


def test_help_does_not_look_up_the_installed_version_or_the_channels() -> None:
    """``--help`` lists the commands from relaybot's own parser: no importlib.metadata (the
    version, the channels' entry points); ``--version`` reads the version and nothing else."""
    assert "importlib.metadata" not in imported(["--help"])
    assert "importlib.metadata" in imported(["--version"])


def test_a_commands_own_help_still_has_its_arguments() -> None:
    """The arguments a command's module adds (memory's subcommands, doctor's, onboarding's
    questions, a gateway per channel) are there when that command is asked for."""
    for argv, wanted in (
        (["memory", "--help"], "search"),
        (["entities", "--help"], "link"),
        (["reminders", "--help"], "cancel"),
        (["reminders", "add", "--help"], "--every"),
        (["doctor", "--help"], "--timeout"),
        (["onboard", "--help"], "--matrix-homeserver"),
        (["gateway", "--help"], "matrix"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "relaybot", *argv],
            env={**os.environ, "RELAYBOT_DOTENV": ""},
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert wanted in done.stdout, (argv, done.stdout)


def test_the_command_word_chooses_which_arguments_are_added() -> None:
    args = cli.parse_args(["-v", "memory", "search", "blue", "--limit", "3"])
    assert (args.command, args.memory_command, args.limit) == ("memory", "search", 3)
    assert cli.parse_args(["doctor", "--json"]).json is True
    assert cli.parse_args(["gateway", "email"]).gateway == "email"
    assert cli.parse_args(["reminders", "cancel", "3"]).id == 3


def test_structlog_and_httpx_are_imported_without_their_optional_extras() -> None:
    """relaybot's logs render plain tracebacks (contract/logs.py), nothing runs httpx's
    command-line client and the model client speaks HTTP/1.1: structlog's rich and Twisted
    integrations, httpx's CLI (click, pygments, rich) and httpcore's HTTP/2 (h2) are not imported
    with them; all still work (a log line, a request), and the extras stay importable."""
    code = (
        "import sys, threading\n"
        "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
        "from contract import imports\n"
        "imports.lean_structlog()\n"
        "imports.lean_httpx()\n"
        "imports.lean_httpcore()\n"
        "import httpx, structlog, contract.logs\n"
        "extras = {'rich', 'twisted', 'click', 'pygments', 'h2'} & set(sys.modules)\n"
        "assert not extras, extras\n"
        "assert structlog.dev.rich is None\n"
        "class Ok(BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.send_header('Content-Length', '2')\n"
        "        self.end_headers(); self.wfile.write(b'ok')\n"
        "    def log_message(self, *args): pass\n"
        "server = HTTPServer(('127.0.0.1', 0), Ok)\n"
        "threading.Thread(target=server.handle_request, daemon=True).start()\n"
        "url = f'http://127.0.0.1:{server.server_address[1]}/v1'\n"
        "with httpx.Client(follow_redirects=False) as client:\n"
        "    answer = client.get(url).text\n"
        "contract.logs.configure('chat')\n"
        "structlog.get_logger('x').warning('said', detail=answer)\n"
        "import rich.markdown, h2.connection, click\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "RELAYBOT_DOTENV": "", "RELAYBOT_LOG_FORMAT": "console"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "said" in done.stderr and "detail=ok" in done.stderr
