"""Scheduled work's rules of time (issue 27, worker/schedule_rules.py): durations, ``at`` times,
cron expressions and their occurrences in the owner's zone.

The promises checked here: a wall time that does not exist (spring) fires as much later as the
clocks jumped, a wall time that happens twice (autumn) fires once, at its first; never two
occurrences at one instant; a daily job never skips a day; the frequency limit cannot be dodged by
an expression that looks sparse; every error is one line that says what to write instead. The
DST cases are in Europe/Berlin (clocks change at 02:00/03:00 local) and America/New_York (02:00
local); the properties at the end run across zones with odd changes too (30 minutes, 2 hours, at
midnight, a negative DST, a skipped day).
"""

from __future__ import annotations

import ast
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from functools import cache
from itertools import pairwise
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from worker import schedule_cron
from worker import schedule_rules as rules
from worker.schedule_rules import (
    Plan,
    ScheduleError,
    check_cron,
    describe_late,
    describe_recurrence,
    late_decision,
    min_interval,
    next_due,
    next_occurrence,
    parse_at,
    parse_duration,
    parse_late,
    plan,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
HOUR = 3600
DAY = 86_400
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=BERLIN).timestamp()  # a Saturday noon in Berlin


def instant(zone: tzinfo, *fields: int, fold: int = 0) -> float:
    """The epoch seconds of a wall time in ``zone`` (``fold=1``: the second of a repeated one)."""
    return datetime(*fields, tzinfo=zone, fold=fold).timestamp()  # type: ignore[misc]


def shown(ts: float, zone: tzinfo) -> str:
    """``2026-03-29 03:30 +0200``: the wall time and offset the owner sees."""
    return datetime.fromtimestamp(ts, zone).strftime("%Y-%m-%d %H:%M %z")


def walk(cron: str, zone: tzinfo, after: float, count: int) -> list[int]:
    """``count`` occurrences after ``after``, each asked for afresh (as the worker does: from the
    one before, with nothing carried over)."""
    out: list[int] = []
    for _ in range(count):
        found = next_occurrence(cron, zone, out[-1] if out else after)
        assert found is not None
        out.append(found)
    return out


def walls(cron: str, zone: tzinfo, after: float, count: int) -> list[str]:
    return [shown(t, zone) for t in walk(cron, zone, after, count)]


def planned(**given: object) -> Plan:
    """:func:`plan` with nothing given but ``given`` (Berlin, the limit once a minute)."""
    args: dict[str, object] = {
        "at": None,
        "in_": None,
        "every": None,
        "until": None,
        "zone": BERLIN,
        "now": NOW,
        "min_every": 60.0,
    }
    return plan(**{**args, **given})  # type: ignore[arg-type]


def error(call: object, *args: object, **kwargs: object) -> str:
    """The message of the ScheduleError ``call`` raises, checked to be one line."""
    with pytest.raises(ScheduleError) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    message = str(caught.value)
    assert "\n" not in message and message == message.strip(), message
    return message


# --- DST: Europe/Berlin, spring (2026-03-29, 02:00 CET -> 03:00 CEST) --------------------------


def test_berlin_spring_a_daily_0230_fires_at_0330_that_day_and_skips_no_day() -> None:
    assert walls("30 2 * * *", BERLIN, instant(BERLIN, 2026, 3, 27, 12, 0), 4) == [
        "2026-03-28 02:30 +0100",
        "2026-03-29 03:30 +0200",  # 02:30 does not exist: as much later as the clocks jumped
        "2026-03-30 02:30 +0200",
        "2026-03-31 02:30 +0200",
    ]


def test_berlin_spring_hourly_fires_once_at_0330_not_twice() -> None:
    times = walk("30 * * * *", BERLIN, instant(BERLIN, 2026, 3, 29, 0, 0), 5)
    assert [shown(t, BERLIN) for t in times] == [
        "2026-03-29 00:30 +0100",
        "2026-03-29 01:30 +0100",
        "2026-03-29 03:30 +0200",  # 02:30 moved here, and 03:30 itself: one occurrence
        "2026-03-29 04:30 +0200",
        "2026-03-29 05:30 +0200",
    ]
    assert {b - a for a, b in pairwise(times)} == {HOUR}


def test_berlin_spring_every_15_minutes_keeps_its_rhythm() -> None:
    times = walk("*/15 * * * *", BERLIN, instant(BERLIN, 2026, 3, 29, 1, 30), 6)
    assert [shown(t, BERLIN) for t in times] == [
        "2026-03-29 01:45 +0100",
        "2026-03-29 03:00 +0200",
        "2026-03-29 03:15 +0200",
        "2026-03-29 03:30 +0200",
        "2026-03-29 03:45 +0200",
        "2026-03-29 04:00 +0200",
    ]
    assert {b - a for a, b in pairwise(times)} == {900}


