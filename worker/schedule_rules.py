"""Scheduled work's rules of time (issue 27): durations, times, cron expressions, occurrences.

Pure: no I/O and no clock of its own (every function is given ``now``), so the tool, the CLI and
the worker agree to the second and the tests can walk across a DST change without waiting for one.
Everything answers in UTC epoch seconds; an occurrence is an int (it is part of an event id). The
engine for cron expressions is worker/schedule_cron.py; this module is the API over it.

The owner's zone (``[owner] timezone``) is the zone of a time written without an offset and of
every cron expression: ``0 9 * * *`` is nine on the owner's clock, in summer and in winter. A
wall time that does not exist (spring) comes as much later as the clocks jumped (02:30 → 03:30);
one that happens twice (autumn) is its first; two on one instant fire once (schedule_cron.py).

Reading of times (``at``, ``until``): ISO 8601 with an offset or ``Z`` is that instant; without
one it is a wall time in the owner's zone; a time of day alone (``09:00``) is the next one to come
(today if it is still ahead, else tomorrow). A date alone is refused for ``at`` (we never guess
the hour the bot speaks) and read as "through the end of that day" for ``until``. ``until`` may
also be a duration from now (``2w``). A time that is not after ``now`` is refused.

A :class:`ScheduleError` is read by the model (as a tool's error) and by the owner (the CLI): one
line, saying what was wrong and what to write instead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from itertools import islice, pairwise

from croniter import CroniterBadDateError, CroniterError, croniter

from contract.timezone import stamp
from worker.schedule_cron import (
    ALIASES,
    DAY,
    HOUR,
    MINUTE,
    WEEK,
    closest_below,
    counted,
    how_often,
    occurrences,
    recurrence_words,
    suggest,
    wall_epoch,
)

MAX_AHEAD = 100 * 365 * DAY  # further than this is a typo, and past what datetime can show
LATE_POLICIES = ("deliver", "skip")
MAX_ARGUMENT = 200  # characters: no time, duration or cron expression is longer

_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), MINUTE),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), HOUR),
    **dict.fromkeys(("d", "day", "days"), DAY),
    **dict.fromkeys(("w", "wk", "wks", "week", "weeks"), WEEK),
}
_DURATION = re.compile(r"(?:\s*(\d+(?:\.\d+)?)\s*([a-z]+))+\s*")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
_ISO_DURATION = re.compile(
    r"p(?:(\d+)w)?(?:(\d+)d)?(?:t(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?)?"
)
_OFFSET = r"(?:Z|[+-]\d{2}(?::?\d{2})?)"
_TIME_OF_DAY = re.compile(
    rf"T?(\d{{1,2}}):(\d{{2}})(?::(\d{{2}})(?:[.,](\d{{1,6}}))?)?({_OFFSET})?"
)
_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}|\d{8}")
_HASHED = re.compile(r"[hr](?:\(\d+-\d+\))?(?:/\d+)?")  # Jenkins' H and R: not a fixed time
_FIELDS = "minute hour day-of-month month day-of-week"


class ScheduleError(ValueError):
    """A schedule argument that cannot be used. The message is one line, for the model and the
    owner alike: what was wrong and what to write instead."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


@dataclass(frozen=True)
class Plan:
    """An item's times as :func:`plan` read them: the first occurrence, the normalized cron of a
    recurring item (None for a one-off) and the last instant it may fire at (None: no end)."""

    first_due: int
    cron: str | None
    until: float | None


def _quote(text: str) -> str:
    """``text`` quoted for an error message: short, and on one line whatever it holds."""
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _zone_name(zone: tzinfo) -> str:
    """The zone's IANA name when it has one (``Europe/Berlin``), else what it calls itself."""
    return str(getattr(zone, "key", None) or zone.tzname(None) or zone)


def _too_long(text: str, what: str) -> None:
    """Refuse an argument far longer than any time or schedule (a model's stray paragraph)."""
    if len(text) > MAX_ARGUMENT:
        raise ScheduleError(f"{what} is {len(text)} characters long: give just the {what}")


