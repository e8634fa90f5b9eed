"""Libraries imported without the optional extras relaybot never uses (start-up time).

When they are installed, structlog imports rich (for its own pretty tracebacks; relaybot's logs
render plain ones, contract/logs.py) and Twisted (for Twisted's loggers; the test suite's IMAP
server installs it); httpx imports its command-line client, with click, pygments and rich. That
is about half of structlog's import time and two thirds of httpx's, in every process; httpcore
(what an httpx client sends with) imports h2 for HTTP/2, which relaybot's model client does not
speak: half of httpcore's. rich stays installed and importable: ``relaybot chat`` renders
Markdown with it on a terminal.

:func:`lean_structlog`, :func:`lean_httpx` and :func:`lean_httpcore` import one with its
extras hidden for that import only (``sys.modules[extra] = None``: the ``import rich`` inside
raises the ImportError the library expects when the extra is not installed), then make them
importable again. A library already imported is left as it is, and so is an extra already
imported (it costs nothing more then). relaybot/cli.py calls them before anything else imports
these libraries; contract/config.py imports httpx through :func:`lean_httpx` where it checks a
model URL.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def _hidden(*extras: str) -> Iterator[None]:
    """While inside: ``import <extra>`` raises ImportError, for each extra not yet imported."""
    hidden = [extra for extra in extras if extra not in sys.modules]
    for extra in hidden:
        sys.modules[extra] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for extra in hidden:
            del sys.modules[extra]


def lean_structlog() -> None:
    """Import structlog without rich and Twisted."""
    with _hidden("rich", "twisted"):
        import structlog  # noqa: F401


def lean_httpx() -> None:
    """Import httpx without its command-line client (httpx._main imports click first)."""
    with _hidden("click", "pygments", "rich"):
        import httpx  # noqa: F401


def lean_httpcore() -> None:
    """Import httpcore (what an httpx client sends with) without HTTP/2: relaybot's model client
    speaks HTTP/1.1 (``http2=False``, so it never offers h2), and httpcore imports h2 only for
    HTTP/2 connections once it is imported (matrix-nio installs h2)."""
    with _hidden("h2"):
        import httpcore  # noqa: F401