def test_berlin_spring_a_moved_time_still_to_come_is_not_lost() -> None:
    """Just after the jump (03:10 CEST), the day's 02:45 (moved to 03:45) is still ahead."""
    after = instant(BERLIN, 2026, 3, 29, 3, 10)
    assert shown(next_occurrence("45 2 * * *", BERLIN, after) or 0, BERLIN) == (
        "2026-03-29 03:45 +0200"
    )
    assert shown(next_occurrence("5,50 2 * * *", BERLIN, after) or 0, BERLIN) == (
        "2026-03-29 03:50 +0200"  # 02:05 -> 03:05 has passed; 02:50 -> 03:50 has not
    )


# --- DST: Europe/Berlin, autumn (2026-10-25, 03:00 CEST -> 02:00 CET) ---------------------------


def test_berlin_autumn_a_daily_0230_fires_once_at_the_first() -> None:
    assert walls("30 2 * * *", BERLIN, instant(BERLIN, 2026, 10, 23, 12, 0), 4) == [
        "2026-10-24 02:30 +0200",
        "2026-10-25 02:30 +0200",  # the first 02:30; the second (CET) is not another one
        "2026-10-26 02:30 +0100",
        "2026-10-27 02:30 +0100",
    ]


def test_berlin_autumn_hourly_does_not_repeat_the_repeated_hour() -> None:
    assert walls("30 * * * *", BERLIN, instant(BERLIN, 2026, 10, 25, 1, 0), 4) == [
        "2026-10-25 01:30 +0200",
        "2026-10-25 02:30 +0200",
        "2026-10-25 03:30 +0100",  # two hours on: 02:30 CET is a wall time already fired
        "2026-10-25 04:30 +0100",
    ]


def test_berlin_autumn_every_15_minutes_waits_out_the_repeated_hour() -> None:
    assert walls("*/15 * * * *", BERLIN, instant(BERLIN, 2026, 10, 25, 2, 40), 3) == [
        "2026-10-25 02:45 +0200",
        "2026-10-25 03:00 +0100",  # 02:00-02:45 CET were fired as CEST
        "2026-10-25 03:15 +0100",
    ]


def test_berlin_autumn_from_inside_the_second_pass() -> None:
    """A worker that asks during the repeated hour's second pass (02:10 CET) gets 03:30, not
    the 02:30 it already fired in the first pass."""
    after = instant(BERLIN, 2026, 10, 25, 2, 10, fold=1)
    assert shown(next_occurrence("30 * * * *", BERLIN, after) or 0, BERLIN) == (
        "2026-10-25 03:30 +0100"
    )


def test_berlin_autumn_daily_0130_is_untouched() -> None:
    times = walk("30 1 * * *", BERLIN, instant(BERLIN, 2026, 10, 24, 12, 0), 2)
    assert [shown(t, BERLIN) for t in times] == ["2026-10-25 01:30 +0200", "2026-10-26 01:30 +0100"]
    assert times[1] - times[0] == 25 * HOUR


# --- DST: America/New_York (2026-03-08 02:00 -> 03:00; 2026-11-01 02:00 -> 01:00) -------------


def test_new_york_spring() -> None:
    assert walls("30 2 * * *", NEW_YORK, instant(NEW_YORK, 2026, 3, 7, 12, 0), 3) == [
        "2026-03-08 03:30 -0400",
        "2026-03-09 02:30 -0400",
        "2026-03-10 02:30 -0400",
    ]
    assert walls("30 * * * *", NEW_YORK, instant(NEW_YORK, 2026, 3, 8, 1, 0), 3) == [
        "2026-03-08 01:30 -0500",
        "2026-03-08 03:30 -0400",
        "2026-03-08 04:30 -0400",
    ]
    times = walk("*/15 * * * *", NEW_YORK, instant(NEW_YORK, 2026, 3, 8, 1, 40), 3)
    assert [shown(t, NEW_YORK) for t in times] == [
        "2026-03-08 01:45 -0500",
        "2026-03-08 03:00 -0400",
        "2026-03-08 03:15 -0400",
    ]


