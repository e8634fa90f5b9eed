"""The toy gateway: a :class:`gateways.runner.Channel` the shared runner drives.

Its cursor (the lines published) is the Redis key ``<prefix>toy:cursor``, advanced only once
the line's entry is durable, as every gateway's is.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from typing import Any

import redis

from contract.bus import publish
from contract.config import Config
from contract.durable import Durable
from contract.messages import Reply
from gateways.runner import Runtime, TypingHook, run_gateway
from tests.support.toychannel.config import ToyConfig
from tests.support.toychannel.normalize import SESSION, normalize


class ToyGateway:
    name = "toy"
    idempotent_sink = False
    tick = 0.1
    show_typing: TypingHook | None = None

    def __init__(self, cfg: Config, r: redis.Redis, rt: Runtime) -> None:
        self.section, self.r, self.keys, self.rt = ToyConfig.of(cfg), r, cfg.keys, rt
        self.cursor = f"{cfg.keys.prefix}toy:cursor"
        self.durable = Durable(r)

    async def start(self) -> None:
        return None

    def inbound(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {"lines": self._lines()}

    async def _lines(self) -> None:
        while not self.rt.stopping.is_set():
            await asyncio.to_thread(self._publish_new)
            await self.rt.sleep(0.1)

    def _publish_new(self) -> None:
        assert self.section.inbox is not None
        done = int(self.r.get(self.cursor) or 0)  # type: ignore[arg-type]
        lines = self.section.inbox.read_text().splitlines() if self.section.inbox.exists() else []
        for number, line in enumerate(lines[done:], start=done):
            publish(self.r, self.keys, normalize(line, number, self.section.sender),
                    durable=self.durable)  # fmt: skip
            self.r.set(self.cursor, number + 1)

    async def sessions(self) -> list[str]:
        return [SESSION]

    async def send(self, reply: Reply) -> None:
        assert self.section.outbox is not None
        with self.section.outbox.open("a") as out:
            out.write(reply.text.replace("\n", " ") + "\n")

    async def close(self) -> None:
        return None


def run(cfg: Config, r: redis.Redis) -> int:
    """``relaybot gateway toy``."""
    section = ToyConfig.of(cfg)
    make = functools.partial(ToyGateway, cfg, r)
    return run_gateway("toy", cfg, r, configured=section.configured, hint="set [toy]", make=make)
