"""A lease holder's identity says whether its process still runs on this host
(contract.liveness.gone_from_this_host): a restore waits out the lease of a worker that is gone
(honcho stops the worker and its Redis at once, so the lease is not released)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from contract.liveness import gone_from_this_host, process_identity


def test_a_running_process_is_not_gone() -> None:
    assert not gone_from_this_host(process_identity("worker"))


def test_a_process_that_ended_is_gone() -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert gone_from_this_host(f"worker@{socket.gethostname()}:{done.stdout.strip()}")


def test_another_host_or_a_strange_identity_is_never_taken_for_gone() -> None:
    assert not gone_from_this_host(f"worker@not-{socket.gethostname()}:999999")
    assert not gone_from_this_host("restore:host:12:34")
    assert not gone_from_this_host(f"worker@{socket.gethostname()}:x{os.getpid()}")
