"""The tool registry and the built-in clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from worker.tools import (
    MAX_RESULT_CHARS,
    Tool,
    ToolRegistry,
    clock_tool,
    default_tools,
)

FIXED = datetime(2025, 1, 15, 12, 30, 45, 123456, tzinfo=UTC)


def echo_tool(**schema_extra):
    schema = {
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "times": {"type": "integer"},
            "mode": {"type": "string", "enum": ["loud", "quiet"]},
        },
        "required": ["text"],
        "additionalProperties": False,
        **schema_extra,
    }
    return Tool(
        name="echo",
        description="Echo the text.",
        parameters=schema,
        handler=lambda args: args["text"] * int(args.get("times", 1)),
    )


def test_specs_are_openai_function_tools():
    registry = ToolRegistry([echo_tool()])
    (spec,) = registry.specs()
    assert spec == {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Echo the text.",
            "parameters": echo_tool().parameters,
        },
    }
    assert ToolRegistry().specs() == []


def test_call_runs_the_handler():
    registry = ToolRegistry([echo_tool()])
    assert registry.call("echo", {"text": "ab", "times": 2}) == "abab"
    assert registry.call("echo", {"text": "ab", "times": 2.0}) == "abab"  # 2.0 is an integer


def test_unknown_tool_is_an_error_string():
    result = ToolRegistry([echo_tool()]).call("launch", {})
    assert result.startswith("error:")
    assert "launch" in result
    assert "echo" in result  # says what is available


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({}, "missing required argument(s): text"),
        ({"text": 3}, "'text' must be of type string"),
        ({"text": "a", "times": True}, "'times' must be of type integer"),
        ({"text": "a", "times": 1.5}, "'times' must be of type integer"),
        ({"text": "a", "mode": "shout"}, "'mode' must be one of"),
        ({"text": "a", "colour": "red"}, "unknown argument(s): colour"),
        (["text"], "must be a JSON object"),
        (None, "must be a JSON object"),
    ],
)
def test_bad_arguments_are_error_strings(arguments, fragment):
    result = ToolRegistry([echo_tool()]).call("echo", arguments)
    assert result.startswith("error: bad arguments for echo:")
    assert fragment in result


def test_handler_exception_is_an_error_string():
    def broken(args):
        raise RuntimeError("disk on fire")

    registry = ToolRegistry([Tool("broken", "Fails.", {"type": "object"}, broken)])
    result = registry.call("broken", {})
    assert result == "error: tool broken failed: RuntimeError: disk on fire"


def test_long_results_are_clipped():
    registry = ToolRegistry([Tool("big", "Big.", {"type": "object"}, lambda a: "x" * 20_000)])
    result = registry.call("big", {})
    assert len(result) < 20_000
    assert result.startswith("x" * MAX_RESULT_CHARS)
    assert "more characters cut" in result


def test_registration_rules():
    registry = ToolRegistry([echo_tool()])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(echo_tool())
    with pytest.raises(ValueError, match="must match"):
        Tool("has space", "x", {"type": "object"}, lambda a: "")
    with pytest.raises(ValueError, match="JSON schema object"):
        Tool("arr", "x", {"type": "array"}, lambda a: "")
    assert "echo" in registry
    assert len(registry) == 1
    assert registry.names == ["echo"]
    assert registry.get("echo") is not None
    assert registry.get("nope") is None


def test_default_tools_is_just_the_clock():
    registry = default_tools()
    assert registry.names == ["clock"]
    spec = registry.specs()[0]["function"]
    assert spec["parameters"]["properties"]["timezone"]["type"] == "string"


def test_clock_utc_iso():
    registry = ToolRegistry([clock_tool(lambda: FIXED)])
    assert registry.call("clock", {}) == "2025-01-15T12:30:45+00:00 (Wednesday, UTC)"
    assert registry.call("clock", {"timezone": "UTC"}).startswith("2025-01-15T12:30:45+00:00")


def test_clock_real_time_is_now():
    result = default_tools().call("clock", {})
    stamp = datetime.fromisoformat(result.split(" ")[0])
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 5


def test_clock_in_a_time_zone():
    registry = ToolRegistry([clock_tool(lambda: FIXED)])
    result = registry.call("clock", {"timezone": "Europe/Berlin"})
    assert result.startswith("2025-01-15T13:30:45+01:00 (Wednesday, Europe/Berlin)")
    assert "UTC 2025-01-15T12:30:45+00:00" in result
    tokyo = registry.call("clock", {"timezone": "Asia/Tokyo"})
    assert tokyo.startswith("2025-01-15T21:30:45+09:00")


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../../etc/passwd", "/etc/passwd", "Europe"])
def test_clock_unknown_zone_is_an_error_string(zone):
    result = ToolRegistry([clock_tool(lambda: FIXED)]).call("clock", {"timezone": zone})
    assert result.startswith("error: unknown time zone")
    assert "IANA" in result


def test_clock_rejects_wrong_types():
    result = default_tools().call("clock", {"timezone": 1})
    assert result.startswith("error: bad arguments for clock")