def test_new_york_autumn_daily_0130_fires_once_at_the_first() -> None:
    assert walls("30 1 * * *", NEW_YORK, instant(NEW_YORK, 2026, 10, 31, 12, 0), 3) == [
        "2026-11-01 01:30 -0400",  # 01:30 happens twice; EDT's is the one
        "2026-11-02 01:30 -0500",
        "2026-11-03 01:30 -0500",
    ]
    assert walls("30 * * * *", NEW_YORK, instant(NEW_YORK, 2026, 11, 1, 0, 0), 3) == [
        "2026-11-01 00:30 -0400",
        "2026-11-01 01:30 -0400",
        "2026-11-01 02:30 -0500",
    ]
    assert walls("*/15 * * * *", NEW_YORK, instant(NEW_YORK, 2026, 11, 1, 1, 40), 2) == [
        "2026-11-01 01:45 -0400",
        "2026-11-01 02:00 -0500",
    ]


def test_a_day_that_does_not_exist_gets_one_occurrence_after_it() -> None:
    """Samoa skipped 2011-12-30: its 09:00 lands on the 31st's 09:00, which fires once."""
    apia = ZoneInfo("Pacific/Apia")
    assert walls("0 9 * * *", apia, instant(apia, 2011, 12, 28, 12, 0), 3) == [
        "2011-12-29 09:00 -1000",
        "2011-12-31 09:00 +1400",
        "2012-01-01 09:00 +1400",
    ]


def test_a_two_hour_jump_keeps_the_order_of_the_day() -> None:
    """Antarctica/Troll jumps from 01:00 to 03:00: 02:30 (moved to 04:30) comes after 03:30,
    though croniter names it first; both fire, in order, once."""
    troll = ZoneInfo("Antarctica/Troll")
    assert walls("30 2,3 * * *", troll, instant(troll, 2026, 3, 28, 12, 0), 4) == [
        "2026-03-29 03:30 +0200",
        "2026-03-29 04:30 +0200",
        "2026-03-30 02:30 +0200",
        "2026-03-30 03:30 +0200",
    ]


def test_a_half_hour_jump() -> None:
    """Australia/Lord_Howe jumps from 02:00 to 02:30: 02:15 lands on 02:45, which fires once."""
    lord_howe = ZoneInfo("Australia/Lord_Howe")
    assert walls("15,45 2 * * *", lord_howe, instant(lord_howe, 2026, 10, 3, 12, 0), 3) == [
        "2026-10-04 02:45 +1100",
        "2026-10-05 02:15 +1100",
        "2026-10-05 02:45 +1100",
    ]


def test_at_reads_wall_times_by_the_same_rules() -> None:
    now = instant(BERLIN, 2026, 3, 28, 12, 0)
    assert shown(parse_at("2026-03-29T02:30", BERLIN, now), BERLIN) == "2026-03-29 03:30 +0200"
    now = instant(BERLIN, 2026, 10, 24, 12, 0)
    assert shown(parse_at("2026-10-25T02:30", BERLIN, now), BERLIN) == "2026-10-25 02:30 +0200"
    # a time of day on the spring night: tomorrow's 02:30 is 03:30
    assert shown(parse_at("02:30", BERLIN, instant(BERLIN, 2026, 3, 28, 12, 0)), BERLIN) == (
        "2026-03-29 03:30 +0200"
    )


# --- month ends, leap days, a date that never comes -------------------------------------------


def test_the_31st_fires_only_in_months_that_have_one() -> None:
    assert [w[:10] for w in walls("0 9 31 * *", BERLIN, instant(BERLIN, 2026, 1, 1), 4)] == [
        "2026-01-31",
        "2026-03-31",
        "2026-05-31",
        "2026-07-31",
    ]


def test_the_last_day_of_every_month_is_l() -> None:
    got = [w[:10] for w in walls("0 9 L * *", BERLIN, instant(BERLIN, 2026, 1, 1), 4)]
    assert got == ["2026-01-31", "2026-02-28", "2026-03-31", "2026-04-30"]
    got = [w[:10] for w in walls("0 9 l * *", BERLIN, instant(BERLIN, 2028, 2, 1), 1)]
    assert got == ["2028-02-29"]


def test_feb_29_comes_every_leap_year_and_feb_30_never() -> None:
    assert [w[:10] for w in walls("0 9 29 2 *", BERLIN, instant(BERLIN, 2026, 1, 1), 2)] == [
        "2028-02-29",
        "2032-02-29",
    ]
    assert next_occurrence("0 9 30 2 *", BERLIN, instant(BERLIN, 2026, 1, 1)) is None
    message = error(check_cron, "0 9 30 2 *", min_every=60)
    assert "never fires" in message and "L" in message
    error(check_cron, "0 0 31 4 *", min_every=60)


def test_the_30th_every_month_skips_february() -> None:
    got = [w[:10] for w in walls("0 9 30 * *", BERLIN, instant(BERLIN, 2026, 1, 1), 3)]
    assert got == ["2026-01-30", "2026-03-30", "2026-04-30"]