def _looks_like_duration(text: str) -> bool:
    """Whether ``text`` is written as a duration (``2w``, ``PT1H``) rather than as a time."""
    said = " ".join(text.split()).lower()
    return bool(_DURATION.fullmatch(said) or _ISO_DURATION.fullmatch(said))


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``10m``, ``2h``, ``3d``, ``1w``, ``1h30m``,
    ``1.5h``, ``10 minutes`` or ISO 8601's ``PT1H30M``; more than zero."""
    _too_long(text, "duration")
    said = text.strip().lower()
    fix = "write a number and a unit (s, m, h, d, w), e.g. '90s', '10m', '2h', '3d' or '1h30m'"
    if not said:
        raise ScheduleError(f"the duration is empty: {fix}")
    if said.startswith("-"):
        raise ScheduleError(f"{_quote(text)} is negative: a duration counts forward; {fix}")
    iso = _ISO_DURATION.fullmatch(said) if said[-1] not in "pt" else None  # not "P", "P1DT"
    if iso:
        weeks, days, hours, minutes, seconds = (float(g or 0) for g in iso.groups())
        total = weeks * WEEK + days * DAY + hours * HOUR + minutes * MINUTE + seconds
    elif _DURATION.fullmatch(cleaned := re.sub(r",|\band\b", " ", said)):
        total = 0.0
        for number, unit in _DURATION_PART.findall(cleaned):
            if unit not in _UNITS:
                months = unit.startswith(("mo", "y"))
                why = "months and years vary in length: use days, or 'at' a date" if months else fix
                raise ScheduleError(f"unknown unit {unit!r} in {_quote(text)}: {why}")
            total += float(number) * _UNITS[unit]
    elif re.fullmatch(r"\d+(?:\.\d+)?", said):
        raise ScheduleError(f"{_quote(text)} has no unit: say which, e.g. '{said}s' or '{said}m'")
    else:
        raise ScheduleError(f"{_quote(text)} is not a duration: {fix}")
    if total <= 0:
        raise ScheduleError(
            f"{_quote(text)} is no time at all: a duration is more than zero; {fix}"
        )
    if total > MAX_AHEAD:
        raise ScheduleError(f"{_quote(text)} is more than 100 years: give a shorter duration")
    return total


def _fixed_zone(offset: str | None, zone: tzinfo) -> tzinfo:
    """The zone of a written offset (``Z``, ``+01:00``, ``-0500``, ``+01``), else ``zone``."""
    if not offset:
        return zone
    if offset == "Z":
        return UTC
    digits = offset[1:].replace(":", "").ljust(4, "0")
    delta = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    return timezone(-delta if offset[0] == "-" else delta)


def _time_of_day(found: re.Match[str], zone: tzinfo, now: float) -> float | None:
    """The next instant (strictly after ``now``) whose wall time is the one written; None when
    the hour or minute is out of range."""
    hour, minute, second, fraction, offset = found.groups()
    h, m, s = int(hour), int(minute), int(second or 0)
    if h > 23 or m > 59 or s > 59:
        return None
    written = time(h, m, s, int((fraction or "0").ljust(6, "0")))
    where = _fixed_zone(offset, zone)
    today = datetime.fromtimestamp(now, where).date()
    ts = wall_epoch(datetime.combine(today, written), where)
    if ts <= now:  # gone today: tomorrow's
        ts = wall_epoch(datetime.combine(today + timedelta(days=1), written), where)
    return ts


