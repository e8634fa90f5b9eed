"""`relaybot onboard` against real servers (issue 13): the model endpoint (our model server), a
real Synapse, pymap and aiosmtpd, with good and wrong credentials, driven through a pipe and a
pseudo-terminal with scripted answers, and with flags alone (``--no-input``).

Proves: the models ``/v1/models`` lists are offered and one is picked by number; a wrong API key
or a model the endpoint does not have is reported, and the person retries or keeps it; the
Matrix login is tested (password: logged out again, no device left; token: whoami) and a wrong
password is refused with the reason; IMAP and SMTP logins are tested both ways; what is written
is what load_config reads, mode 0600; the owner's name reaches the model's system prompt.
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import termios
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import load_config
from tests.support.fakemodel import FakeModelServer
from tests.support.mailservers import ImapServer, SmtpServer
from tests.support.procs import relaybot_env, run_relaybot
from tests.support.synapse import SynapseServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODELS = ["llama3.2:1b", "qwen2.5:7b", "mistral-nemo"]
SMTP_LOGIN = ("relay-out", "smtp-pass")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return relaybot_env(tmp_path / "home", model=None)


@pytest.fixture
def models() -> Iterator[FakeModelServer]:
    with FakeModelServer(models=MODELS, known_models_only=True, api_key="sk-right") as server:
        yield server


@pytest.fixture
def smtp_auth() -> Iterator[SmtpServer]:
    server = SmtpServer(login=SMTP_LOGIN).start()
    yield server
    server.stop()


def onboard(env: dict[str, str], answers: list[str], *flags: str) -> Any:
    return run_relaybot(["onboard", *flags], env, timeout=90, stdin="\n".join(answers) + "\n")


def written(env: dict[str, str]) -> dict[str, Any]:
    path = Path(env["RELAYBOT_HOME"]) / "config.toml"
    assert path.stat().st_mode & 0o777 == 0o600
    return tomllib.loads(path.read_text())


OWNER = ["Ada", "", "", ""]  # name; no terminal user, Matrix ids or e-mail addresses


def test_the_models_are_offered_and_one_is_picked_by_number(
    env: dict[str, str], models: FakeModelServer
) -> None:
    answers = [*OWNER, models.base_url, "sk-right", "2", "n", "n"]
    result = onboard(env, answers)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "ok: the endpoint answers and offers 3 model(s)" in out
    assert "1. llama3.2:1b" in out and "2. mistral-nemo" in out and "3. qwen2.5:7b" in out
    assert "ok: mistral-nemo answered a test completion" in out
    assert written(env)["model"] == {
        "base_url": models.base_url,
        "model": "mistral-nemo",
        "api_key": "sk-right",
        "concurrency": 1,  # a server on this machine: one request at a time (adversarial review)
    }
    assert "a server on this machine: concurrency = 1" in out
    cfg = load_config(Path(env["RELAYBOT_HOME"]), env={})
    assert cfg.owner.name == "Ada" and "The owner's name is Ada" in cfg.system_prompt
    # the test completion asked for the model chosen, with the key given
    assert models.requests[-1]["model"] == "mistral-nemo"
    assert models.authorizations[-1] == "Bearer sk-right"


def test_a_wrong_api_key_is_reported_and_retried(
    env: dict[str, str], models: FakeModelServer
) -> None:
    answers = [
        *OWNER,
        *(models.base_url, "sk-wrong", "qwen2.5:7b"),  # refused: 401
        "r",  # retry: the URL and the model are as answered before, only the key is new
        *("", "sk-right", ""),
        "n",
        "n",
    ]
    result = onboard(env, answers)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED: the endpoint refused the API key (401" in result.stdout
    assert (
        f"Base URL (e.g. http://localhost:11434/v1; empty: set it later) [{models.base_url}]"
        in (result.stdout)
    )
    assert written(env)["model"] == {
        "base_url": models.base_url,
        "model": "qwen2.5:7b",
        "api_key": "sk-right",
        "concurrency": 1,
    }


def test_a_model_the_endpoint_lacks_fails_without_input_or_is_kept_when_told(
    env: dict[str, str], models: FakeModelServer
) -> None:
    flags = ["--no-input", "--name", "Ada", "--model-url", models.base_url, "--model", "gpt-9"]
    result = run_relaybot(["onboard", *flags], {**env, "OPENAI_API_KEY": "sk-right"}, timeout=60)
    assert result.returncode == 1
    assert "note: the endpoint does not list 'gpt-9'" in result.stdout
    assert "FAILED: the endpoint has no model 'gpt-9'" in result.stdout
    assert "the model test failed" in result.stderr and "nothing was written" in result.stderr
    assert not (Path(env["RELAYBOT_HOME"]) / "config.toml").exists()
    kept = run_relaybot(
        ["onboard", *flags, "--on-failure", "keep"], {**env, "OPENAI_API_KEY": "sk-right"}
    )
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert written(env)["model"]["model"] == "gpt-9"


def test_matrix_password_login_is_tested_and_leaves_no_device(
    env: dict[str, str], synapse_server: SynapseServer
) -> None:
    bot = synapse_server.register(f"bot{time.time_ns()}", "bot-pass")
    devices = synapse_server.request("GET", "/_matrix/client/v3/devices", token=bot.access_token)
    answers = [*OWNER, "", "y", synapse_server.url, bot.user_id, "p", "bot-pass", "n"]
    result = onboard(env, answers)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ok: logged in as {bot.user_id} (and out again)" in result.stdout
    assert written(env)["matrix"] == {
        "homeserver": synapse_server.url,
        "user_id": bot.user_id,
        "password": "bot-pass",
    }
    after = synapse_server.request("GET", "/_matrix/client/v3/devices", token=bot.access_token)
    assert len(after["devices"]) == len(devices["devices"])  # the test's session was logged out


def test_a_wrong_matrix_password_says_why_then_a_token_works(
    env: dict[str, str], synapse_server: SynapseServer
) -> None:
    bot = synapse_server.register(f"bot{time.time_ns()}", "bot-pass")
    answers = [
        *OWNER,
        "",
        "y",
        *(synapse_server.url, bot.user_id, "p", "not-the-password"),
        "r",
        *(synapse_server.url, bot.user_id, "t", bot.access_token),
        "n",
    ]
    result = onboard(env, answers)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED: the homeserver refused the login: wrong user or password" in result.stdout
    assert f"ok: the access token is {bot.user_id}'s" in result.stdout
    section = written(env)["matrix"]
    assert section["access_token"] == bot.access_token
    assert section["device_id"] == bot.device_id
    assert "password" not in section
    # a token of another user is refused by name
    other = synapse_server.register(f"other{time.time_ns()}")
    flags = [
        "--no-input", "--force", "--name", "Ada", "--matrix", "y",
        "--matrix-homeserver", synapse_server.url, "--matrix-user", bot.user_id,
        "--matrix-login", "t", "--matrix-token", other.access_token,
    ]  # fmt: skip
    refused = run_relaybot(["onboard", *flags], env, timeout=60)
    assert refused.returncode == 1
    assert f"the access token belongs to '{other.user_id}'" in refused.stdout


def email_answers(imap: ImapServer, smtp: SmtpServer, imap_pw: str, smtp_pw: str) -> list[str]:
    return [
        "127.0.0.1", "plain", str(imap.port), imap.user, imap_pw,
        "127.0.0.1", "plain", str(smtp.port), SMTP_LOGIN[0], smtp_pw,
        "relaybot@example.org",
    ]  # fmt: skip


def test_email_logins_are_tested_both_ways(
    env: dict[str, str], imap: ImapServer, smtp_auth: SmtpServer
) -> None:
    answers = [
        *OWNER,
        "",
        "n",
        "y",
        *email_answers(imap, smtp_auth, "wrong-imap", SMTP_LOGIN[1]),
        "r",
        *email_answers(imap, smtp_auth, imap.password, "wrong-smtp"),
        "r",
        *email_answers(imap, smtp_auth, imap.password, SMTP_LOGIN[1]),
    ]
    result = onboard(env, answers)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"FAILED: IMAP 127.0.0.1:{imap.port} (plain): login refused for 'relay'" in out
    assert f"FAILED: SMTP 127.0.0.1:{smtp_auth.port} (plain): login refused for 'relay-out'" in out
    assert f"ok: IMAP 127.0.0.1:{imap.port} (plain): logged in as relay\n" in out  # IDLE seen
    assert f"ok: SMTP 127.0.0.1:{smtp_auth.port} (plain): logged in as relay-out" in out
    assert written(env)["email"] == {
        "imap_host": "127.0.0.1",
        "imap_port": imap.port,
        "imap_tls": "plain",
        "imap_user": imap.user,
        "imap_password": imap.password,
        "smtp_host": "127.0.0.1",
        "smtp_port": smtp_auth.port,
        "smtp_tls": "plain",
        "addresses": ["relaybot@example.org"],
        "smtp_user": SMTP_LOGIN[0],
        "smtp_password": SMTP_LOGIN[1],
    }
    cfg = load_config(Path(env["RELAYBOT_HOME"]), env={})
    assert cfg.email.configured and cfg.email.smtp_password is not None


def test_a_failed_email_test_can_be_skipped_and_writes_no_email_section(
    env: dict[str, str], imap: ImapServer, smtp_auth: SmtpServer
) -> None:
    answers = [*OWNER, "", "n", "y", *email_answers(imap, smtp_auth, "nope", "nope"), "s"]
    result = onboard(env, answers)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "email" not in written(env)


# -- in a terminal: the questions, secrets without echo ------------------------------------------


def _read_until(fd: int, needle: bytes, buf: bytearray, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while needle not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                buf += os.read(fd, 4096)
            except OSError:
                break
    return needle in buf


def test_in_a_terminal_the_key_is_not_echoed(env: dict[str, str], models: FakeModelServer) -> None:
    master, slave = os.openpty()

    def controlling_terminal() -> None:  # the child's own terminal, as a login shell has
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [sys.executable, "-m", "relaybot", "onboard"],
        stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
        start_new_session=True, preexec_fn=controlling_terminal,  # noqa: PLW1509
    )  # fmt: skip
    os.close(slave)
    out = bytearray()
    script = [
        (b"Your name", b"Ada"),
        (b"terminal", b""),
        (b"Matrix user id", b""),
        (b"e-mail address", b""),
        (b"Base URL", models.base_url.encode()),
        (b"API key", b"sk-right"),
        (b"Model (its number or name)", b"1"),
        (b"Matrix gateway?", b"n"),
        (b"e-mail gateway?", b"n"),
    ]
    try:
        for prompt, answer in script:
            assert _read_until(master, prompt, out), out.decode(errors="replace")
            del out[: out.index(prompt) + len(prompt)]
            assert _read_until(master, b": ", out)  # the whole prompt, then the answer
            os.write(master, answer + b"\n")
        assert _read_until(master, b"Wrote ", out), out.decode(errors="replace")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert b"sk-right" not in out  # typed, never shown
    assert written(env)["model"]["model"] == "llama3.2:1b"
