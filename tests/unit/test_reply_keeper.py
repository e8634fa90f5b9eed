"""Whether Redis holds a reply is read in one step (worker/replies.py ``ReplyKeeper.held``).

A gateway moves a reply from its queue to in flight, marks it delivered and drops it from in
flight (gateways/deliver.py), each an atomic command of its own, so at every instant the reply is
in one of the three. Read one by one, the worker's checks could each look where the reply no
longer is, and the reconciliation after a restart queued it again: delivered twice (found by the
adversarial review of issue 25, after a double SIGTERM and a restart)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

import fakeredis

from contract.keys import Keys
from contract.messages import Reply
from memory.turns import Memory
from worker.replies import ReplyKeeper

KEYS = Keys("t:")
SESSION = "cli:s6"


class GatewayBetweenCommands(fakeredis.FakeRedis):
    """A Redis where the gateway takes one step of its delivery before each command the worker
    sends on its own (a transaction's commands go together: they are not interleaved)."""

    steps: ClassVar[list[Callable[[], object]]] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.steps:
            self.steps.pop(0)()
        return super().execute_command(*args, **options)


def delivery_steps(r: fakeredis.FakeRedis, raw: str, reply_id: str) -> list[Callable[[], object]]:
    queue, inflight = KEYS.reply(SESSION), KEYS.inflight(SESSION)
    plain = fakeredis.FakeRedis(server=r.connection_pool.connection_kwargs["server"])
    return [
        lambda: plain.lmove(queue, inflight, "LEFT", "RIGHT"),
        lambda: plain.zadd(KEYS.delivered(SESSION), {reply_id: 1.0}),
        lambda: plain.lrem(inflight, 1, raw),
    ]


def test_a_reply_being_delivered_is_held_whichever_step_the_gateway_is_at() -> None:
    server = fakeredis.FakeServer()
    r = GatewayBetweenCommands(server=server)
    reply = Reply(reply_id="98e62af4", answers="cli/1-0", channel="cli", session=SESSION,
                  conversation=SESSION, text="echo: msg-0006", created=0.0)  # fmt: skip
    raw = reply.to_json()
    r.rpush(KEYS.reply(SESSION), raw)
    keeper = ReplyKeeper(
        r, KEYS, cast(Memory, None), now=lambda: 0.0, max_age=3600.0, queue=lambda _: None
    )
    GatewayBetweenCommands.steps = delivery_steps(r, raw, reply.reply_id)
    try:
        assert keeper.held(reply)
    finally:
        GatewayBetweenCommands.steps = []
    # and it is held once the gateway is done: marked delivered
    assert keeper.held(reply)
    assert not keeper.held(reply.model_copy(update={"reply_id": "another"}))
