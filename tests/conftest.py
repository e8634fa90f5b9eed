from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from tests.support.channels import fake_channel  # noqa: F401  (a fixture for every test)
from tests.support.fakemodel import FakeModelServer
from tests.support.mailservers import ImapServer, SmtpServer
from tests.support.matrix_world import World
from tests.support.procs import Procs, relaybot_env
from tests.support.servers import RedisServer
from tests.support.synapse import SynapseServer

# a developer's own .env in the clone (the README suggests one) never reaches the tests: every
# relaybot command would read it (relaybot/envfile.py); tests that mean .env set their own up
os.environ["RELAYBOT_DOTENV"] = ""


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def prefix() -> str:
    """A key prefix of its own for each test, so tests share one Redis without meeting."""
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def real_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty RELAYBOT_HOME, and an environment free of the developer's own settings."""
    for var in list(os.environ):
        if var.startswith(("RELAYBOT_", "OPENAI_")) or var == "REDIS_URL":
            monkeypatch.delenv(var, raising=False)
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("RELAYBOT_HOME", str(h))
    return h


@pytest.fixture(scope="session")
def synapse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SynapseServer]:
    """A real Synapse homeserver on 127.0.0.1 (started once, ~2 s), for the Matrix tests."""
    server = SynapseServer(tmp_path_factory.mktemp("synapse")).start()
    yield server
    server.stop()


@pytest.fixture
def model_server() -> Iterator[FakeModelServer]:
    """Our own OpenAI-compatible model server on 127.0.0.1, scripted by each test."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """relaybot processes started by a test, stopped (and their logs kept) after it."""
    with Procs(tmp_path / "proclogs") as running:
        yield running


@pytest.fixture
def imap(tmp_path: Path) -> Iterator[ImapServer]:
    """A real IMAP server (pymap, with IDLE) on 127.0.0.1."""
    server = ImapServer(tmp_path / "imap").start()
    yield server
    server.stop()


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    """A real SMTP server (aiosmtpd) on 127.0.0.1 that keeps what it receives."""
    server = SmtpServer().start()
    yield server
    server.stop()


@pytest.fixture
def world(  # the Matrix tests' people, worker and environment (tests/support/matrix_world.py)
    tmp_path: Path,
    synapse_server: SynapseServer,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> World:
    env = relaybot_env(
        tmp_path / "home", redis_url=redis_server.url, prefix=prefix,
        model_url=model_server.base_url,
    )  # fmt: skip
    w = World(synapse_server, env, real_redis, Keys(prefix), procs)
    procs.worker(env, r=real_redis, keys=w.keys)
    return w