# --- until --------------------------------------------------------------------------------------


def test_until_ends_a_recurring_item_and_counts_its_own_instant() -> None:
    p = planned(every="0 9 * * *", until="2026-11-30")
    assert shown(p.first_due, BERLIN) == "2026-11-29 09:00 +0100"
    assert p.until == instant(BERLIN, 2026, 12, 1, 0, 0) - 1  # through the end of that day
    second = next_due(p.cron, BERLIN, p.first_due, p.until)
    assert second is not None and shown(second, BERLIN) == "2026-11-30 09:00 +0100"
    assert next_due(p.cron, BERLIN, second, p.until) is None
    assert next_due("0 9 * * *", BERLIN, p.first_due, float(second)) == second  # at until: fires
    assert next_due(None, BERLIN, p.first_due, None) is None  # a one-off has no next
    assert next_due("0 9 30 2 *", BERLIN, p.first_due, None) is None


def test_until_as_a_time_or_a_duration() -> None:
    by_time = planned(every="0 9 * * *", until="2026-12-05T09:00")
    assert by_time.until == instant(BERLIN, 2026, 12, 5, 9, 0)
    by_span = planned(every="0 9 * * *", until="2w")
    assert by_span.until == NOW + 14 * DAY


def test_until_before_the_first_or_without_every_is_refused() -> None:
    message = error(planned, at="2026-12-01T09:00", every="0 9 * * *", until="2026-11-30T09:00")
    assert "before the first time" in message and "2026-12-01 09:00 +01:00" in message
    assert "add 'every'" in error(planned, in_="1h", until="2w")
    message = error(planned, every="0 9 * * *", until="2026-11-27")
    assert "until '2026-11-27'" in message and "not in the future" in message


# --- cron expressions: what is allowed, how often -----------------------------------------------


def test_every_minute_only_where_the_limit_allows_it() -> None:
    assert check_cron("* * * * *", min_every=60) == "* * * * *"
    message = error(check_cron, "* * * * *", min_every=3600)
    assert "every minute" in message and "once every hour" in message and "'0 * * * *'" in message
    assert check_cron("*/5 * * * *", min_every=300) == "*/5 * * * *"
    assert "every 5 minutes" in error(check_cron, "*/5 * * * *", min_every=301)
    assert check_cron("0 9,10 * * *", min_every=3600) == "0 9,10 * * *"
    assert "every hour" in error(check_cron, "0 9,10 * * *", min_every=3601)


def test_the_limit_sees_bursts_across_midnight_and_between_days() -> None:
    """23:00 and 00:00 are an hour apart though the fields look daily; on Mondays only they are
    a day apart at least."""
    assert "every hour" in error(check_cron, "0 0,23 * * *", min_every=2 * HOUR)
    assert check_cron("0 0,23 * * 1", min_every=2 * HOUR) == "0 0,23 * * 1"
    assert "every day" in error(check_cron, "0 9 1,2 * *", min_every=2 * DAY)
    assert check_cron("0 9 1 * *", min_every=28 * DAY) == "0 9 1 * *"  # February: 28 days
    assert "every 4 weeks" in error(check_cron, "0 9 1 * *", min_every=29 * DAY)
    # the 31st or any Monday: a Monday the 1st follows a Sunday the 31st
    assert "every day" in error(check_cron, "0 9 31 * 1", min_every=2 * DAY)


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("0 0 9 * * *", "has 6 fields"),
        ("*/30 * * * * *", "seconds and years are not supported"),
        ("0 0 9 * * * 2027", "has 7 fields"),
        ("@reboot", "'@reboot' is not a time of day"),
        ("@every 10m", "'*/10 * * * *'"),
        ("H 9 * * *", "H or R"),
        ("0 9 * *", "has 4 fields, not 5"),
        ("", "empty"),
        ("61 * * * *", "not a cron expression"),
        ("a b c d e", "not a cron expression"),
        ("0 9 * * 8", "out of range"),
        ("2h", "'0 */2 * * *'"),
        ("every 5 minutes", "'*/5 * * * *'"),
        ("x" * 500, "500 characters long"),
    ],
)
def test_what_is_not_a_cron_expression_says_what_to_write(expr: str, words: str) -> None:
    message = error(check_cron, expr, min_every=60)
    assert words in message, message
    assert len(message) < 400


def test_cron_is_normalized() -> None:
    assert check_cron("  0   9 * *  MON-FRI ", min_every=60) == "0 9 * * mon-fri"
    assert check_cron("@daily", min_every=60) == "0 0 * * *"
    assert check_cron("@HOURLY", min_every=3600) == "0 * * * *"


