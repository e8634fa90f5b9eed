"""How long things may take, in one place, so that the waits fit together (pure).

One model request (worker/openai_client.py) is bounded: ``retries + 1`` attempts of at most
``timeout`` seconds each, with exponential backoff waits between them (capped, with jitter).
``relaybot chat`` waits for a reply at least that long by default (:func:`reply_wait`): a model
that fails slowly ends in an error reply the chat prints, not in "no reply within 120 s" while
the worker is still retrying.
"""

from __future__ import annotations

from typing import Protocol

BACKOFF_CAP = 30.0  # seconds; no single exponential backoff wait is longer than this
JITTER = 0.25  # each backoff wait is stretched by a random factor in [1, 1 + JITTER]
CHAT_WAIT_MIN = 120.0  # seconds; a chat never waits less by default (a busy worker, a slow start)
CHAT_MARGIN = 30.0  # seconds over the model's worst case: the queue, the context, the tools


class ModelLimits(Protocol):
    """What of ``[model]`` bounds a request (contract.config.ModelConfig has these)."""

    @property
    def configured(self) -> bool: ...

    timeout: float
    retries: int
    backoff: float


def max_backoff_total(retries: int, backoff: float) -> float:
    """The longest the backoff waits between ``retries + 1`` attempts can add up to."""
    return sum(min(backoff * 2.0**i, BACKOFF_CAP) * (1 + JITTER) for i in range(retries))


def model_deadline(timeout: float, retries: int, backoff: float) -> float:
    """Seconds one model request may take at most, every attempt and wait included."""
    return (retries + 1) * timeout + max_backoff_total(retries, backoff)


def reply_wait(model: ModelLimits) -> float:
    """``relaybot chat``'s default wait for a reply: the model's worst case for a request that
    fails (every attempt timing out, every backoff at its longest) and a margin, never less
    than :data:`CHAT_WAIT_MIN`. Without a model the answer is immediate: the minimum."""
    if not model.configured:
        return CHAT_WAIT_MIN
    worst = model_deadline(model.timeout, model.retries, model.backoff)
    return max(CHAT_WAIT_MIN, worst + CHAT_MARGIN)
