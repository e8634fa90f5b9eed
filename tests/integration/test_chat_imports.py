"""What ``relaybot chat -m`` imports when the worker already runs (issue 26, "Start-up that feels
instant"): the Redis client, the configuration and the terminal's gateway, and nothing the chat
does not use. Not the worker's or memory's modules, not rq, nio or the mail clients, not the
other commands' modules; no rich in a pipe (it renders Markdown on a terminal only); no httpx
without a model URL to check, and with one, httpx without its command-line client (click,
pygments, rich). structlog comes without rich and Twisted (contract/imports.py). The time itself
is bench/coldstart.py's to measure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import Procs, among, modules_at_exit, relaybot_env
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

NEVER = (
    "worker",
    "memory",
    "sqlite3",
    "rq",
    "nio",
    "aiosmtplib",
    "aioimaplib",
    "gateways.matrix.gateway",
    "gateways.email.gateway",
    "rich",
    "markdown_it",
    "pygments",
    "click",
    "twisted",
    "relaybot.cli_memory",
    "relaybot.cli_entities",
    "relaybot.doctor",
    "relaybot.onboard_ask",
)


def chat_imports(env: dict[str, str]) -> tuple[list[str], str]:
    done, modules = modules_at_exit(["chat", "-m", "hi"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gateways.cli.gateway" in modules and "redis" in modules, done.stderr[-3000:]
    return modules, done.stdout


@pytest.mark.timeout(120)
def test_a_chat_to_a_running_worker_imports_what_it_uses(
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    bare = relaybot_env(tmp_path / "home", redis_url=redis_server.url, prefix=prefix)
    procs.worker(bare, r=real_redis, keys=Keys(prefix))

    modules, said = chat_imports(bare)
    assert said.startswith("No model is configured")
    assert among(modules, (*NEVER, "httpx")) == []

    with_model = {**bare, "OPENAI_BASE_URL": model_server.base_url, "RELAYBOT_MODEL": "fake"}
    modules, said = chat_imports(with_model)  # the chat checks the model URL as it loads
    assert "httpx" in modules  # the config: what the running worker answers with is its own
    assert among(modules, NEVER) == []
