"""The commit script sent without waiting (worker/commit_line.py), against fakeredis."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from worker.commit_line import CommitLine

SCRIPT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('LEASE not ours')
end
return redis.call('rpush', KEYS[2], ARGV[2])
"""


@pytest.fixture
def r() -> fakeredis.FakeRedis:
    r = fakeredis.FakeRedis()
    r.set("lease", "me")
    return r


def test_a_call_runs_without_its_answer_being_read(r: fakeredis.FakeRedis) -> None:
    line = CommitLine(r, SCRIPT)
    line.send(["lease", "q"], ["me", "a"])
    assert line.in_flight
    assert r.lrange("q", 0, -1) == [b"a"]  # Redis ran it: the answer is not needed for that
    line.send(["lease", "q"], ["me", "b"])  # the first answer is read first
    assert line.collect() == 2
    assert not line.in_flight
    assert line.collect() is None  # nothing in flight


def test_a_refusal_comes_out_of_the_next_collect_and_the_line_goes_on(
    r: fakeredis.FakeRedis,
) -> None:
    line = CommitLine(r, SCRIPT)
    r.set("lease", "someone else")
    line.send(["lease", "q"], ["me", "a"])  # no error yet: its answer is not read
    with pytest.raises(redis.ResponseError, match=r"^LEASE"):
        line.collect()
    r.set("lease", "me")
    assert line.call(["lease", "q"], ["me", "b"]) == 1  # the connection is still good
    assert r.lrange("q", 0, -1) == [b"b"]


def test_a_script_redis_forgot_is_sent_again_in_full(r: fakeredis.FakeRedis) -> None:
    line = CommitLine(r, SCRIPT)
    assert line.call(["lease", "q"], ["me", "a"]) == 1
    r.script_flush()  # an operator's SCRIPT FLUSH: EVALSHA now fails with NOSCRIPT
    line.send(["lease", "q"], ["me", "b"])
    assert line.collect() == 2  # ran once, by EVAL
    assert r.lrange("q", 0, -1) == [b"a", b"b"]


def test_a_new_connection_loads_the_script_first(r: fakeredis.FakeRedis) -> None:
    line = CommitLine(r, SCRIPT)
    line.send(["lease", "q"], ["me", "a"])  # a fresh Redis has no script: loaded first
    assert r.lrange("q", 0, -1) == [b"a"]
    line.reset()  # Redis went away: the call in flight is forgotten, the connection dropped
    assert not line.in_flight
    r.script_flush()  # a restarted Redis has no scripts
    line.send(["lease", "q"], ["me", "b"])
    assert r.lrange("q", 0, -1) == [b"a", b"b"]
    assert line.collect() == 2
