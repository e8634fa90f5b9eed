"""Cron expressions on the wall clock, for scheduled work (issue 27): their occurrences in a
zone, how close two can come, and their words. Pure, and it imports nothing of ours:
worker/schedule_rules.py is the API (its errors, its checks); this is the engine under it, a
module of its own so that each stays one job.

croniter matches the fields against NAIVE wall times; the conversion to instants is done here,
because croniter's own time zone handling has had DST bugs. The rules:

- a wall time that does not exist (spring: the clocks jump from 02:00 to 03:00) is read with the
  offset from before the jump, so it comes as much later as the clocks jumped: 02:30 fires at
  03:30. A daily 02:30 therefore fires that day too, never skips it;
- a wall time that happens twice (autumn: 03:00 back to 02:00) fires once, at its first;
- two wall times that land on one instant (02:30 moved to 03:30, and 03:30 itself) fire once:
  occurrences strictly increase.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from itertools import pairwise

from croniter import CroniterBadDateError, croniter

MINUTE = 60
HOUR = 3600
DAY = 86_400
WEEK = 7 * DAY

# @-names that are times; @reboot is not (nothing here knows when the host boots)
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def wall_epoch(wall: datetime, zone: tzinfo) -> float:
    """The instant of a naive wall time in ``zone``, by the module's rules: fold 0 takes the
    first of a repeated time and reads a missing one with the offset from before the jump."""
    return wall.replace(tzinfo=zone, fold=0).timestamp()


def _wall(ts: float, zone: tzinfo) -> datetime:
    """The naive wall time ``zone``'s clocks show at instant ``ts``."""
    return datetime.fromtimestamp(ts, zone).replace(tzinfo=None)


def occurrences(cron: str, zone: tzinfo, after: float) -> Iterator[int]:
    """The occurrences of ``cron`` in ``zone`` strictly after ``after``, in order, by the rules
    of the module's docstring. Wall times come from croniter in wall-clock order; their instants
    are in that order too except for missing wall times (moved past the jump), which may come
    after later wall times' instants: a heap holds each instant until no later wall time can
    fall before it (the wall time it lands on has been passed)."""
    try:
        offsets = [datetime.fromtimestamp(t, zone).utcoffset() for t in (after - DAY, after)]
        # start early enough that a missing wall time, read with the smaller offset, is seen
        start = datetime.fromtimestamp(after, UTC).replace(tzinfo=None) + min(
            o or timedelta() for o in offsets
        )
    except (OverflowError, OSError, ValueError):
        return
    walls = croniter(cron, start)  # a bad expression raises croniter's CroniterError
    last = after
    waiting: list[tuple[int, datetime]] = []  # (instant, the wall time it shows) by instant
    while True:
        try:
            wall: datetime | None = walls.get_next(datetime)
        except (CroniterBadDateError, OverflowError, ValueError):
            wall = None  # no more: Feb 30, or past the year datetime can hold
        if wall is not None:
            try:
                when = round(wall_epoch(wall, zone))
                if when > last:
                    heapq.heappush(waiting, (when, _wall(when, zone)))
            except (OverflowError, OSError, ValueError):
                wall = None
        while waiting and (wall is None or waiting[0][1] <= wall):
            when, _ = heapq.heappop(waiting)
            if when > last:  # two wall times on one instant fire once
                last = when
                yield when
        if wall is None:
            return


def closest_below(cron: str, limit: float) -> float | None:
    """A gap between two consecutive wall times of ``cron`` shorter than ``limit`` seconds, or
    None when there is none. Worked out from the fields, not sampled, so no expression can hide
    a burst from the check: within a day the times are hours x minutes; between days, the two
    closest matching days (over a whole cycle of the calendar)."""
    fields, _ = croniter.expand(cron)
    minutes = range(60) if fields[0] == ["*"] else fields[0]
    hours = range(24) if fields[1] == ["*"] else fields[1]
    times = sorted({h * 60 + m for h in hours for m in minutes})
    within = min((b - a for a, b in pairwise(times)), default=math.inf) * MINUTE
    if within < limit:
        return within
    span = (times[-1] - times[0]) * MINUTE
    if DAY - span >= limit:  # even on two days in a row the times are far enough apart
        return None
    dom, month, dow = cron.split()[2:]
    # which days match repeats every 4 years (leap days) unless it hangs on weekdays too: then
    # the calendar repeats only every 28 years
    years = 28 if dow != "*" and (dom != "*" or month != "*" or "#" in dow or "l" in dow) else 8
    days = croniter(f"0 0 {dom} {month} {dow}", datetime(2000, 12, 31))
    previous = days.get_next(datetime)
    while previous < datetime(2001 + years, 1, 1):
        day = days.get_next(datetime)
        if (gap := (day - previous).days * DAY - span) < limit:
            return float(gap)
        previous = day
    return None


