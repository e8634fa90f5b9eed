"""A TCP proxy in front of a real Redis that drops a connection right after one command ran.

For "the connection dropped after the XADD" faults: the client's bytes go to Redis unchanged;
once a request holding the armed command (e.g. ``XADD``) has been forwarded, the proxy waits for
Redis's answer to arrive (so the command certainly ran), throws the answer away and closes both
sides. The client sees a lost connection for a command that Redis did execute. It cuts ``times``
times, then is a plain proxy; ``cuts`` says how often it did. The first ``skip`` requests with the
command pass uncut (a gateway's start-up check of its account queues an XADD in a MULTI that it
discards: contract/access.py).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

from tests.support.servers import free_port


class CutProxy:
    def __init__(
        self, upstream_port: int, *, command: bytes, times: int = 1, skip: int = 0
    ) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.marker = b"\r\n" + command.upper() + b"\r\n"
        self.left = times
        self.skip = skip
        self.cuts = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> CutProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            link = _Link(self, client, server)
            threading.Thread(target=link.upward, daemon=True).start()
            threading.Thread(target=link.downward, daemon=True).start()

    def arm(self, data: bytes) -> bool:
        """Is this request to be cut after it ran? (counts it)"""
        with self._lock:
            if self.left > 0 and self.marker in data.upper():
                if self.skip > 0:
                    self.skip -= 1
                    return False
                self.left -= 1
                self.cuts += 1
                return True
        return False


class _Link:
    def __init__(self, proxy: CutProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.cutting = threading.Event()

    def upward(self) -> None:
        try:
            while data := self.client.recv(65536):
                if self.proxy.arm(data):
                    self.cutting.set()
                self.server.sendall(data)
        except OSError:
            pass
        self.close()

    def downward(self) -> None:
        try:
            while data := self.server.recv(65536):
                if self.cutting.is_set():  # the armed command ran: its answer is lost
                    break
                self.client.sendall(data)
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