def test_min_interval_is_real_time_in_the_zone() -> None:
    start = instant(BERLIN, 2026, 3, 28, 12, 0)
    assert min_interval("*/15 * * * *", BERLIN, start) == 900
    assert min_interval("30 * * * *", BERLIN, start) == HOUR
    # 01:00 and 03:00 are an hour apart on the spring night (the wall clock says two)
    assert min_interval("0 1,3 * * *", BERLIN, start, samples=4) == HOUR
    assert min_interval("0 1,3 * * *", UTC, start, samples=4) == 2 * HOUR
    assert min_interval("0 9 30 2 *", BERLIN, start) == float("inf")


# --- at -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-29T09:00", "2026-11-29 09:00 +0100"),  # no offset: the owner's zone
        ("2026-11-29 09:00", "2026-11-29 09:00 +0100"),
        ("2026-11-29 9:00", "2026-11-29 09:00 +0100"),
        ("2026-11-29t09:00:00", "2026-11-29 09:00 +0100"),
        ("20261129T0900", "2026-11-29 09:00 +0100"),
        ("2026-11-29T09:00Z", "2026-11-29 10:00 +0100"),
        ("2026-11-29T09:00:00z", "2026-11-29 10:00 +0100"),
        ("2026-11-29T09:00-05:00", "2026-11-29 15:00 +0100"),
        ("2026-11-29T09:00 +05:30", "2026-11-29 04:30 +0100"),
        ("2027-07-01T09:00", "2027-07-01 09:00 +0200"),  # summer time in the owner's zone
        ("13:00", "2026-11-28 13:00 +0100"),  # a time of day still ahead: today
        ("09:00", "2026-11-29 09:00 +0100"),  # gone today: tomorrow
        ("12:00", "2026-11-29 12:00 +0100"),  # exactly now is not ahead
        ("9:30", "2026-11-29 09:30 +0100"),
        ("T23:59:59", "2026-11-28 23:59 +0100"),
        ("12:00Z", "2026-11-28 13:00 +0100"),  # 12:00 UTC is 13:00 here, still ahead
    ],
)
def test_at_reads_iso_8601_and_times_of_day(text: str, expected: str) -> None:
    assert shown(parse_at(text, BERLIN, NOW), BERLIN) == expected


def test_at_keeps_fractions_and_the_plan_rounds_up() -> None:
    assert parse_at("2026-11-29T09:00:00.5+01:00", BERLIN, NOW) == (
        instant(BERLIN, 2026, 11, 29, 9, 0) + 0.5
    )
    p = planned(at="2026-11-29T09:00:00.5+01:00")
    assert p == Plan(first_due=int(instant(BERLIN, 2026, 11, 29, 9, 0)) + 1, cron=None, until=None)


def test_a_time_in_the_past_names_it_in_the_owners_zone() -> None:
    message = error(parse_at, "2026-11-28T08:00Z", BERLIN, NOW)
    assert "2026-11-28 09:00 +01:00" in message  # 08:00 UTC, as the owner reads it
    assert "now is 2026-11-28 12:00 +01:00" in message
    assert "'in' a duration" in message
    assert "not in the future" in error(parse_at, "2026-11-28T12:00", BERLIN, NOW)


def test_a_date_alone_is_not_a_time_to_speak() -> None:
    message = error(parse_at, "2026-11-29", BERLIN, NOW)
    assert "date without a time" in message and "'2026-11-29T09:00'" in message
    assert "Europe/Berlin" in message


NOT_TIMES = [
    "",
    "tomorrow",
    "9am",
    "25:00",
    "12:60",
    "2026-02-30T09:00",
    "2026-13-01",
    "2026-11-29T24:00",
    "next friday",
    "1764316800",
]


@pytest.mark.parametrize("text", NOT_TIMES)
def test_what_is_not_a_time_says_how_to_write_one(text: str) -> None:
    message = error(parse_at, text, BERLIN, NOW)
    assert "'2026-11-29T09:00' (read in Europe/Berlin" in message, message
    assert "'2026-11-29T09:00+01:00'" in message and "'09:00'" in message


def test_a_time_too_far_or_too_long_is_refused() -> None:
    assert "100 years" in error(parse_at, "2200-01-01T09:00", BERLIN, NOW)
    assert "characters long" in error(parse_at, "2026-11-29T09:00 " * 20, BERLIN, NOW)


