"""The one policy every process follows when Redis goes away (contract/outage.py)."""

from __future__ import annotations

import fakeredis
import redis
from structlog.testing import capture_logs

from contract.outage import REDIS_CAP, TRANSIENT, Outage, wait_until_reachable


def is_transient(exc: BaseException) -> bool:
    """Redis is away for now (not a refused command, a bad script, or a full memory)."""
    return isinstance(exc, TRANSIENT)


def test_transient_errors_are_the_connection_ones_not_refused_commands() -> None:
    assert is_transient(redis.ConnectionError("refused"))
    assert is_transient(redis.TimeoutError("slow"))
    assert is_transient(redis.BusyLoadingError("LOADING Redis is loading the dataset"))
    assert not is_transient(redis.ResponseError("NOSCRIPT"))
    assert not is_transient(redis.ResponseError("OOM command not allowed"))


def test_each_failure_logs_its_retry_delay_and_the_recovery_is_said_once() -> None:
    outage = Outage("worker")
    with capture_logs() as logs:
        outage.recovered()  # never away: nothing to say
        delays = [outage.failed(redis.ConnectionError("gone")) for _ in range(6)]
        outage.recovered()
        outage.recovered()
        again = outage.failed(redis.ConnectionError("gone"))
    assert delays == [1.0, 2.0, 4.0, 8.0, REDIS_CAP, REDIS_CAP]
    assert again == 1.0  # reset by the recovery
    unreachable = [e for e in logs if e["event"] == "redis.unreachable"]
    assert [e["retry_in"] for e in unreachable] == [*delays, 1.0]
    assert all(e["where"] == "worker" and e["error"] == "gone" for e in unreachable)
    reconnected = [e for e in logs if e["event"] == "redis.reconnected"]
    assert len(reconnected) == 1 and reconnected[0]["tries"] == 6
    assert outage.since_away() == 0.0  # away again
    outage.recovered()
    assert 0.0 < outage.since_away() < 60.0


def test_waiting_until_reachable_pings_with_the_backoff_and_stops_when_asked() -> None:
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)
    server.connected = False
    naps: list[float] = []

    def nap(seconds: float) -> bool:
        naps.append(seconds)
        server.connected = len(naps) >= 3  # Redis is back after the third wait
        return True

    outage = Outage("jobs")
    with capture_logs() as logs:
        assert wait_until_reachable(r, outage, nap)
    assert naps == [1.0, 2.0, 4.0]
    assert [e["event"] for e in logs][-1] == "redis.reconnected"
    server.connected = False
    assert not wait_until_reachable(r, Outage("jobs"), lambda _s: False)  # stopping
