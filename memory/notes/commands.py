"""The owner's note commands, applied by the worker: ``notes.add`` and ``notes.supersede``.

``relaybot memory notes add|supersede`` sends them (relaybot/cli_notes.py). The owner's notes
are written like the model's (memory/notes/write.py), with the owner as author and the command's
entry as ``op_key``, so a replayed command adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.messages import Privacy
from memory.command_types import CommandContext, CommandError, Handler
from memory.notes.model import Note, NoteDraft, NoteError, Source
from memory.notes.read import get_note, note_by_op_key
from memory.notes.write import draft_from, write_note


def _owner_source(ctx: CommandContext) -> Source:
    return Source(
        op_key=f"cmd:{ctx.stream_id}",
        author="owner",
        privacy=Privacy.OWNER.value,
        entity="owner",
        stream_id=ctx.stream_id,
    )


def _result(note: Note, *, created: bool) -> dict[str, Any]:
    return {"note": note.as_dict(), "created": created}


def _owner_write(ctx: CommandContext, draft: Callable[[], NoteDraft]) -> dict[str, Any]:
    """Write the note ``draft`` makes, as the owner's; a NoteError is the command's error."""
    try:
        note, created = write_note(ctx.store, draft(), _owner_source(ctx), now=ctx.now)
    except NoteError as exc:
        raise CommandError(str(exc)) from None
    return _result(note, created=created)


def _cmd_add(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    def draft() -> NoteDraft:
        if args.get("supersedes") is not None:
            raise NoteError("use notes.supersede to supersede a note")
        return draft_from({"visibility": "private", **args})  # public only when asked for

    return _owner_write(ctx, draft)


def _cmd_supersede(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    args = dict(args)
    target = args.pop("id", None)
    if not isinstance(target, int) or isinstance(target, bool) or target <= 0:
        raise CommandError("notes.supersede needs the id of the note to supersede")
    done = note_by_op_key(ctx.store, _owner_source(ctx).op_key)
    if done is not None:  # a replay: the new version is already written
        return _result(done, created=False)

    def draft() -> NoteDraft:
        base = get_note(ctx.store, target)
        if base is None:
            raise NoteError(f"there is no note #{target}")
        args.pop("supersedes", None)
        return draft_from(args, base)

    return _owner_write(ctx, draft)


COMMANDS: dict[str, Handler] = {"notes.add": _cmd_add, "notes.supersede": _cmd_supersede}
