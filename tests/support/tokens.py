"""The token estimate of a list of chat messages, as memory.context.build_context budgets them
(what the context tests check a context against)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memory.context import MESSAGE_OVERHEAD
from memory.lines import estimate_tokens


def count_tokens(messages: Sequence[Mapping[str, str]]) -> int:
    """The estimate for a list of chat messages, as :func:`build_context` budgets them."""
    return sum(estimate_tokens(m["content"]) + MESSAGE_OVERHEAD for m in messages)
