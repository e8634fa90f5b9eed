"""In-process fakes of our own ports (not of client libraries)."""

from __future__ import annotations

import threading
from typing import Any

from worker.model import Completion, ModelError


class InstantModel:
    """A ModelPort that answers at once: ``echo: <last user message>``; counts its calls.

    ``fail_with`` makes every call raise ModelError (to test error replies).
    """

    name = "instant"

    def __init__(self, *, fail_with: str | None = None) -> None:
        self.calls = 0
        self.fail_with = fail_with
        self.seen: list[list[dict[str, Any]]] = []
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        with self._lock:
            self.calls += 1
        self.seen.append(messages)
        if self.fail_with is not None:
            raise ModelError(self.fail_with)
        return Completion(content=f"echo: {messages[-1]['content']}", finish_reason="stop")

    def close(self) -> None:
        pass
