"""Every setting by environment, one rule: ``RELAYBOT_<SECTION>__<KEY>``.

A variable named ``RELAYBOT_`` followed by the key's path in config.toml, its parts joined by a
double underscore, in capitals, sets that key: ``RELAYBOT_OWNER__ALIASES``,
``RELAYBOT_EMAIL__ALLOWLIST``, ``RELAYBOT_MATRIX__GROUP_POLICY``, ``RELAYBOT_REDIS__CA_FILE``,
``RELAYBOT_MODEL__DERIVE__MODEL``. Its value is read as the key's type reads it:

- a value that starts with ``[`` or ``{`` is JSON (``[{"address": "ada@example.org",
  "channel": "email"}]``, ``{"!room:hs": {"policy": "open"}}``);
- otherwise a list key takes comma-separated items (``ada@example.org,@ada:example.org``);
- any other key takes the text as config.toml would (``true``, ``60``, ``/etc/ca.pem``).

An empty value sets nothing. A variable of this form that names no key (a typo) is a
:class:`~contract.config.ConfigError` naming the variable and the closest key: a setting that
silently does nothing is how a gateway ends up recording mail it never answers.
"""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

PREFIX = "RELAYBOT_"
SEP = "__"


class EnvError(ValueError):
    """A ``RELAYBOT_<SECTION>__<KEY>`` variable that names no key or holds an unreadable value."""


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> ``X`` (the one non-None member of an optional)."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _model_of(annotation: Any) -> type[BaseModel] | None:
    inner = _unwrap(annotation)
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        return inner
    return None


def _closest(word: str, known: list[str]) -> str:
    near = difflib.get_close_matches(word, known, n=1)
    return f" (did you mean {near[0]}?)" if near else f"; it has {', '.join(sorted(known))}"


def path_of(var: str, root: type[BaseModel]) -> tuple[tuple[str, ...], Any]:
    """The key a variable names (its path from the top of config.toml) and that key's type."""
    parts = [p.lower() for p in var[len(PREFIX) :].split(SEP)]
    if any(not p for p in parts):
        raise EnvError(f"{var}: an empty part between double underscores")
    model: type[BaseModel] = root
    path: tuple[str, ...] = ()
    annotation: Any = None
    for i, part in enumerate(parts):
        fields = model.model_fields
        names = [n for n in fields if i or _model_of(fields[n].annotation) is not None]
        if part not in names:
            where = f"[{'.'.join(path)}] has no key" if path else "there is no section"
            raise EnvError(f"{var}: {where} {part!r}{_closest(part, names)}")
        path += (part,)
        annotation = fields[part].annotation
        inner = _model_of(annotation)
        if i < len(parts) - 1:
            if inner is None:
                raise EnvError(f"{var}: {'.'.join(path)} is not a table")
            model = inner
    if len(path) == 1:  # a whole section: name one of its keys
        raise EnvError(f"{var}: names the section [{path[0]}]; add __<KEY> for one of its keys")
    return path, annotation


def value_of(var: str, raw: str, annotation: Any) -> Any:
    """The text of a variable as its key's type reads it (see the module's docstring)."""
    text = raw.strip()
    if text[:1] in ("[", "{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise EnvError(f"{var}: starts like JSON but is not valid JSON ({exc})") from None
    inner = _unwrap(annotation)
    origin = get_origin(inner)
    if origin in (list, tuple, set, frozenset) or inner in (list, tuple, set, frozenset):
        return [item.strip() for item in text.split(",") if item.strip()]
    if origin is dict or inner is dict or _model_of(inner) is not None:
        raise EnvError(f"{var}: a table: give it as a JSON object ({{...}})")
    return raw


def apply(
    data: dict[str, Any], env: Mapping[str, str], root: type[BaseModel]
) -> dict[tuple[str, str], str]:
    """Set in ``data`` (config.toml's tables) every key a ``RELAYBOT_<SECTION>__<KEY>``
    variable of ``env`` names; returns ``(section, key) -> variable`` for each key set."""
    set_by: dict[tuple[str, str], str] = {}
    for var in sorted(env):
        raw = env[var]
        if not var.startswith(PREFIX) or SEP not in var[len(PREFIX) :] or not raw:
            continue
        path, annotation = path_of(var, root)
        table = data
        for part in path[:-1]:
            below = table.get(part)
            if not isinstance(below, dict):
                below = table[part] = {}
            table = below
        table[path[-1]] = value_of(var, raw, annotation)
        set_by[(path[0], path[1])] = var
    return set_by
