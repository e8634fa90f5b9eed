"""What a configuration error says, in one line that tells what to do (issue 26).

Two kinds, both pure (no I/O beyond ``stat`` of the file named):

- a ``config.toml`` that cannot be read (a directory, a file the process may not read after a
  ``sudo`` edit, a dangling or looping symbolic link): :func:`unreadable` names the file, what is
  wrong with it and the command that fixes it;
- a key the configuration's model does not know (pydantic's "Extra inputs are not permitted"):
  :func:`describe_errors` names the key, its section, the closest known key, or else the keys
  that section has.

contract/config.py raises :class:`contract.config.ConfigError` with these texts; every process
prints or logs that text as it is (relaybot/cli.py, contract/config_watch.py, relaybot/doctor.py).
"""

from __future__ import annotations

import difflib
import errno
import os
import stat
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

MAX_ERRORS = 5  # errors said in one message (the rest follow once these are fixed)
MAX_LISTED = 24  # keys of a section listed when none is close to the unknown one
_PLAIN = frozenset({"str", "int", "float", "bool"})  # the names pydantic gives plain union members
_NOT_IN_FILE = frozenset({"home"})  # the configuration's fields that are no keys of the file


def _owner_of(path: Path) -> str:
    """``uid N`` (and its name when it has one) of the file's owner; "" when it cannot be told."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    try:
        import pwd

        name = pwd.getpwuid(st.st_uid).pw_name
    except (ImportError, KeyError):
        name = f"uid {st.st_uid}"
    return f"owned by {name}, mode {stat.S_IMODE(st.st_mode):04o}"


def _me() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())


def unreadable(path: Path, exc: OSError) -> tuple[str, str]:
    """Why ``path`` (config.toml) cannot be read, and the fix: ``(problem, fix)``."""
    code = exc.errno
    if code == errno.ENOENT and path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "a file"
        return (
            f"{path} is a symbolic link to {target}, which does not exist",
            f"point it at the configuration file (ln -sfn /path/to/config.toml {path}), or "
            "remove the link to run with the defaults and the environment",
        )
    if code == errno.EISDIR:
        return (
            f"{path} is a directory, not a file",
            f"move it away (mv {path} {path}.d) and put the configuration file there "
            "(relaybot onboard writes one)",
        )
    if code in (errno.EACCES, errno.EPERM):
        whose, me = _owner_of(path), _me()
        return (
            f"{path} cannot be read by {me} (permission denied"
            + (f"; it is {whose})" if whose else ")"),
            f"give it back to the user that runs relaybot: sudo chown {me} {path} && "
            f"sudo chmod 600 {path}",
        )
    if code == errno.ELOOP:
        return (
            f"{path} is a symbolic link that leads round in a loop",
            f"point it at the configuration file (ln -sfn /path/to/config.toml {path})",
        )
    return (
        f"{path} cannot be read ({exc.strerror or exc})",
        "check the file, its permissions and the disk it is on",
    )


# -- unknown keys ------------------------------------------------------------------------------


def _unwrap(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _members(tp: Any) -> tuple[Any, ...]:
    """The types of a union (``X | None``), or the type itself."""
    tp = _unwrap(tp)
    if get_origin(tp) in (Union, types.UnionType):
        return tuple(_unwrap(a) for a in get_args(tp) if a is not type(None))
    return (tp,)


def _model(tp: Any) -> type[BaseModel] | None:
    for member in _members(tp):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _step(tp: Any, part: str | int) -> Any:
    """The type found at ``part`` (a field, a list index, a dict key, a union member's name)
    under ``tp``; None when it cannot be told."""
    for member in _members(tp):
        if isinstance(part, str) and getattr(member, "__name__", None) == part:
            return member  # pydantic names the union member it tried
        if isinstance(member, type) and issubclass(member, BaseModel):
            field = member.model_fields.get(str(part))
            if field is not None:
                return field.annotation
            continue
        origin, args = get_origin(member), get_args(member)
        if origin in (list, tuple, set, frozenset) and args and isinstance(part, int):
            return args[0]
        if origin is dict and len(args) == 2:
            return args[1]
    return None


def _section_name(loc: tuple[str | int, ...], root: type[BaseModel]) -> str:
    """``[worker]``, ``[model.derive]``, ``[roles."cli:work"]``, ``[owner] aliases item 1``."""
    names: list[str] = []
    tail = ""
    tp: Any = root
    for part in loc:
        if isinstance(part, int):  # an item of a list: "[section] key item N"
            tail = f" {names.pop()} item {part + 1}" if names else f" item {part + 1}"
        elif any(getattr(m, "__name__", None) == part for m in _members(tp)):
            pass  # the union member pydantic tried (``OwnerAlias``): not a key of the file
        elif _model(tp) is None:
            names.append(f'"{part}"')  # a key of a table the owner names (a conversation id)
        else:
            names.append(part)
        tp = _step(tp, part)
    return f"[{'.'.join(names)}]{tail}" if names else "the top level"


def _fields(tp: Any) -> dict[str, Any]:
    model = _model(tp)
    return dict(model.model_fields) if model is not None else {}


def _unknown_key(loc: tuple[str | int, ...], root: type[BaseModel]) -> str:
    key = str(loc[-1])
    parent: Any = root
    for part in loc[:-1]:
        parent = _step(parent, part) if parent is not None else None
    known = [k for k in _fields(parent) if not (parent is root and k in _NOT_IN_FILE)]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if len(loc) == 1:
        what = f"unknown section [{key}]"
        hint = f"did you mean [{close[0]}]?" if close else f"the sections are: {_listed(known)}"
        return f"{what}: {hint} (fix or remove it)"
    section = _section_name(loc[:-1], root)
    what = f"unknown key {key!r} in {section}"
    if close:
        return f"{what}: did you mean {close[0]!r}? (fix or remove it)"
    if not known:
        return f"{what}: remove it"
    return f"{what}: the keys of {section} are {_listed(known)} (fix or remove it)"


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:MAX_LISTED])
    return shown + (f" and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else "")


def describe_errors(exc: ValidationError, root: type[BaseModel]) -> str:
    """The validation errors of a configuration, in one line: an unknown key by its name, its
    section and what to write instead; any other error as ``section.key: message``."""
    errors = exc.errors()
    # a value a union refused as each of its types: its plain type's error is noise beside the
    # model's ("owner.aliases.0.str: Input should be a valid string" beside an unknown key)
    tried = {tuple(e["loc"][:-2]) for e in errors if len(e["loc"]) > 1}
    errors = [e for e in errors if not (e["loc"] and e["loc"][-1] in _PLAIN and
                                        tuple(e["loc"][:-1]) in tried)]  # fmt: skip
    parts: list[str] = []
    for err in errors[:MAX_ERRORS]:
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "entry"
        if err["type"] == "extra_forbidden" and loc:
            parts.append(_unknown_key(loc, root))
        elif err["type"] == "missing":
            parts.append(f"missing field: {where}")
        else:
            parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
