"""The owner's time zone: which one, and a time shown in it (pure but for reading the system's
zone, imports nothing of ours).

``[owner] timezone`` is an IANA name (``Europe/Berlin``). When it is not set, the system's zone
is used, found in this order: the ``TZ`` variable (an IANA name, ``:Europe/Berlin`` too), the
``/etc/localtime`` symlink (``…/zoneinfo/Europe/Berlin``), ``/etc/timezone`` (Debian), else UTC.
:func:`resolve` says which it took and why (doctor shows it), so a wrong time in the model's
context can be traced to its source.

The worker shows every time in the model's context in this zone, with its offset
(``2026-11-22 11:04 +01:00``), and the clock tool answers in it; scheduled work (reminders)
reads the zone from here too, and so do the commands that show the owner times of memory
(``relaybot memory search``, ``memory notes show``, ``memory entities``, ``memory curated``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

LOCALTIME = Path("/etc/localtime")
TIMEZONE_FILE = Path("/etc/timezone")
_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Zulu", "Zulu", "Z", "GMT"})


class UnknownZone(ValueError):
    """Not an IANA time zone name this system knows."""


@dataclass(frozen=True)
class Zone:
    """A resolved zone: its IANA ``name``, the ``tzinfo`` and where the name came from
    (``config``, ``TZ``, ``/etc/localtime``, ``/etc/timezone`` or ``default``)."""

    name: str
    info: tzinfo
    source: str
    note: str = ""  # why an earlier source was passed over (a TZ that is not an IANA name)

    def describe(self) -> str:
        """``Europe/Berlin (from /etc/localtime)``, for doctor and the logs."""
        where = {"config": "[owner] timezone", "default": "no system zone found: UTC"}.get(
            self.source, self.source
        )
        said = f"{self.name} (from {where})"
        return f"{said}; {self.note}" if self.note else said


def zone_info(name: str) -> tzinfo:
    """The zone called ``name``; :class:`UnknownZone` (one line, with the fix) when there is
    none. UTC is always known, even on a system without a zone database."""
    if name in _UTC_NAMES:
        return UTC
    if not name or name.startswith(("/", ".")) or ".." in name:
        raise UnknownZone(_unknown(name))
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise UnknownZone(_unknown(name)) from None


def _unknown(name: str) -> str:
    import difflib
    from zoneinfo import available_timezones

    close = difflib.get_close_matches(name, sorted(available_timezones()), n=1, cutoff=0.75)
    if close:
        return f"unknown time zone {name!r} (did you mean {close[0]!r}?)"
    return (
        f"unknown time zone {name!r}: an IANA name such as 'Europe/Berlin', "
        "'America/New_York' or 'UTC' (`timedatectl list-timezones` lists them)"
    )


def resolve(
    configured: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    localtime: Path = LOCALTIME,
    timezone_file: Path = TIMEZONE_FILE,
) -> Zone:
    """The owner's zone: ``configured`` (already validated) or the system's."""
    if configured:
        return Zone(configured, zone_info(configured), "config")
    env = os.environ if env is None else env
    note = ""
    tz = (env.get("TZ") or "").strip().removeprefix(":")
    if tz:
        try:
            return Zone(tz, zone_info(tz), "TZ")
        except UnknownZone:
            note = f"TZ={tz!r} is not an IANA zone name, passed over"
    for name, source in ((_linked_name(localtime), str(localtime)),
                         (_file_name(timezone_file), str(timezone_file))):  # fmt: skip
        if name:
            try:
                return Zone(name, zone_info(name), source, note)
            except UnknownZone:
                continue
    return Zone("UTC", UTC, "default", note)


def _linked_name(link: Path) -> str | None:
    """``Europe/Berlin`` from a symlink to ``/usr/share/zoneinfo/Europe/Berlin``."""
    try:
        target = str(link.readlink()) if link.is_symlink() else ""
    except OSError:
        return None
    _, found, name = target.partition("zoneinfo/")
    name = name.strip("/").removeprefix("posix/").removeprefix("right/")
    return (name or None) if found else None


def _file_name(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeError):
        return None


def owner_zone(configured: str | None, env: Mapping[str, str] | None = None) -> tzinfo | None:
    """The zone the owner reads times in (:func:`resolve`), as :func:`stamp` and memory take it:
    None for UTC (the times then read ``… UTC``)."""
    info = resolve(configured, env).info
    return None if info is UTC else info


def zone_key(info: tzinfo | None) -> str:
    """The IANA name of a zone as memory records it (a scheduled item's ``zone``): ``UTC`` for
    UTC (and None, as memory and :func:`stamp` take it), the name a ``ZoneInfo`` was made from,
    else the zone's own string (a fixed offset)."""
    if info is None or info is UTC:
        return "UTC"
    key = getattr(info, "key", None)
    return key if isinstance(key, str) and key else str(info)


def stamp(ts: float, zone: tzinfo | None = None) -> str:
    """``ts`` to the minute in ``zone``: ``2026-11-22 11:04 +01:00`` (the offset, never a
    bare local time the model could take for UTC); in UTC (None) ``2026-11-22 10:04 UTC``."""
    try:
        if zone is None or zone is UTC:
            return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")
        local = datetime.fromtimestamp(ts, zone)
    except (OverflowError, OSError, ValueError):
        return "unknown time"
    offset = local.strftime("%z")  # +0100
    return f"{local:%Y-%m-%d %H:%M} {offset[:3]}:{offset[3:]}"
