"""The agent's bounded tool loop, against an in-process scripted model."""

from __future__ import annotations

import copy
import json
from typing import Any

from contract.config import ModelConfig
from worker.agent import EMPTY_ANSWER_TEXT, TurnResult, run_turn
from worker.model import Completion, ModelError, ModelPort, NoModel, ToolCall
from worker.openai_client import make_model
from worker.tools import Tool, ToolRegistry

USER = [
    {"role": "system", "content": "You are a test."},
    {"role": "user", "content": "[cli / owner] 2025-01-01 10:00: what time is it?"},
]


class ScriptedModel:
    """Answers from a list of Completions / exceptions and records what it was asked."""

    name = "scripted"

    def __init__(self, *script: Completion | Exception) -> None:
        self.script = list(script)
        self.asked: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    def complete(self, messages, tools):
        self.asked.append((copy.deepcopy(messages), copy.deepcopy(tools)))
        if not self.script:
            raise AssertionError("the model was asked more often than scripted")
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def text(content: str | None) -> Completion:
    return Completion(content=content, tool_calls=[], finish_reason="stop")


def calls(*pairs: tuple[str, dict[str, Any]]) -> Completion:
    return Completion(
        content=None,
        tool_calls=[
            ToolCall(id=f"call_{i}", name=name, arguments=args)
            for i, (name, args) in enumerate(pairs)
        ],
        finish_reason="tool_calls",
    )


def registry() -> ToolRegistry:
    return ToolRegistry(
        [
            Tool(
                "clock",
                "Time.",
                {"type": "object", "properties": {}},
                lambda a: "2025-01-01T10:00:00+00:00",
            ),
            Tool(
                "add",
                "Add.",
                {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
                lambda a: str(a["a"] + a["b"]),
            ),
        ]
    )


def test_scripted_model_satisfies_the_port():
    assert isinstance(ScriptedModel(), ModelPort)
    assert isinstance(NoModel(), ModelPort)


def test_plain_answer_in_one_round():
    model = ScriptedModel(text("It is ten."))
    original = copy.deepcopy(USER)
    result = run_turn(model, USER, registry(), max_rounds=3)
    assert result == TurnResult(text="It is ten.", error=False, rounds=1, tool_calls=0)
    assert original == USER  # the caller's list is not modified
    messages, tools = model.asked[0]
    assert messages == USER
    assert [t["function"]["name"] for t in tools] == ["clock", "add"]


def test_tool_round_trip():
    model = ScriptedModel(calls(("clock", {}), ("add", {"a": 2, "b": 3})), text("done"))
    result = run_turn(model, USER, registry(), max_rounds=3)
    assert result == TurnResult(text="done", error=False, rounds=2, tool_calls=2)
    second, tools = model.asked[1]
    assert tools  # tools are still offered in the second round
    assert second[: len(USER)] == USER
    assistant, tool1, tool2 = second[len(USER) :]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == ""
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_0", "call_1"]
    assert assistant["tool_calls"][1]["type"] == "function"
    assert assistant["tool_calls"][1]["function"]["name"] == "add"
    assert json.loads(assistant["tool_calls"][1]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert tool1 == {
        "role": "tool",
        "tool_call_id": "call_0",
        "content": "2025-01-01T10:00:00+00:00",
    }
    assert tool2 == {"role": "tool", "tool_call_id": "call_1", "content": "5"}


def test_tool_errors_go_back_to_the_model():
    model = ScriptedModel(calls(("launch", {}), ("add", {"a": "x"})), text("sorry"))
    result = run_turn(model, USER, registry(), max_rounds=3)
    assert result.text == "sorry"
    assert not result.error
    tool_messages = [m for m in model.asked[1][0] if m["role"] == "tool"]
    assert tool_messages[0]["content"].startswith("error: there is no tool named 'launch'")
    assert tool_messages[1]["content"].startswith("error: bad arguments for add")


def test_rounds_are_bounded_then_a_final_answer_without_tools():
    model = ScriptedModel(calls(("clock", {})), calls(("clock", {})), text("final answer"))
    result = run_turn(model, USER, registry(), max_rounds=2)
    assert result == TurnResult(text="final answer", error=False, rounds=3, tool_calls=2)
    assert model.asked[0][1]
    assert model.asked[1][1]
    final_messages, final_tools = model.asked[2]
    assert final_tools == []
    assert sum(1 for m in final_messages if m["role"] == "tool") == 2


def test_a_model_that_never_stops_calling_tools_gets_a_clear_text():
    model = ScriptedModel(*[calls(("clock", {}))] * 4)
    result = run_turn(model, USER, registry(), max_rounds=3)
    assert result.error
    assert result.rounds == 4
    assert result.tool_calls == 3
    assert "stopped after 3 rounds of tool use" in result.text
    assert not model.script  # exactly max_rounds + 1 requests


def test_final_answer_with_content_and_stray_tool_calls_keeps_the_content():
    stray = Completion(
        content="Here you go.", tool_calls=[ToolCall(id="x", name="clock", arguments={})]
    )
    model = ScriptedModel(calls(("clock", {})), stray)
    result = run_turn(model, USER, registry(), max_rounds=1)
    assert result.text == "Here you go."
    assert not result.error


def test_model_error_becomes_a_reply():
    model = ScriptedModel(
        ModelError(
            "the model at http://x/v1 timed out after 3 attempts",
            shown="the model timed out after 3 attempts",
        )
    )
    result = run_turn(model, USER, registry(), max_rounds=3)
    assert result.error
    assert result.rounds == 1
    assert (
        result.text == "Sorry — I could not reach the model: the model timed out after 3 attempts"
    )


def test_model_error_after_a_tool_round():
    model = ScriptedModel(calls(("clock", {})), ModelError("boom"))
    result = run_turn(model, USER, registry(), max_rounds=3)
    assert result == TurnResult(
        text="Sorry — I could not reach the model: boom", error=True, rounds=2, tool_calls=1
    )


def test_unexpected_model_crash_becomes_a_reply():
    model = ScriptedModel(KeyError("surprise"))
    result = run_turn(model, USER, registry(), max_rounds=3)
    assert result.error
    assert "KeyError" in result.text


def test_empty_answers_become_a_clear_text():
    for content in (None, "", "   \n"):
        result = run_turn(ScriptedModel(text(content)), USER, registry(), max_rounds=3)
        assert result.text == EMPTY_ANSWER_TEXT
        assert "empty answer" in result.text
        assert result.error


def test_answer_is_stripped():
    result = run_turn(ScriptedModel(text("  hi there \n")), USER, registry(), max_rounds=1)
    assert result.text == "hi there"


def test_no_tools_registered_offers_none():
    model = ScriptedModel(text("ok"))
    run_turn(model, USER, ToolRegistry(), max_rounds=2)
    assert model.asked[0][1] == []


def test_no_model_says_so_plainly():
    model = make_model(ModelConfig())
    assert isinstance(model, NoModel)
    result = run_turn(model, USER, registry(), max_rounds=3)
    assert not result.error
    assert result.rounds == 1
    assert "No model is configured" in result.text
    for hint in ("[model]", "base_url", "api_key", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        assert hint in result.text
    assert "RELAYBOT_MODEL" in result.text
    assert "what time is it" not in result.text  # echoes nothing of the conversation


def test_no_model_says_what_is_missing():
    model = make_model(ModelConfig(base_url="http://127.0.0.1:11434/v1"))
    assert isinstance(model, NoModel)
    completion = model.complete(USER, [])
    assert "base_url is set but model is not" in (completion.content or "")
    assert completion.tool_calls == []