# --- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("10m", 600),
        ("2h", 7200),
        ("3d", 3 * DAY),
        ("1w", 7 * DAY),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("1h, 30m", 5400),
        ("1 hour and 30 minutes", 5400),
        ("1.5h", 5400),
        ("10 minutes", 600),
        (" 2H ", 7200),
        ("PT1H30M", 5400),
        ("P1W", 7 * DAY),
        ("P1DT12H", 36 * HOUR),
        ("pt90s", 90),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0s", "more than zero"),
        ("0h0m", "more than zero"),
        ("-5m", "negative"),
        ("90", "no unit"),
        ("ten minutes", "not a duration"),
        ("5 fortnights", "unknown unit 'fortnights'"),
        ("2 months", "months and years vary"),
        ("1y", "months and years vary"),
        ("", "empty"),
        ("P", "not a duration"),
        ("PT", "not a duration"),
        ("1h30", "not a duration"),
        ("99999w", "more than 100 years"),
    ],
)
def test_what_is_not_a_duration_says_how_to_write_one(text: str, words: str) -> None:
    message = error(parse_duration, text)
    assert words in message, message


# --- the plan: the tool's and the CLI's arguments -----------------------------------------------


def test_a_plan_from_at_in_or_every() -> None:
    assert planned(at="09:00") == Plan(
        first_due=int(instant(BERLIN, 2026, 11, 29, 9, 0)), cron=None, until=None
    )
    assert planned(in_="90s").first_due == NOW + 90
    only_every = planned(every="0 9 * * 1-5")
    assert only_every.cron == "0 9 * * 1-5"
    assert shown(only_every.first_due, BERLIN) == "2026-11-30 09:00 +0100"  # Monday's
    first_then_cron = planned(in_="10m", every="0 9 * * *")
    assert first_then_cron.first_due == NOW + 600 and first_then_cron.cron == "0 9 * * *"
    blank = planned(at="", in_=" ", every="0 9 * * *")  # a tool sends "" for "not given"
    assert blank == Plan(
        first_due=int(instant(BERLIN, 2026, 11, 29, 9, 0)), cron="0 9 * * *", until=None
    )


def test_a_plan_refuses_what_cannot_be() -> None:
    assert "not both" in error(planned, at="09:00", in_="1h")
    assert "say when" in error(planned)
    assert "say when" in error(planned, at="", in_="", every="")
    assert "not in the future" in error(planned, at="2026-11-27T09:00")
    hourly = 3600.0
    assert "limit is once every hour" in error(planned, every="* * * * *", min_every=hourly)
    assert "not a duration" in error(planned, in_="soon")


# --- late policy and words ----------------------------------------------------------------------


def test_late_decision() -> None:
    assert late_decision(1000, 1000, grace=300, late="deliver") == ("on_time", 0)
    assert late_decision(1000, 990, grace=300, late="skip") == ("on_time", 0)  # early clock
    assert late_decision(1000, 1300, grace=300, late="skip") == ("on_time", 300)
    assert late_decision(1000, 1301, grace=300, late="deliver") == ("late", 301)
    assert late_decision(1000, 1301, grace=300, late="skip") == ("skip", 301)
    assert late_decision(1000, 1001, grace=0, late="deliver") == ("late", 1)
    assert "'deliver' or 'skip'" in error(late_decision, 1000, 2000, grace=0, late="later")


def test_parse_late() -> None:
    assert parse_late(None, "deliver") == "deliver"
    assert parse_late("", "skip") == "skip"
    assert parse_late(" SKIP ", "deliver") == "skip"
    assert "'deliver' (once" in error(parse_late, "never", "deliver")


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 seconds late"),
        (1, "1 second late"),
        (59.9, "59 seconds late"),
        (60, "1 minute late"),
        (12 * 60 + 30, "12 minutes late"),
        (HOUR, "1 hour late"),
        (HOUR + 30 * 60, "1 hour 30 minutes late"),
        (3 * HOUR, "3 hours late"),
        (12 * HOUR + 59 * 60, "12 hours late"),
        (2 * DAY, "2 days late"),
        (2 * DAY + 5 * HOUR, "2 days 5 hours late"),
        (12 * DAY + 5 * HOUR, "12 days late"),
        (-5, "0 seconds late"),
    ],
)
def test_describe_late(seconds: float, words: str) -> None:
    assert describe_late(seconds) == words


