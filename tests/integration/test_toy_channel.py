"""A channel added the way a package adds one (issue 25): the toy channel (tests/support/
toychannel/, nothing of it outside that folder) is registered by a ``toy-0.dist-info`` entry
point on PYTHONPATH, as an installed distribution would be, and a message goes through it end to
end: its gateway under the shared runner and its own ACL user, the real worker, a real Redis
with the generated ACL file; ``relaybot doctor`` runs its checks and its ACL probes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from contract.keys import Keys, digest
from tests.support.channels import write_dist
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import REPO, Procs, relaybot_env, run_relaybot, wait_until, write_config
from tests.support.servers import redis_with_acl

pytestmark = pytest.mark.integration

PASSWORDS = {"worker": "w-secret", "jobs": "j-secret", "toy": "t-secret"}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A directory on PYTHONPATH where the toy's distribution is 'installed'."""
    return write_dist(
        tmp_path / "site", "relaybot_toy", {"toy": "tests.support.toychannel.channel:CHANNEL"}
    )


def pythonpath(site: Path) -> str:
    return os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(":")


@pytest.fixture
def acl_file(tmp_path: Path, site: Path) -> str:
    """deploy.acl's output with the toy registered: its user line comes from its spec."""
    done = subprocess.run(
        [sys.executable, "-m", "deploy.acl"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def acl_redis(tmp_path: Path, acl_file: str) -> Iterator[int]:
    with redis_with_acl(tmp_path, acl_file, PASSWORDS, args=["--appendonly", "no"]) as port:
        yield port


def env_of(home: Path, site: Path, port: int, user: str, model: FakeModelServer) -> dict[str, str]:
    url = f"redis://relaybot-{user}:{PASSWORDS[user]}@127.0.0.1:{port}/0"
    return relaybot_env(
        home,
        redis_url=url,
        model_url=model.base_url,
        PYTHONPATH=pythonpath(site),
        RELAYBOT_LOG_FORMAT="json",
    )


def test_the_acl_file_has_the_toys_line_from_its_spec(acl_file: str) -> None:
    shipped = (REPO / "deploy" / "redis" / "users.acl").read_text()
    toy = [line for line in acl_file.splitlines() if line.startswith("user relaybot-toy ")]
    assert len(toy) == 1
    assert "~relaybot:inbound:toy " in toy[0] and "~relaybot:toy:* " in toy[0]
    assert acl_file == shipped + toy[0] + "\n"  # the shipped users, then the toy's


def test_a_message_goes_through_the_toy_channel_end_to_end(
    tmp_path: Path,
    site: Path,
    acl_redis: int,
    model_server: FakeModelServer,
    procs: Procs,
) -> None:
    home = tmp_path / "home"
    inbox, outbox = tmp_path / "inbox.txt", tmp_path / "outbox.txt"
    inbox.write_text("")
    write_config(home, f'[toy]\ninbox = "{inbox}"\noutbox = "{outbox}"\n')
    keys = Keys()
    admin = redis.Redis(port=acl_redis, username="relaybot-worker", password="w-secret")

    worker = procs.worker(env_of(home, site, acl_redis, "worker", model_server))
    worker.wait_for_log("worker.lease_acquired", timeout=30)
    gateway = procs.start(
        "gateway-toy", ["gateway", "toy"], env_of(home, site, acl_redis, "toy", model_server)
    )
    gateway.wait_for_log("gateway.lease_acquired", timeout=30, channel="toy")

    inbox.write_text("hello from the toy channel\n")
    wait_until(
        lambda: outbox.exists() and outbox.read_text().strip(),
        timeout=30,
        message=lambda: (
            f"a reply in the outbox; gateway:\n{gateway.log_text()[-3000:]}"
            f"\nworker:\n{worker.log_text()[-3000:]}"
        ),
    )
    assert len(outbox.read_text().splitlines()) == 1
    assert admin.get(f"{keys.prefix}toy:cursor") == b"1"  # the gateway's own key, its ACL's
    assert admin.xlen(keys.inbound_of("toy")) >= 1  # the worker read the toy's stream
    # the lease is the toy account's (per channel and per account: the inbox file)
    assert admin.exists(keys.gateway_lease("toy", str(inbox)))
    assert keys.gateway_lease("toy", str(inbox)).endswith(digest(str(inbox)))
    assert not gateway.events("toy.crashed") and gateway.returncode is None

    # doctor, as the toy's Redis user: the ACL probes of the toy role pass, its checks run
    done = run_relaybot(
        ["doctor", "--json", "--timeout", "3"],
        env_of(home, site, acl_redis, "toy", model_server),
        timeout=90,
    )
    checks = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["redis.acl"]["verdict"] == "ok", checks["redis.acl"]
    assert checks["redis.acl"]["details"]["roles"] == ["toy"]
    assert checks["toy.inbox"]["verdict"] == "ok", checks["toy.inbox"]
    # `relaybot gateway --help` lists it
    helped = run_relaybot(["gateway", "--help"], env_of(home, site, acl_redis, "toy", model_server))
    assert "toy" in helped.stdout