def _date(text: str) -> date | None:
    """The calendar date ``text`` names (``2026-11-29``, ``20261129``); None for no such day."""
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def _parse_time(text: str, zone: tzinfo, now: float, *, what: str) -> float:
    """One ISO 8601 time (``at`` or ``until``: ``what`` names it in errors) as epoch seconds,
    by the rules in the module's docstring; after ``now``."""
    _too_long(text, what)
    said = re.sub(rf"\s+(?={_OFFSET}$)", "", " ".join(text.split()).upper())
    said = re.sub(r"^(\d{4}-\d{2}-\d{2})[T ](\d)(?=:)", r"\g<1>T0\g<2>", said)  # T9:00 → T09:00
    local = datetime.fromtimestamp(now, zone) + timedelta(days=1)
    tomorrow, offset = local.date().isoformat(), local.strftime("%z") or "+0000"
    where = f"{_zone_name(zone)}, the owner's zone"
    ts: float | None = None
    if found := _TIME_OF_DAY.fullmatch(said):
        ts = _time_of_day(found, zone, now)
    elif _DATE_ONLY.fullmatch(said) and (day := _date(said)):
        if what != "until":
            raise ScheduleError(
                f"{what} {_quote(text)} is a date without a time: add the time, "
                f"e.g. '{day.isoformat()}T09:00' ({where})"
            )
        next_day = datetime.combine(day + timedelta(days=1), time())
        ts = wall_epoch(next_day, zone) - 1  # through the end of that day
    else:
        try:
            written = datetime.fromisoformat(said)
        except ValueError:
            written = None
        if written is not None:
            ts = written.timestamp() if written.tzinfo else wall_epoch(written, zone)
    if ts is None:
        raise ScheduleError(
            f"{what} {_quote(text)} is not a time: write an ISO 8601 time such as "
            f"'{tomorrow}T09:00' (read in {where}), one with an offset such as "
            f"'{tomorrow}T09:00{offset[:3]}:{offset[3:5]}', or a time of day such as '09:00' "
            "(the next one to come)"
        )
    if ts <= now:
        raise ScheduleError(
            f"{what} {_quote(text)} is {stamp(ts, zone)}, which is not in the future "
            f"(now is {stamp(now, zone)}): give a later time, or 'in' a duration such as '10m'"
        )
    if ts - now > MAX_AHEAD:
        raise ScheduleError(f"{what} {_quote(text)} is more than 100 years ahead: check the year")
    return ts


def parse_at(text: str, zone: tzinfo, now: float) -> float:
    """The instant an ``at`` names, as epoch seconds: ISO 8601 (an offset or ``Z`` is kept,
    none means the owner's ``zone``) or a time of day (the next one after ``now``). A date
    without a time, a time not after ``now`` or garbage is a :class:`ScheduleError`."""
    return _parse_time(text, zone, now, what="at")


def _cron_problem(expr: str, why: str) -> str:
    """The one-line message for a cron expression croniter refused, with how to write one."""
    reason = next((ln.strip() for ln in reversed(why.splitlines()) if ln.strip()), "")[:100]
    return (
        f"{_quote(expr)} is not a cron expression ({reason}): write 5 fields, {_FIELDS}, "
        "e.g. '30 9 * * 1-5' (09:30 on weekdays) or '0 */2 * * *' (every 2 hours)"
    )


def _suggest_for(text: str) -> str:
    """A hint for someone who wrote a duration (``2h``) where a cron expression belongs."""
    try:
        return suggest(parse_duration(text))
    except ScheduleError:
        return suggest(DAY)


