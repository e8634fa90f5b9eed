"""``[mcp.servers.NAME]`` (contract/mcp_config.py, issue 29): what a server's table may say, and
one line that says what to write for each mistake (the house style of contract/config_errors.py:
the file, the key, why, what to write)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.config import ConfigError, parse_config
from contract.mcp_config import MAX_SERVER_NAME, McpServerConfig, server_name_problem
from contract.messages import Privacy


def servers(tmp_path: Path, text: str) -> dict[str, McpServerConfig]:
    return parse_config(text.encode(), tmp_path, {}).mcp.servers


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(text.encode(), tmp_path, {})
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'config.toml'}: ")
    return message


def test_no_mcp_section_means_no_servers(tmp_path: Path) -> None:
    assert servers(tmp_path, "") == {}


def test_a_stdio_server_with_its_defaults(tmp_path: Path) -> None:
    got = servers(tmp_path, '[mcp.servers.files]\ncommand = ["python3", "-m", "srv"]\n')
    files = got["files"]
    assert files.command == ["python3", "-m", "srv"]
    assert files.url is None
    assert files.env == {}
    assert files.audiences == [Privacy.OWNER]  # the owner's own conversations only
    assert files.tools is None  # every tool the server lists
    assert files.timeout == 30.0
    assert files.offered_to(Privacy.OWNER)
    assert not files.offered_to(Privacy.DIRECT)
    assert not files.offered_to(Privacy.GROUP)


def test_an_http_server_with_every_key(tmp_path: Path) -> None:
    got = servers(
        tmp_path,
        '[mcp.servers.weather]\nurl = "https://127.0.0.1:8931/mcp"\n'
        'audiences = ["group", "owner", "group"]\ntools = ["forecast", "forecast", "now"]\n'
        "timeout = 2.5\n",
    )
    weather = got["weather"]
    assert weather.command is None
    assert weather.url == "https://127.0.0.1:8931/mcp"
    assert weather.audiences == [Privacy.GROUP, Privacy.OWNER]  # each once, as written
    assert weather.tools == ["forecast", "now"]
    assert weather.timeout == 2.5
    assert weather.offered_to(Privacy.GROUP)
    assert not weather.offered_to(Privacy.DIRECT)


def test_env_values_are_secrets_never_shown(tmp_path: Path) -> None:
    cfg = parse_config(
        b'[mcp.servers.gh]\ncommand = ["gh-mcp"]\nenv = { GITHUB_TOKEN = "ghp_s3cret" }\n',
        tmp_path,
        {},
    )
    token = cfg.mcp.servers["gh"].env["GITHUB_TOKEN"]
    assert token.get_secret_value() == "ghp_s3cret"
    assert "ghp_s3cret" not in repr(cfg.mcp)
    assert "ghp_s3cret" not in cfg.mcp.model_dump_json()


def test_servers_may_be_set_from_the_environment(tmp_path: Path) -> None:
    env = {"RELAYBOT_MCP__SERVERS": '{"files": {"command": ["srv"], "audiences": ["direct"]}}'}
    got = parse_config(None, tmp_path, env).mcp.servers
    assert got["files"].audiences == [Privacy.DIRECT]


# -- one transport -------------------------------------------------------------------------------


def test_neither_command_nor_url(tmp_path: Path) -> None:
    message = refused(tmp_path, "[mcp.servers.files]\ntimeout = 5\n")
    assert "mcp.servers.files: " in message
    assert "neither command nor url" in message
    assert "command = [...]" in message and 'url = "http://..."' in message


def test_both_command_and_url(tmp_path: Path) -> None:
    message = refused(
        tmp_path, '[mcp.servers.files]\ncommand = ["srv"]\nurl = "http://127.0.0.1:1/mcp"\n'
    )
    assert "both command and url" in message and "keep one" in message


def test_a_command_written_as_one_string_is_told_to_be_a_list_without_its_arguments(
    tmp_path: Path,
) -> None:
    """The message names the program, not the arguments: one may be a secret, and a rejected
    config's message reaches the heartbeat (issue 29's privacy review)."""
    text = "[mcp.servers.files]\ncommand = \"mcp-gh --api-key ARGSECRET55 '/my notes'\"\n"
    message = refused(tmp_path, text)
    assert "mcp.servers.files.command: " in message
    assert '["mcp-gh", ... (3 more, each in quotes)]' in message
    assert "ARGSECRET55" not in message and "my notes" not in message


def test_an_unclosed_quote_in_a_command_string_is_still_one_line(tmp_path: Path) -> None:
    message = refused(tmp_path, '[mcp.servers.files]\ncommand = "srv \'x"\n')
    assert "command is a list" in message


@pytest.mark.parametrize(
    ("command", "words"),
    [("[]", "command is empty"), ('["", "x"]', "the program) is empty"),
     ('["srv", "a\\u0000b"]', "NUL")],
)  # fmt: skip
def test_a_bad_command(tmp_path: Path, command: str, words: str) -> None:
    assert words in refused(tmp_path, f"[mcp.servers.files]\ncommand = {command}\n")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://127.0.0.1/mcp", "not http:// or https://"),
        ("127.0.0.1:8931/mcp", "not http:// or https://"),
        ("http:///mcp", "names no host"),
        ("http://127.0.0.1:99999/mcp", "port is not a number"),
        ("http://127.0.0.1:0/mcp", "port is not a number"),
        ("http://127.0.0.1/m cp", "space or a control character"),
        ("http://127.0.0.1/\u200bmcp", "invisible character"),
    ],
)
def test_a_bad_url_is_refused_without_showing_it(tmp_path: Path, url: str, words: str) -> None:
    secret_url = url + ("&" if "?" in url else "?") + "token=tok_s3cret"
    message = refused(tmp_path, f'[mcp.servers.web]\nurl = "{secret_url}"\n')
    assert "mcp.servers.web.url: " in message
    assert words in message
    assert "tok_s3cret" not in message


def test_env_is_only_for_a_started_server(tmp_path: Path) -> None:
    message = refused(
        tmp_path, '[mcp.servers.web]\nurl = "http://127.0.0.1:1/mcp"\nenv = { A = "b" }\n'
    )
    assert "env is set for a url server" in message


def test_env_names_must_be_variable_names(tmp_path: Path) -> None:
    message = refused(tmp_path, '[mcp.servers.files]\ncommand = ["srv"]\nenv = { "1A" = "b" }\n')
    assert "mcp.servers.files.env: " in message and "'1A'" in message


# -- audiences, allowlist, timeout ---------------------------------------------------------------


def test_an_unknown_audience_names_the_three(tmp_path: Path) -> None:
    message = refused(tmp_path, '[mcp.servers.files]\ncommand = ["srv"]\naudiences = ["all"]\n')
    assert "mcp.servers.files.audiences" in message
    assert "'owner', 'direct' or 'group'" in message


def test_no_audience_is_refused_not_taken_for_everyone(tmp_path: Path) -> None:
    message = refused(tmp_path, '[mcp.servers.files]\ncommand = ["srv"]\naudiences = []\n')
    assert "audiences is empty" in message


def test_an_empty_allowlist_is_refused_not_taken_for_all(tmp_path: Path) -> None:
    message = refused(tmp_path, '[mcp.servers.files]\ncommand = ["srv"]\ntools = []\n')
    assert "tools is empty" in message and "leave it out" in message
    assert "empty name" in refused(tmp_path, '[mcp.servers.f]\ncommand = ["s"]\ntools = [" "]\n')


@pytest.mark.parametrize("timeout", ["0", "-1", "3601"])
def test_a_timeout_out_of_range(tmp_path: Path, timeout: str) -> None:
    message = refused(tmp_path, f'[mcp.servers.files]\ncommand = ["srv"]\ntimeout = {timeout}\n')
    assert "mcp.servers.files.timeout: " in message


def test_an_unknown_key_in_a_server_names_the_close_one(tmp_path: Path) -> None:
    message = refused(tmp_path, '[mcp.servers.files]\ncomand = ["srv"]\n')
    assert "unknown key 'comand' in [mcp.servers.\"files\"]: did you mean 'command'?" in message
    assert "did you mean 'servers'?" in refused(tmp_path, '[mcp.server.files]\ncommand = ["s"]\n')


# -- the server's name: the prefix of its tools' names ------------------------------------------


@pytest.mark.parametrize("name", ["files", "home-assistant", "a", "0day", "x" * MAX_SERVER_NAME])
def test_names_a_prefix_may_hold(tmp_path: Path, name: str) -> None:
    assert server_name_problem(name) is None
    assert name in servers(tmp_path, f'[mcp.servers."{name}"]\ncommand = ["srv"]\n')


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("home_assistant", "'home-assistant'"),  # an underscore would make NAME_tool ambiguous
        ("Files", "'files'"),
        ("a b", "'a-b'"),
        ("-files", "'files'"),
        ("fïles", ""),  # not ASCII: a model API refuses it
        ("files\u200b", ""),
        ("../etc", "'etc'"),
    ],
)
def test_names_that_cannot_prefix_a_tool_name(tmp_path: Path, name: str, hint: str) -> None:
    message = refused(tmp_path, f'[mcp.servers."{name}"]\ncommand = ["srv"]\n')
    assert "mcp.servers: " in message
    assert "lowercase letters, digits and hyphens" in message
    assert hint in message


def test_an_empty_or_long_name(tmp_path: Path) -> None:
    assert "empty" in refused(tmp_path, '[mcp.servers.""]\ncommand = ["srv"]\n')
    long = "x" * (MAX_SERVER_NAME + 1)
    message = refused(tmp_path, f'[mcp.servers."{long}"]\ncommand = ["srv"]\n')
    assert f"is {MAX_SERVER_NAME + 1} characters long: at most {MAX_SERVER_NAME}" in message


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('url = "http://h:1/mcp"\nheaders = { "Authorization: Bearer k3y" = "" }',
         "not HTTP header names"),
        ('url = "http://h:1/mcp"\nheaders = { Authorization = "k3y\\r\\nX-Evil: 1" }',
         "line break"),
        ('url = "http://h:1/mcp"\nheaders = { Mcp-Session-Id = "k3y" }', "set by the MCP"),
        ('command = ["srv"]\nheaders = { Authorization = "k3y" }',
         "headers are set for a command"),
    ],
)  # fmt: skip
def test_headers_are_http_headers_for_a_url_server_only(
    tmp_path: Path, table: str, said: str
) -> None:
    message = refused(tmp_path, f"[mcp.servers.web]\n{table}\n")
    assert said in message, message
    assert "k3y" not in message  # a header's value is a secret, even a refused one


def test_a_header_s_value_is_a_secret(tmp_path: Path) -> None:
    [cfg] = servers(
        tmp_path,
        '[mcp.servers.web]\nurl = "http://h:1/mcp"\nheaders = { Authorization = "Bearer k3y" }\n',
    ).values()
    assert "k3y" not in repr(cfg) and "k3y" not in str(cfg.model_dump())
    assert cfg.headers["Authorization"].get_secret_value() == "Bearer k3y"


def test_result_chars_is_bounded_by_what_any_tool_s_result_may_be(tmp_path: Path) -> None:
    assert parse_config(b"", tmp_path, {}).mcp.result_chars == 12_000
    assert parse_config(b"[mcp]\nresult_chars = 4000\n", tmp_path, {}).mcp.result_chars == 4000
    for bad in ("100", "20000"):
        message = refused(tmp_path, f"[mcp]\nresult_chars = {bad}\n")
        assert "result_chars" in message, message