@pytest.mark.parametrize(
    ("cron", "words"),
    [
        ("* * * * *", "every minute"),
        ("*/15 * * * *", "every 15 minutes"),
        ("0 * * * *", "every hour"),
        ("5 * * * *", "every hour at :05"),
        ("30 */2 * * *", "every 2 hours at :30"),
        ("0 9 * * *", "every day at 09:00"),
        ("0 9,17 * * *", "every day at 09:00 and 17:00"),
        ("30 8 * * 1-5", "every weekday (Monday to Friday) at 08:30"),
        ("30 8 * * mon-fri", "every weekday (Monday to Friday) at 08:30"),
        ("0 10 * * 0,6", "every Saturday and Sunday at 10:00"),
        ("0 10 * * 1,3,5", "every Monday, Wednesday and Friday at 10:00"),
        ("0 10 * * 7", "every Sunday at 10:00"),
        ("0 9 1 * *", "on the 1st of every month at 09:00"),
        ("0 9 1,15 * *", "on the 1st and 15th of every month at 09:00"),
        ("0 9 l * *", "on the last day of every month at 09:00"),
        ("0 9 29 2 *", "every year on 29 Feb at 09:00"),
        # what is not easy stays the expression
        ("*/7 * * * *", "*/7 * * * *"),
        ("0 */5 * * *", "0 */5 * * *"),
        ("0 9 * * 1#2", "0 9 * * 1#2"),
        ("0 9 15w * *", "0 9 15w * *"),
        ("0,15,30,45 9,17 * * *", "0,15,30,45 9,17 * * *"),
        ("0 9 1 * 1", "0 9 1 * 1"),
        ("not cron", "not cron"),
    ],
)
def test_describe_recurrence(cron: str, words: str) -> None:
    assert describe_recurrence(cron) == words


def test_every_message_is_one_line_even_for_odd_input() -> None:
    message = error(parse_duration, "ten\nminutes")
    assert "'ten\\nminutes'" in message
    assert "\n" not in str(ScheduleError("a\nb   c"))


def ours(module: object) -> set[str]:
    """The modules of this project that ``module`` imports."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))  # type: ignore[attr-defined]
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {n for n in imported if n.split(".")[0] in {"contract", "worker", "memory", "relaybot"}}


def test_the_rules_are_pure() -> None:
    """No configuration, memory, Redis or clock: the stdlib, croniter, the zone stamp and the
    cron engine (itself stdlib and croniter only)."""
    assert ours(rules) == {"contract.timezone", "worker.schedule_cron"}
    assert ours(schedule_cron) == set()


# --- properties across zones --------------------------------------------------------------------

ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # a 30-minute change
    "Antarctica/Troll",  # a 2-hour change
    "America/Havana",  # changes at midnight
    "America/Santiago",  # southern hemisphere, changes at midnight
    "Pacific/Chatham",  # +12:45 / +13:45
    "Europe/Dublin",  # a negative DST in the zone database
    "Asia/Kolkata",  # no DST
    "UTC",
]


@cache
def changes(name: str) -> tuple[float, ...]:
    """The instants ``name``'s offset changes, 2024-2030 (found day by day, then to the minute)."""
    zone = ZoneInfo(name)
    found = []
    t = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
    end = datetime(2031, 1, 1, tzinfo=UTC).timestamp()
    while t < end:
        if datetime.fromtimestamp(t, zone).utcoffset() != (
            datetime.fromtimestamp(t + DAY, zone).utcoffset()
        ):
            low, high = t, t + DAY
            while high - low > 60:
                mid = (low + high) / 2
                if datetime.fromtimestamp(mid, zone).utcoffset() == (
                    datetime.fromtimestamp(low, zone).utcoffset()
                ):
                    low = mid
                else:
                    high = mid
            found.append(high)
        t += DAY
    return tuple(found)


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    values = st.integers(low, high)
    return st.one_of(
        st.just("*"),
        values.map(str),
        st.lists(values, min_size=2, max_size=4, unique=True).map(
            lambda v: ",".join(map(str, sorted(v)))
        ),
        st.tuples(values, values).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.sampled_from([2, 3, 5, 7, 15, 20, 30]).map(lambda k: f"*/{k}"),
    )


crons = st.tuples(
    st.one_of(_field(0, 59), st.sampled_from(["0", "30", "0,30", "*/15", "45"])),
    st.one_of(_field(0, 23), st.sampled_from(["0-3", "1,2,3", "2", "23,0,1"])),
    st.one_of(st.just("*"), st.just("*"), _field(1, 31), st.just("l")),
    st.one_of(st.just("*"), st.just("*"), _field(1, 12)),
    st.one_of(st.just("*"), st.just("*"), _field(0, 6)),
).map(" ".join)


@st.composite
def moments(draw: st.DrawFn) -> tuple[str, float]:
    """A zone and an instant near one of its changes (or anywhere, for zones without)."""
    name = draw(st.sampled_from(ZONES))
    near = changes(name)
    base = draw(st.sampled_from(near)) if near else 1.8e9
    return name, base + draw(st.integers(-30 * HOUR, 6 * HOUR))


