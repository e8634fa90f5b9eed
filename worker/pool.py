"""The threads that run turns' model calls, and the one way back to the writer.

The worker's main thread is memory's one ordered writer (worker/writer.py). A turn's model
call (and its tool rounds) runs on one of ``limit`` pool threads, so turns of different sessions
wait for the model side by side. Everything that touches memory stays on the writer: a tool
call is handed to it (:meth:`TurnPool.on_writer`) and its result handed back, so a tool that
searches memory sees what the writer has written, and memory's connection is never shared.

A finished turn is put on a queue and, when the writer waits (:meth:`TurnPool.arm`), it is woken
through a pipe (:attr:`wake_fd`): the writer waits on the pipe and on Redis at once
(worker/streams.py), so a reply is recorded as soon as the model gave it, and a new message is
read as soon as it arrives. A busy writer finds finished turns without a wake-up.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog

log = structlog.get_logger(__name__)

J = TypeVar("J")
R = TypeVar("R")
T = TypeVar("T")


@dataclass
class _Call:
    """A call handed to the writer by a turn thread."""

    fn: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


class TurnPool(Generic[J, R]):
    """``limit`` daemon threads running ``run(job)``; results come back by :meth:`completed`.

    ``run`` must not raise (worker/turn.py turns every failure into an error reply); if it does
    anyway, ``failed(job, exc)`` gives the result. The threads are daemons: a worker that
    abandons its turns (a second SIGTERM, a lost lease) exits without waiting for the model."""

    def __init__(
        self,
        limit: int,
        run: Callable[[J], R],
        failed: Callable[[J, BaseException], R],
    ) -> None:
        self.limit = limit
        self._run, self._failed = run, failed
        self._jobs: queue.SimpleQueue[J | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[J, R]] = queue.SimpleQueue()
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._writer = threading.get_ident()
        self._threads: list[threading.Thread] = []
        self._waiting = False  # the writer blocks (or is about to): wake it through the pipe
        self.running = 0  # submitted, not yet taken back by completed()

    @property
    def wake_fd(self) -> int:
        """Readable when a turn finished or a tool call waits for the writer."""
        return self._read_fd

    def start(self) -> TurnPool[J, R]:
        self._writer = threading.get_ident()
        for n in range(self.limit):
            t = threading.Thread(target=self._serve, name=f"turn-{n}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def grow(self, limit: int) -> None:
        """At least ``limit`` threads ([model] concurrency raised by a config reload). Never
        fewer: the writer starts at most its sessions' limit of turns at once (worker/sessions.py),
        so spare threads just wait."""
        if limit <= self.limit:
            return
        first, self.limit = self.limit, limit
        if not self._threads:
            return  # not started: start() makes them all
        for n in range(first, limit):
            t = threading.Thread(target=self._serve, name=f"turn-{n}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Let the threads end once idle (a thread in a model call ends after it)."""
        for _ in self._threads:
            self._jobs.put(None)
        self._threads.clear()

    def close(self) -> None:
        self.stop()
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def submit(self, job: J) -> None:
        if not self._threads:
            self.start()
        self.running += 1
        self._jobs.put(job)

    def completed(self) -> list[tuple[J, R]]:
        """The turns finished since the last call, in the order they finished."""
        out: list[tuple[J, R]] = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        self.running -= len(out)
        return out

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                result = self._run(job)
            except BaseException as exc:  # run() must not raise; a turn must come back anyway
                log.exception("turn.crashed")
                result = self._failed(job, exc)
            self._done.put((job, result))
            if self._waiting:  # a busy writer finds it without a wake-up (one syscall less)
                self.wake()

    # -- the writer ------------------------------------------------------------------------

    def on_writer(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the writer and return its result (its exception, raised here). On
        the writer itself (a turn run inline), ``fn`` runs at once."""
        if threading.get_ident() == self._writer:
            return fn()
        call = _Call(fn)
        self._calls.put(call)
        if self._waiting:
            self.wake()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.value  # type: ignore[no-any-return]

    def serve_calls(self) -> int:
        """Run the calls turn threads handed to the writer; how many ran."""
        n = 0
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                return n
            try:
                call.value = call.fn()
            except Exception as exc:  # raised in the turn thread that asked
                call.error = exc
            call.done.set()
            n += 1

    def pending(self) -> bool:
        """Results or calls wait for the writer."""
        return not self._done.empty() or not self._calls.empty()

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: it is awake already
            os.write(self._write_fd, b"\0")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._read_fd, 4096):
                pass

    def arm(self) -> bool:
        """The writer is about to block: from now on a finished turn wakes it. False when
        something waits for it already (then it must not block). Set before looking, so a
        result put meanwhile is either seen here or wakes the writer."""
        self._waiting = True
        return not self.pending()

    def disarm(self) -> None:
        self._waiting = False

    def wait(self, timeout: float) -> None:
        """Block until woken or ``timeout`` seconds pass (nothing to read from Redis now)."""
        try:
            if self.arm() and timeout > 0:
                with contextlib.suppress(InterruptedError):
                    select.select([self._read_fd], [], [], timeout)
        finally:
            self.disarm()
        self.drain()