# simple schedules by how often they fire, for hints: the first one sparse enough is suggested
_SUGGESTIONS = (
    *((n * MINUTE, f"*/{n} * * * *", f"every {n} minutes") for n in (2, 5, 10, 15, 20, 30)),
    (HOUR, "0 * * * *", "every hour"),
    *((n * HOUR, f"0 */{n} * * *", f"every {n} hours") for n in (2, 3, 4, 6, 8, 12)),
    (DAY, "0 9 * * *", "every day at 09:00"),
    (WEEK, "0 9 * * 1", "every Monday at 09:00"),
)


def suggest(seconds: float) -> str:
    """A hint: the simplest cron expression that fires no more often than every ``seconds``."""
    for interval, cron, words in _SUGGESTIONS:
        if interval >= seconds:
            return f"e.g. '{cron}' ({words})"
    return "e.g. '0 9 1 * *' (on the 1st of every month at 09:00)"


def how_often(seconds: float) -> str:
    """``seconds`` as the span in "every …": ``minute``, ``90 minutes``, ``6 hours``."""
    for name, size in (("week", WEEK), ("day", DAY), ("hour", HOUR), ("minute", MINUTE)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return name if n == 1 else counted(n, name)
    n = max(1, round(seconds / MINUTE))
    return "minute" if n == 1 else counted(n, "minute")


def counted(n: int, unit: str) -> str:
    """``1 minute``, ``2 minutes``."""
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def _and(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``23rd``, ``11th``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def recurrence_words(cron: str) -> str | None:
    """A recurrence in short words (``describe_recurrence`` in worker/schedule_rules.py), or
    None for a shape it does not put into words."""
    fields, nth = croniter.expand(cron)
    raw = cron.lower().split()
    if len(raw) != 5 or nth:
        return None
    minute, hour, dom, month, dow = raw
    every_day = dom == month == dow == "*"
    # a step is "every n" only when it divides the hour (the day): */7 restarts at :00
    step = re.fullmatch(r"\*/(\d+)", minute)
    if step and 60 % int(step[1]):
        return None
    if every_day and hour == "*" and (minute == "*" or step or minute.isdigit()):
        if minute == "*" or (step and step[1] == "1"):
            return "every minute"
        if step:
            return f"every {int(step[1])} minutes"
        return "every hour" if minute == "0" else f"every hour at :{int(minute):02d}"
    hours = re.fullmatch(r"\*/(\d+)", hour)
    if every_day and minute.isdigit() and hours and 24 % int(hours[1]) == 0:
        return f"every {int(hours[1])} hours at :{int(minute):02d}"
    if "*" in (fields[0][0], fields[1][0]) or len(fields[0]) * len(fields[1]) > 4:
        return None
    at = " at " + _and([f"{h:02d}:{m:02d}" for h in fields[1] for m in fields[0]])
    if every_day:
        return "every day" + at
    if dom == month == "*":
        days = sorted((int(d) for d in fields[4]), key=lambda d: (d + 6) % 7)  # Monday first
        if days == [1, 2, 3, 4, 5]:
            return "every weekday (Monday to Friday)" + at
        return "every " + _and([_DAY_NAMES[d] for d in days]) + at
    if dow == month == "*" and (dom == "l" or re.fullmatch(r"\d+(,\d+)*", dom)):
        which = "last day" if dom == "l" else _and([_ordinal(int(d)) for d in dom.split(",")])
        return f"on the {which} of every month{at}"
    if dow == "*" and dom.isdigit() and month.isdigit():
        return f"every year on {int(dom)} {_MONTH_NAMES[int(month) - 1]}{at}"
    return None
