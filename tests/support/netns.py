"""Hosts on one machine: Linux network namespaces joined by veth pairs (``ip netns``, root).

A :class:`Host` is a namespace with its loopback up; :func:`link` joins two with a veth pair,
an address on each end; :meth:`Host.link_down` / :meth:`Host.link_up` cut and restore one.
Processes run in a host under ``ip netns exec NAME`` (:attr:`Host.wrap`); servers the test runs
in its own process (the fake model, the mail servers) are started by :meth:`Host.run`, which
calls a function on a thread that entered the namespace (``setns`` is per thread): the sockets
and threads it creates live there, and so do the processes it starts.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (not root, no ``ip``), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"rbprobe{os.getpid() % 100000}"
    try:
        _ip("netns", "add", name)
    except (OSError, FileNotFoundError) as exc:
        return f"cannot add a network namespace: {exc}"
    _ip("netns", "del", name)
    return None


class Host:
    """A network namespace standing for one host."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.wrap = ["ip", "netns", "exec", name]

    def __enter__(self) -> Host:
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on a thread inside this namespace; its result (or its exception)."""
        out: dict[str, Any] = {}

        def inside() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {self.name}: {os.strerror(err)}")
                out["value"] = fn()
            except BaseException as exc:  # handed to the caller
                out["error"] = exc
            finally:
                os.close(fd)

        thread = threading.Thread(target=inside, name=f"netns-{self.name}", daemon=True)
        thread.start()
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["value"]  # type: ignore[no-any-return]

    def link_down(self, dev: str) -> None:
        _ip("-n", self.name, "link", "set", dev, "down")

    def link_up(self, dev: str) -> None:
        _ip("-n", self.name, "link", "set", dev, "up")


def link(a: Host, a_ip: str, b: Host, b_ip: str, dev: str) -> tuple[str, str]:
    """A veth pair between ``a`` and ``b`` (``<dev>a`` in a, ``<dev>b`` in b), addresses in a
    /24 on each end, up; the two device names."""
    da, db = f"{dev}a", f"{dev}b"
    _ip("link", "add", da, "netns", a.name, "type", "veth", "peer", "name", db, "netns", b.name)
    for host, d, ip in ((a, da, a_ip), (b, db, b_ip)):
        _ip("-n", host.name, "addr", "add", f"{ip}/24", "dev", d)
        _ip("-n", host.name, "link", "set", d, "up")
    return da, db
