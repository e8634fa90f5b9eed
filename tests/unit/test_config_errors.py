"""A configuration error is one line that says what to do (issue 26): an unknown key names its
key, its section, the file and what to write instead; a config.toml that cannot be read (a
directory in its place, a file this user may not read, a symbolic link to nothing) names the file
and the fix, and a running process keeps its last good configuration."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from contract import config_watch
from contract.config import (
    ConfigError,
    ConfigUnreadable,
    load_config,
    parse_config,
    read_config_bytes,
)
from contract.config_watch import WORKER_RELOADS, WORKER_USES, ConfigWatcher

BASE = '[owner]\nname = "Ada"\n'


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(text.encode(), tmp_path, {})
    message = str(exc.value)
    assert "\n" not in message
    assert "Extra inputs are not permitted" not in message  # pydantic's words, not ours
    assert message.startswith(f"{tmp_path / 'config.toml'}: ")
    return message


# -- unknown keys ------------------------------------------------------------------------------


def test_an_unknown_key_names_the_key_the_section_and_the_close_match(tmp_path: Path) -> None:
    message = refused(tmp_path, "[worker]\nbatchh = 5\n")
    assert "unknown key 'batchh' in [worker]: did you mean 'batch'?" in message


def test_an_unknown_key_with_no_close_match_lists_the_sections_keys(tmp_path: Path) -> None:
    message = refused(tmp_path, "[delivery]\nzzz = 5\n")
    assert "unknown key 'zzz' in [delivery]: the keys of [delivery] are max_age, retry_min, " in (
        message
    )
    assert "retry_max" in message


def test_an_unknown_section_names_the_close_section(tmp_path: Path) -> None:
    assert "unknown section [wroker]: did you mean [worker]?" in refused(tmp_path, "[wroker]\n")
    listed = refused(tmp_path, "[telegram]\ntoken = 'x'\n")
    assert "unknown section [telegram]: the sections are: owner, redis, model" in listed
    assert "home" not in listed.split("sections are:")[1]  # not a key of the file


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[model.derive]\nmodle = 'x'\n", "unknown key 'modle' in [model.derive]: did you mean"),
        ('[roles]\n"cli:w" = { rol = "pm" }\n', "unknown key 'rol' in [roles.\"cli:w\"]"),
        ("[owner]\naliases = [{ address = 'a', chanel = 'cli' }]\n",
         "unknown key 'chanel' in [owner] aliases item 1: did you mean 'channel'?"),
        ("[matrix]\nhomeservr = 'x'\n", "unknown key 'homeservr' in [matrix]: did you mean"),
    ],
)  # fmt: skip
def test_nested_and_channel_sections_are_named_as_in_the_file(
    tmp_path: Path, text: str, said: str
) -> None:
    message = refused(tmp_path, text)
    assert said in message, message
    assert "Input should be a valid string" not in message  # the union's other member: noise


# -- a file that cannot be read ----------------------------------------------------------------


def test_a_directory_in_place_of_the_file_is_a_one_line_error_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "config.toml").mkdir()
    with pytest.raises(ConfigUnreadable) as exc:
        load_config(tmp_path, env={})
    path = tmp_path / "config.toml"
    assert exc.value.problem == f"{path} is a directory, not a file"
    assert f"mv {path} {path}.d" in exc.value.fix
    assert str(exc.value) == f"{exc.value.problem}: {exc.value.fix}"


def test_a_symbolic_link_to_nothing_is_not_taken_for_no_file(tmp_path: Path) -> None:
    (tmp_path / "config.toml").symlink_to(tmp_path / "gone.toml")
    with pytest.raises(ConfigUnreadable) as exc:
        read_config_bytes(tmp_path)
    assert f"a symbolic link to {tmp_path / 'gone.toml'}, which does not exist" in str(exc.value)
    assert read_config_bytes(tmp_path / "nowhere") is None  # no file at all: the defaults


def test_a_link_that_loops_is_said(tmp_path: Path) -> None:
    (tmp_path / "config.toml").symlink_to(tmp_path / "config.toml")
    with pytest.raises(ConfigUnreadable, match="leads round in a loop"):
        read_config_bytes(tmp_path)


def test_a_file_this_user_may_not_read_says_whose_it_is_and_how_to_give_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root reads any file, so the refusal is injected here (the integration test drops the
    capability for real: tests/integration/test_config_unreadable.py)."""
    path = tmp_path / "config.toml"
    path.write_text(BASE, encoding="utf-8")
    path.chmod(0)

    def denied(self: Path) -> bytes:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ConfigUnreadable) as exc:
        read_config_bytes(tmp_path)
    assert "permission denied" in exc.value.problem and "mode 0000" in exc.value.problem
    user = exc.value.problem.split(" cannot be read by ")[1].split(" ")[0]
    assert f"sudo chown {user} {path} && sudo chmod 600 {path}" in exc.value.fix


# -- a running process keeps its last good configuration ---------------------------------------


@pytest.fixture(autouse=True)
def fresh_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    structlog.reset_defaults()
    monkeypatch.setattr(config_watch, "log", structlog.get_logger(config_watch.__name__))


def look(watch: ConfigWatcher) -> config_watch.Reload | None:
    """Twice: the watcher reads a changed file once its size and times stopped changing."""
    assert watch.check() is None
    return watch.check()


def test_the_watcher_keeps_the_last_good_config_while_the_file_is_a_directory(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(BASE, encoding="utf-8")
    watch = ConfigWatcher(load_config(tmp_path, env={}), process="worker", uses=WORKER_USES,
                          reloadable=WORKER_RELOADS, env={})  # fmt: skip
    digest = watch.digest
    path.unlink()
    path.mkdir()
    with capture_logs() as logs:
        assert look(watch) is None  # no IsADirectoryError out of it
        for _ in range(config_watch.REHASH_EVERY + 1):
            assert watch.check() is None  # looked at again: said once
    [said] = [e for e in logs if e["event"] == "config.unreadable"]
    assert said["log_level"] == "error" and said["process"] == "worker"
    assert said["error"].startswith(f"{path} is a directory, not a file: move it away")
    assert "last good configuration" in said["detail"]
    assert watch.config.owner.name == "Ada"
    assert watch.fields()["config"] == digest  # the bytes it still runs with
    assert watch.fields()["config_error"] == said["error"]
    # put back, with a change: taken, and the error is gone
    path.rmdir()
    path.write_text(BASE.replace("Ada", "Grace"), encoding="utf-8")
    reload = look(watch)
    assert reload is not None and reload.config.owner.name == "Grace"
    assert "config_error" not in watch.fields()
