"""What the privacy property tests share (tests/unit/test_privacy_invariant.py, and its run on
the production path, tests/integration/test_privacy_invariant_production.py): the people and
their handles, the unique words every message carries, how the gateways are set up, and the
scripted model's behaviour (it searches and recalls words of every conversation, asks for the
profile of everyone, remembers what it saw, and quotes all of it)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from gateways.email.parse import Addresses
from gateways.matrix.events import GroupPolicy, Policy
from worker.model import Completion, ToolCall

OWNER = "ada"
PEOPLE = ("bob", "carol", "dave")
EVERYONE = (OWNER, *PEOPLE)
BOT_MX, BOT_MAIL = "@bot:m.org", "bot@example.org"
WORD = re.compile(r"\bzq[a-z]+\b")
# the tools' echo of the model's own query: not something it was shown
ECHO = re.compile(r"query: [^\n]*?, by (relevance|time)|for query '[^']*'")


def mx(person: str) -> str:
    return f"@{person}:m.org"


def mail(person: str) -> str:
    return f"{person}@example.org"


def word(n: int) -> str:
    """The n-th unique word (``zqa``, ``zqb``, ...): one per message, so the oracle knows
    where every word a turn was shown comes from."""
    letters = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        letters = chr(97 + r) + letters
    return f"zq{letters}"


def matrix_policy() -> Policy:
    """The Matrix gateway's policy: the owner, everyone allowlisted, open group rooms."""
    return Policy(
        own_user_id=BOT_MX,
        owners=frozenset({mx(OWNER)}),
        dm_allowlist=frozenset(mx(p) for p in PEOPLE),
        group_policy=GroupPolicy.OPEN,
    )


def mail_addresses() -> Addresses:
    """The e-mail gateway's addresses: the owner, anyone answered, every From believed."""
    return Addresses(
        own=frozenset({BOT_MAIL}),
        owner=frozenset({mail(OWNER)}),
        allow_all=True,
        trust_mailbox=True,
    )


def shown(messages: Sequence[dict[str, Any]]) -> str:
    """What the model is shown: the context and the tool results, less its own tool calls and
    the tools' echo of its queries."""
    return ECHO.sub(
        "", json.dumps([m.get("content") for m in messages if m.get("role") != "assistant"])
    )


def scripted(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
             text: str, known: Sequence[str]) -> Completion:  # fmt: skip
    """One answer of the scripted model: first a search and a recall for ``known`` words and a
    ``remember`` of every word it was shown (``text``), then a reply quoting all of them."""
    names = {t["function"]["name"] for t in tools}
    if messages[-1].get("role") != "tool":
        calls = []
        if "search_history" in names and known:
            query = " OR ".join(known)
            calls.append(ToolCall(id="s", name="search_history", arguments={"query": query}))
        if "recall" in names and known:
            calls.append(ToolCall(id="r", name="recall", arguments={"query": " ".join(known)}))
        if "profile" in names:  # the people of the conversation, then everyone by a handle
            calls.append(ToolCall(id="p", name="profile", arguments={}))
            calls += [
                ToolCall(id=f"p-{ref}", name="profile", arguments={"entity": ref})
                for ref in ("owner", *(mx(p) for p in PEOPLE), *(mail(p) for p in PEOPLE))
            ]
        said = sorted(set(WORD.findall(text)))
        if "remember" in names and said:
            args = {"text": "seen " + " ".join(said), "scope": "shared", "visibility": "public"}
            if "memory_write" in names:  # the owner's own conversation: private by default
                args = {"text": "seen " + " ".join(said)}
            calls.append(ToolCall(id="m", name="remember", arguments=args))
        if calls:
            return Completion(tool_calls=calls, finish_reason="tool_calls")
    quoted = " ".join(sorted(set(WORD.findall(text))))
    return Completion(content=f"I saw: {quoted}", finish_reason="stop")