def check_cron(expr: str, *, min_every: float) -> str:
    """``expr`` as a normalized 5-field cron expression (one space between fields, lower case,
    ``@daily`` and the like spelt out), or a :class:`ScheduleError`: not 5 fields (seconds,
    years), ``@reboot``, a hashed ``H``, a date that never comes, or two occurrences closer than
    ``min_every`` seconds (on the wall clock; a DST night can bring two closer by the hour the
    clocks jump, once a year). Every 5-field expression is at most once a minute, so
    ``* * * * *`` passes only when ``min_every`` is 60 or less."""
    _too_long(expr, "cron expression")
    said = " ".join(expr.split()).lower()
    example = "e.g. '0 9 * * *' (every day at 09:00) or '*/15 * * * *' (every 15 minutes)"
    if not said:
        raise ScheduleError(f"the cron expression is empty: write 5 fields, {_FIELDS}, {example}")
    if said == "@reboot":
        raise ScheduleError(f"'@reboot' is not a time of day: write a 5-field cron, {example}")
    if said.startswith("@") and said not in ALIASES:
        hint = _suggest_for(said.removeprefix("@every").strip())
        raise ScheduleError(f"{_quote(expr)} is not supported: write a 5-field cron, {hint}")
    said = ALIASES.get(said, said)
    fields = said.split()
    if len(fields) in (6, 7):
        raise ScheduleError(
            f"{_quote(expr)} has {len(fields)} fields: seconds and years are not supported, a "
            f"schedule fires at most once a minute; write 5 fields, {_FIELDS}, {example}"
        )
    if len(fields) != 5:
        if _looks_like_duration(said.removeprefix("every ")):
            raise ScheduleError(
                f"every takes a cron expression, not a duration like {_quote(expr)}: write 5 "
                f"fields, {_FIELDS}, {_suggest_for(said.removeprefix('every '))}"
            )
        raise ScheduleError(
            f"{_quote(expr)} has {len(fields)} fields, not 5 ({_FIELDS}): {example}"
        )
    if any(_HASHED.fullmatch(part) for field in fields for part in field.split(",")):
        raise ScheduleError(f"{_quote(expr)} uses H or R (a hashed time): write the number instead")
    try:
        croniter(said, datetime(2001, 1, 1)).get_next(datetime)
        closest = closest_below(said, min_every)
    except CroniterBadDateError:
        raise ScheduleError(
            f"{_quote(expr)} never fires (a date that does not exist, such as 30 February): "
            "check the day and month fields; for the last day of every month write L, '0 9 L * *'"
        ) from None
    except (CroniterError, ValueError, KeyError, IndexError) as exc:
        raise ScheduleError(_cron_problem(expr, str(exc))) from None
    if closest is not None:
        raise ScheduleError(
            f"{_quote(expr)} fires as often as every {how_often(closest)}; the limit is once every "
            f"{how_often(min_every)}: write a sparser schedule, {suggest(min_every)}"
        )
    return said


def _first(cron: str, zone: tzinfo, after: float, n: int) -> list[int]:
    """The first ``n`` occurrences after ``after``; a bad expression is a :class:`ScheduleError`."""
    try:
        return list(islice(occurrences(cron, zone, after), n))
    except CroniterError as exc:
        raise ScheduleError(_cron_problem(cron, str(exc))) from None


def next_occurrence(cron: str, zone: tzinfo, after: float) -> int | None:
    """The first occurrence of ``cron`` (wall-clock times in ``zone``) strictly after ``after``,
    as epoch seconds; None when there is none (a date that never comes). A missing wall time
    fires as much later as the clocks jumped, a repeated one at its first, and never two
    occurrences at one instant."""
    found = _first(cron, zone, after, 1)
    return found[0] if found else None


def next_due(cron: str | None, zone: tzinfo, after: float, until: float | None) -> int | None:
    """An item's next occurrence strictly after ``after``, or None when it has no more: a
    one-off (no ``cron``), a cron with no further date, or one past ``until`` (which may fire:
    an occurrence exactly at ``until`` counts)."""
    if cron is None:
        return None
    following = next_occurrence(cron, zone, after)
    if following is None or (until is not None and following > until):
        return None
    return following


def min_interval(cron: str, zone: tzinfo, start: float, samples: int = 50) -> float:
    """The smallest gap, in seconds, between consecutive occurrences among the first ``samples``
    after ``start`` (real time: a DST night shows here); infinity when fewer than two come."""
    times = _first(cron, zone, start, max(samples, 2))
    return float(min((b - a for a, b in pairwise(times)), default=math.inf))


def _given(value: str | None) -> str | None:
    """An optional argument as given, with an empty or blank one taken as not given (a tool's
    caller often sends "" for an argument it means to leave out)."""
    return value.strip() if value and value.strip() else None


