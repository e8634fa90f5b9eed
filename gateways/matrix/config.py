"""The Matrix channel's section of config.toml (``[matrix]``, ``[matrix.rooms."!id:hs"]``).

A pure module (pydantic only): the channel's spec (gateways/matrix/channel.py) registers it, so
contract/config.py validates ``[matrix]`` with it without importing the gateway."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from contract.channels import ChannelSection

RoomRecord = Literal["all", "addressed"]


class MatrixRoom(BaseModel):
    """``[matrix.rooms."!id:server"]``: how one group room is answered, and what of it is
    recorded: ``all`` (the messages not answered too, as the room's context) or ``addressed``
    (only what the bot answers); unset: ``[matrix] record``."""

    model_config = ConfigDict(extra="forbid")

    policy: str = Field(default="mention", pattern="^(open|mention|allowlist)$")
    allowlist: list[str] = Field(default_factory=list)
    record: RoomRecord | None = None


class MatrixConfig(ChannelSection):
    """``[matrix]``: the Matrix gateway. Without ``homeserver`` and ``user_id`` it is off."""

    SECTION: ClassVar[str] = "matrix"

    homeserver: str | None = None
    user_id: str | None = None
    access_token: SecretStr | None = None
    password: SecretStr | None = None
    device_id: str | None = None
    device_name: str = "relaybot"
    store_path: Path | None = None  # default: $RELAYBOT_HOME/matrix (crypto store, device id)
    owners: list[str] = Field(default_factory=list)  # plus owner aliases that look like @u:hs
    allowlist: list[str] = Field(default_factory=list)  # DMs and invites, besides the owner
    group_policy: str = Field(default="mention", pattern="^(open|mention|allowlist)$")
    group_allowlist: list[str] = Field(default_factory=list)
    # group rooms: messages the bot does not answer (not mentioned, not on the allowlist) are
    # recorded as the room's context ("all") or dropped ("addressed"); per room in rooms
    record: RoomRecord = "all"
    rooms: dict[str, MatrixRoom] = Field(default_factory=dict)
    typing: bool = True
    sync_timeout: float = Field(default=30.0, gt=0)  # seconds a /sync long-poll waits
    timeline_limit: int = Field(default=100, ge=1, le=1000)  # events per room per sync

    @property
    def configured(self) -> bool:
        return bool(self.homeserver and self.user_id)
