"""One agent turn: ask the model, run the tools it asks for, repeat a bounded number of times.

The turn produces exactly one reply text; tools only read and compute (none of them sends a
message). Model problems never escape as exceptions: they become a reply the user can read,
with ``error=True`` so the caller can mark it as an error reply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import structlog

from worker.model import Completion, ModelError, ModelPort
from worker.tools import ToolRegistry

log = structlog.get_logger(__name__)

EMPTY_ANSWER_TEXT = "Sorry — the model returned an empty answer."


@dataclass(frozen=True)
class TurnResult:
    """What a turn produced.

    ``text`` is the reply (never empty). ``error`` is true when it is an explanation of a
    failure (the model could not be reached, gave an empty answer, or never stopped calling
    tools) rather than the model's answer. ``rounds`` counts the requests made to the model,
    including the final one without tools; ``tool_calls`` counts the tool calls executed.
    """

    text: str
    error: bool
    rounds: int
    tool_calls: int


def _assistant_message(completion: Completion) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": completion.content or "",
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(call.arguments, ensure_ascii=False),
                },
            }
            for call in completion.tool_calls
        ],
    }


def model_error_text(exc: ModelError) -> str:
    """The reply a user sees when the model could not answer (never the endpoint's address:
    the user may be anyone; the worker's log names it)."""
    return f"Sorry — I could not reach the model: {exc.shown}"


def run_turn(
    model: ModelPort,
    messages: list[dict[str, Any]],
    tools: ToolRegistry,
    *,
    max_rounds: int,
) -> TurnResult:
    """Run one bounded turn over ``messages`` (not modified) and return the reply.

    Up to ``max_rounds`` requests offer the tools; every tool call is answered with a
    ``role: tool`` message and the model is asked again. If the model is still calling tools
    after ``max_rounds`` rounds, it is asked once more without tools for a final answer.
    """
    max_rounds = max(1, max_rounds)
    convo = list(messages)
    specs = tools.specs()
    rounds = 0
    executed = 0

    def ask(offer: list[dict[str, Any]]) -> Completion:
        nonlocal rounds
        rounds += 1
        return model.complete(convo, offer)

    def done(text: str, *, error: bool) -> TurnResult:  # the worker logs it (turn.done)
        return TurnResult(text=text, error=error, rounds=rounds, tool_calls=executed)

    try:
        completion: Completion | None = None
        for _ in range(max_rounds):
            completion = ask(specs)
            if not completion.tool_calls:
                break
            convo.append(_assistant_message(completion))
            for call in completion.tool_calls:
                result = tools.call(call.name, call.arguments)
                executed += 1
                convo.append({"role": "tool", "tool_call_id": call.id, "content": result})
            completion = None
        if completion is None:
            # still calling tools after max_rounds: one last request, without tools (no extra
            # instruction message: several chat templates refuse a system message mid-chat)
            log.warning("agent.tool_rounds_exhausted", model=model.name, rounds=rounds)
            completion = ask([])
            if completion.tool_calls and not (completion.content or "").strip():
                return done(
                    f"Sorry — I stopped after {max_rounds} rounds of tool use "
                    "without getting an answer from the model.",
                    error=True,
                )
    except ModelError as exc:
        log.warning("agent.model_error", model=model.name, kind=exc.kind, rounds=rounds)
        return done(model_error_text(exc), error=True)
    except Exception as exc:  # a broken model adapter must not kill the turn either
        log.exception("agent.model_crashed", model=model.name, rounds=rounds)
        return done(
            f"Sorry — something went wrong while asking the model ({type(exc).__name__}).",
            error=True,
        )

    text = (completion.content or "").strip()
    if not text:
        return done(EMPTY_ANSWER_TEXT, error=True)
    return done(text, error=False)
