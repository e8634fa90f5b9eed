"""The jobs process (worker/jobs.py) starts rq's loop again when it ends without a stop request:
rq quits its loop on a Redis timeout or an error of its own, and one process that exits stops
every process under honcho."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import fakeredis
import pytest
import redis

from contract.config import Config
from worker import jobs


class FakeWorker:
    """rq's Worker as run_jobs uses it: the first loop ends as on a Redis timeout, the second
    as on SIGTERM."""

    made: ClassVar[list[FakeWorker]] = []

    def __init__(self, *_args: Any, **_kw: Any) -> None:
        self._stop_requested = False
        self._shutdown_requested_date: object = None
        FakeWorker.made.append(self)

    def bury_horse(self) -> None:
        pass

    def work(self, *, burst: bool, with_scheduler: bool) -> bool:
        if len(FakeWorker.made) > 1:  # SIGTERM while idle: rq notes the date, raises, returns
            self._shutdown_requested_date = object()
        return False


def test_an_rq_loop_that_ends_unasked_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeWorker.made.clear()
    monkeypatch.setattr(jobs, "Worker", FakeWorker)
    monkeypatch.setattr(jobs, "rq_connection", lambda r, poll=jobs.POLL: r)
    monkeypatch.setattr(jobs.Outage, "failed", lambda self, exc, **info: 0.01)
    assert jobs.run_jobs(Config(home=tmp_path), fakeredis.FakeRedis()) == 0
    assert len(FakeWorker.made) == 2  # the first loop ended unasked: a second one ran


class CutShortWorker(FakeWorker):
    """SIGTERM during rq's start-up pipeline (CI): rq's handler raised out of the read, and the
    pipeline failed with redis-py's ResponseError."""

    asked = True

    def work(self, *, burst: bool, with_scheduler: bool) -> bool:
        if CutShortWorker.asked:
            self._shutdown_requested_date = object()  # rq's request_stop, first thing
        raise redis.ResponseError("Wrong number of response items from pipeline execution")


def test_a_stop_during_an_rq_redis_call_is_a_clean_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs, "Worker", CutShortWorker)
    monkeypatch.setattr(jobs, "rq_connection", lambda r, poll=jobs.POLL: r)
    CutShortWorker.asked = True
    assert jobs.run_jobs(Config(home=tmp_path), fakeredis.FakeRedis()) == 0
    CutShortWorker.asked = False  # the same error with no stop asked is not hidden
    with pytest.raises(redis.ResponseError):
        jobs.run_jobs(Config(home=tmp_path), fakeredis.FakeRedis())


class FullRedisWorker(FakeWorker):
    """rq's start-up (its registration, an HSET) refused by a full Redis (maxmemory)."""

    def work(self, *, burst: bool, with_scheduler: bool) -> bool:
        if len(FakeWorker.made) == 1:
            raise redis.exceptions.OutOfMemoryError(
                "command not allowed when used memory > 'maxmemory'."
            )
        return super().work(burst=burst, with_scheduler=with_scheduler)


def test_a_full_redis_is_ridden_out_not_an_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`CONFIG SET maxmemory 1`: jobs exited 1 (`cannot reach Redis`), which stops every process
    under honcho; it backs off and goes on, as the worker does."""
    FakeWorker.made.clear()
    monkeypatch.setattr(jobs, "Worker", FullRedisWorker)
    monkeypatch.setattr(jobs, "rq_connection", lambda r, poll=jobs.POLL: r)
    monkeypatch.setattr(jobs.Outage, "failed", lambda self, exc, **info: 0.01)
    assert jobs.run_jobs(Config(home=tmp_path), fakeredis.FakeRedis()) == 0
    assert len(FakeWorker.made) == 2  # started again once Redis took writes