def expected_occurrences(cron: str, zone: tzinfo, after: float, upto: float) -> list[int]:
    """Brute force, by the rules and nothing cleverer: every matching wall time anywhere near,
    read with fold 0, as one sorted set of instants."""
    start = datetime.fromtimestamp(after, UTC).replace(tzinfo=None) - timedelta(hours=15)
    stop = datetime.fromtimestamp(upto, UTC).replace(tzinfo=None) + timedelta(hours=15)
    found = set()
    it = croniter(cron, start)
    while (wall := it.get_next(datetime)) <= stop:
        when = round(wall.replace(tzinfo=zone, fold=0).timestamp())
        if after < when <= upto:
            found.add(when)
    return sorted(found)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron=crons, moment=moments())
def test_occurrences_are_every_wall_time_once_in_order(
    cron: str, moment: tuple[str, float]
) -> None:
    """Asked one by one (each from the last), the occurrences are exactly the brute-force set:
    strictly increasing, no wall time twice, none lost near a change."""
    name, after = moment
    zone = ZoneInfo(name)
    try:
        check_cron(cron, min_every=60)
    except ScheduleError:
        assume(False)
    upto = after + 12 * HOUR
    got: list[int] = []
    while (nxt := next_occurrence(cron, zone, got[-1] if got else after)) is not None:
        if nxt > upto:
            break
        got.append(nxt)
        assert len(got) < 12 * 60 + 2
    assert got == expected_occurrences(cron, zone, after, upto)
    assert all(a < b for a, b in pairwise(got))
    shown_walls = [datetime.fromtimestamp(t, zone).replace(tzinfo=None) for t in got]
    assert len(set(shown_walls)) == len(shown_walls)  # no wall time fires twice


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(ZONES),
    hour=st.integers(0, 23),
    minute=st.sampled_from([0, 1, 15, 30, 45, 59]),
    start=st.dates(date(2024, 1, 1), date(2029, 1, 1)),
)
def test_a_daily_job_fires_once_every_day(name: str, hour: int, minute: int, start: date) -> None:
    zone = ZoneInfo(name)
    after = datetime.combine(start, datetime.min.time(), zone).timestamp()
    times = walk(f"{minute} {hour} * * *", zone, after, 400)
    days = [datetime.fromtimestamp(t, zone).date() for t in times]
    assert days == [days[0] + timedelta(days=i) for i in range(len(days))]


@settings(max_examples=60, deadline=None)
@given(cron=crons, limit=st.sampled_from([60, 300, 900, HOUR, 2 * HOUR, 6 * HOUR, DAY, 2 * DAY]))
def test_an_accepted_cron_never_fires_closer_than_the_limit(cron: str, limit: int) -> None:
    try:
        normalized = check_cron(cron, min_every=limit)
    except ScheduleError as exc:
        assume("never fires" not in str(exc))
        return
    # on the wall clock (UTC has no DST), over many samples from several starts
    for start in (1.7e9, 1.8e9, 1.9e9):
        assert min_interval(normalized, UTC, start, samples=300) >= limit


@settings(max_examples=80, deadline=None)
@given(
    parts=st.lists(
        st.tuples(st.integers(0, 50), st.sampled_from(["w", "d", "h", "m", "s"])),
        min_size=1,
        max_size=5,
        unique_by=lambda p: p[1],
    )
)
def test_a_written_duration_is_the_sum_of_its_parts(parts: list[tuple[int, str]]) -> None:
    size = {"w": 7 * DAY, "d": DAY, "h": HOUR, "m": 60, "s": 1}
    total = sum(n * size[u] for n, u in parts)
    text = "".join(f"{n}{u}" for n, u in parts)
    if total == 0:
        assert "more than zero" in error(parse_duration, text)
    else:
        assert parse_duration(text) == total


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(ZONES),
    ahead=st.integers(1, 5 * 365 * DAY),
    offset_minutes=st.sampled_from([None, 0, 60, -300, 330, 825]),
)
def test_a_written_time_reads_back_as_its_instant(
    name: str, ahead: int, offset_minutes: int | None
) -> None:
    zone, now = ZoneInfo(name), 1.8e9
    ts = now + ahead
    if offset_minutes is None:  # written as the owner's wall time: the first of a repeated one
        wall = datetime.fromtimestamp(ts, zone)
        assume(wall.replace(fold=0).timestamp() == ts)
        text = wall.replace(tzinfo=None).isoformat()
    else:
        written = timezone(timedelta(minutes=offset_minutes))
        text = datetime.fromtimestamp(ts, written).isoformat()
    assert parse_at(text, zone, now) == ts
