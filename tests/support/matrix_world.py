"""The people and processes of the Matrix integration tests: a bot account, its owner, a friend
and a stranger on a real Synapse, and relaybot's environment for them."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import redis

from contract.keys import Keys
from tests.support.procs import Proc, Procs, wait_until, write_config
from tests.support.synapse import MatrixUser, SynapseServer


class World:
    """A bot account, its owner, a friend and a stranger; the worker and gateway env."""

    def __init__(
        self, hs: SynapseServer, env: dict[str, str], r: redis.Redis, keys: Keys, procs: Procs
    ) -> None:
        tag = uuid.uuid4().hex[:6]
        self.hs, self.env, self.r, self.keys, self.procs = hs, env, r, keys, procs
        self.bot = hs.register(f"bot{tag}")
        self.owner = hs.register(f"owner{tag}")
        self.friend = hs.register(f"friend{tag}")
        self.stranger = hs.register(f"stranger{tag}")
        home = Path(env["RELAYBOT_HOME"])
        write_config(
            home,
            f"""
[owner]
name = "Olivia"
aliases = [{{ address = "{self.owner.user_id}", channel = "matrix" }}]

[matrix]
allowlist = ["{self.friend.user_id}"]
group_policy = "mention"
sync_timeout = 2
timeline_limit = 4   # small: a restart after an outage must read the gap back
""",
        )
        env.update(
            RELAYBOT_MATRIX_HOMESERVER=hs.url,
            RELAYBOT_MATRIX_USER_ID=self.bot.user_id,
            RELAYBOT_MATRIX_ACCESS_TOKEN=self.bot.access_token,
        )
        self.db = home / "memory.sqlite3"

    def gateway(self, *, verbose: bool = False) -> Proc:
        args = ["-v", "gateway", "matrix"] if verbose else ["gateway", "matrix"]
        proc = self.procs.start("gateway-matrix", args, self.env)
        proc.wait_for_log("matrix.logged_in", timeout=20)
        return proc

    def joined(self, room_id: str) -> bool:
        return self.hs.members(self.owner, room_id).get(self.bot.user_id) == "join"

    def bot_messages(self, who: MatrixUser, room_id: str) -> list[dict[str, Any]]:
        return [e for e in self.hs.messages(who, room_id) if e["sender"] == self.bot.user_id]

    def wait_bot_messages(
        self, who: MatrixUser, room_id: str, count: int, timeout: float = 20
    ) -> list[dict[str, Any]]:
        return wait_until(
            lambda: m if len(m := self.bot_messages(who, room_id)) >= count else None,
            timeout=timeout,
            interval=0.1,
            message=f"{count} bot message(s) in {room_id}",
        )