def plan(
    *,
    at: str | None,
    in_: str | None,
    every: str | None,
    until: str | None,
    zone: tzinfo,
    now: float,
    min_every: float,
) -> Plan:
    """The tool's or the CLI's arguments as an item's times, or a :class:`ScheduleError`.
    Exactly one of ``at`` (a time) and ``in_`` (a duration from ``now``) sets the first
    occurrence; with ``every`` (a cron expression) the item then recurs on the cron, and with
    ``every`` alone its first occurrence is the cron's next. ``until`` (a time, a date meaning
    through that day, or a duration from now) ends a recurring item; it may not come before the
    first occurrence."""
    at, in_, every, until = _given(at), _given(in_), _given(every), _given(until)
    if at and in_:
        raise ScheduleError("give either 'at' (a time) or 'in' (a duration), not both")
    if not (at or in_ or every):
        raise ScheduleError(
            "say when: 'at' a time such as '09:00', 'in' a duration such as '10m', "
            "or 'every' with a cron expression such as '0 9 * * *'"
        )
    if until and not every:
        raise ScheduleError("'until' ends a recurring item: add 'every', or leave 'until' out")
    cron = check_cron(every, min_every=min_every) if every else None
    if at:
        first = math.ceil(parse_at(at, zone, now))
    elif in_:
        first = math.ceil(now + parse_duration(in_))
    else:
        found = next_occurrence(cron, zone, now) if cron else None
        if found is None:  # check_cron refuses a cron that never fires: this is a safety net
            raise ScheduleError(
                f"{_quote(every or '')} never fires: check the day and month fields"
            )
        first = found
    end: float | None = None
    if until:
        if _looks_like_duration(until):
            end = now + parse_duration(until)
        else:
            end = _parse_time(until, zone, now, what="until")
        if end < first:
            raise ScheduleError(
                f"until {_quote(until)} is {stamp(end, zone)}, before the first time, "
                f"{stamp(first, zone)}: give a later 'until', or leave it out"
            )
    return Plan(first_due=first, cron=cron, until=end)


def parse_late(text: str | None, default: str) -> str:
    """The ``late`` policy named (``deliver`` or ``skip``), ``default`` when none is given."""
    said = (_given(text) or default).lower()
    if said not in LATE_POLICIES:
        raise ScheduleError(
            f"late {_quote(text or default)} is not a policy: 'deliver' (once, saying how "
            "late) or 'skip' (a missed occurrence is dropped)"
        )
    return said


def late_decision(occurrence: float, now: float, *, grace: float, late: str) -> tuple[str, float]:
    """What an occurrence due at ``occurrence`` becomes at ``now``, with how many seconds late
    it is: ``on_time`` within ``grace`` seconds, else by the ``late`` policy ``late`` (deliver,
    saying how late) or ``skip``."""
    if late not in LATE_POLICIES:
        raise ScheduleError(f"late {_quote(late)} is not a policy: 'deliver' or 'skip'")
    behind = max(0.0, now - occurrence)
    if behind <= grace:
        return "on_time", behind
    return ("skip" if late == "skip" else "late"), behind


def describe_late(seconds: float) -> str:
    """How late, in words: ``40 seconds late``, ``12 minutes late``, ``1 hour 30 minutes
    late``, ``2 days late`` (a second unit only while the first is under ten)."""
    left = max(0, int(seconds))
    units = (("day", DAY), ("hour", HOUR), ("minute", MINUTE), ("second", 1))
    i = next(i for i, (_, size) in enumerate(units) if left >= size or size == 1)
    (name, size), (smaller, below) = units[i], units[min(i + 1, 3)]
    n, rest = divmod(left, size)
    said = counted(n, name)
    if n < 10 and size > MINUTE and rest >= below:
        said += " " + counted(rest // below, smaller)
    return f"{said} late"


def describe_recurrence(cron: str) -> str:
    """A recurrence in short words where that is easy (``every day at 09:00``, ``every
    weekday (Monday to Friday) at 08:30``, ``every 15 minutes``, ``on the 1st of every month at
    09:00``); else the expression itself."""
    try:
        return recurrence_words(cron) or cron
    except (CroniterError, ValueError, IndexError):
        return cron
