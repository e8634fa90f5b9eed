"""The worker's per-turn tools (worker.main.TurnTools): built only when the model calls one, and
the specs a turn offers are exactly what building its tools would give, for turns of every shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import Config
from contract.messages import InboundMessage, Privacy
from memory.facade import Memory
from memory.privacy import Scope
from memory.store import MemoryStore
from worker.main import TurnTools, turn_tools
from worker.tools import LazyTools
from worker.turn import memory_settings
from worker.turn_context import TurnContext


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def context(
    store: MemoryStore | None,
    cfg: Config,
    conversation: str,
    privacy: str,
    *,
    entity: str | None = None,
    role: str | None = None,
) -> TurnContext:
    channel = conversation.split(":", maxsplit=1)[0]
    msg = InboundMessage(
        channel=channel,
        session=conversation,
        conversation=conversation,
        sender="someone",
        privacy=Privacy.GROUP if privacy == "bogus" else Privacy(privacy),
        text="hello",
        ts=1.0,
        event_id="e1",
    )
    scope = Scope(conversation=conversation, privacy=privacy, entity=entity)  # type: ignore[arg-type]
    return TurnContext(
        stream_id="1-0", msg=msg, scope=scope, memory=Memory(store, memory_settings(cfg)), role=role
    )


def contexts(store: MemoryStore, cfg: Config) -> list[TurnContext]:
    """Turns of every shape, several per shape, differing in everything else."""
    out = []
    for s in (store, None):
        out += [
            context(s, cfg, "cli:a", "owner"),
            context(s, cfg, "matrix:owner-dm", "owner", role="ops"),
            context(s, cfg, "matrix:dm-bob", "direct", entity="e-bob"),
            context(s, cfg, "email:thread-1", "direct", entity="e-erin", role="sales"),
            context(s, cfg, "matrix:dm-x", "direct"),
            context(s, cfg, "matrix:room", "group"),
            context(s, cfg, "matrix:room-2", "group", role="ops"),
            context(s, cfg, "matrix:odd", "bogus"),  # sees nothing
        ]
    return out


def test_specs_are_what_building_the_tools_gives_for_every_turn(
    store: MemoryStore, tmp_path: Path
) -> None:
    cfg = Config(home=tmp_path, roles={"matrix:room-2": "ops"})
    tools = TurnTools()
    shapes = set()
    for ctx in contexts(store, cfg):
        lazy = tools(ctx)
        assert lazy.specs() == turn_tools(ctx).specs(), ctx.scope
        shapes.add(repr(lazy._shape))  # type: ignore[attr-defined]
    assert len(shapes) >= 6  # owner/direct/group/nothing, with and without memory


def test_tools_are_built_only_when_needed_and_then_work(store: MemoryStore, tmp_path: Path) -> None:
    built = []
    cfg = Config(home=tmp_path)
    ctx = context(store, cfg, "cli:a", "owner")

    def build() -> list:
        built.append(1)
        return list(turn_tools(ctx))

    shared: dict = {}
    first = LazyTools(build, "owner", shared)
    assert first.specs() and built == [1]  # the first of a shape builds once
    second = LazyTools(build, "owner", shared)
    assert second.specs() == first.specs() and built == [1]  # the next one does not
    assert second.call("clock", {}).endswith("UTC)") and built == [1, 1]
    assert "remember" in second and len(second) == len(first) and built == [1, 1]
    assert second.call("nope", {}).startswith("error: there is no tool named 'nope'")
    specs = second.specs()
    specs.clear()  # a caller's copy: the shared specs are not changed
    assert second.specs() == first.specs()


def test_tools_that_cannot_be_built_are_an_error_string_never_an_exception() -> None:
    attempts = []

    def broken() -> list:
        attempts.append(1)
        raise OSError("the workspace is gone")

    shared: dict = {"owner": [{"type": "function", "function": {"name": "clock"}}]}
    lazy = LazyTools(broken, "owner", shared)
    assert lazy.specs() == shared["owner"]  # the shape's specs are known: no build needed
    got = lazy.call("clock", {})
    assert got == "error: the tools could not be set up: OSError: the workspace is gone"
    assert lazy.call("clock", {}).startswith("error: the tools could not be set up")
    assert attempts == [1, 1]  # tried again, nothing half-registered in between
    with pytest.raises(OSError, match="workspace is gone"):
        LazyTools(broken, "new shape", {}).specs()  # the first turn of a shape: the turn fails
