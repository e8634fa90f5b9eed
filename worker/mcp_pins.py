"""Where the pins of MCP servers are kept (issue 29): one file per server,
``$RELAYBOT_HOME/mcp/pins/NAME.json``, written only by the worker's MCP hub (worker/mcp_hub.py).

A pin is what the owner approved of a server's tools (worker/mcp_rules.py :class:`Pin`): the
first listing seen (trust on first use) or the one last approved (``relaybot tools approve``).
It is configuration, not memory: it survives an erasure or a restore of memory and is never
shown to a turn. A file is replaced whole (a temporary file, fsync, rename, the directory
fsynced), so a crash leaves the old pin or the new, never half of one. A file that cannot be
read is :class:`~worker.mcp_rules.PinError`: nothing of that server counts as approved, and the
hub never takes it for a first sight (it does not overwrite it; only the owner's approval does).
"""

from __future__ import annotations

from pathlib import Path

from contract.files import write_atomic
from contract.mcp_config import server_name_problem
from worker.mcp_rules import Pin, PinError

MAX_PIN_BYTES = 4_000_000  # a pin of a few thousand tools; a bigger file is not a pin of ours


class PinStore:
    """The pins under ``root`` (``cfg.home / "mcp" / "pins"``; made on the first write)."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, server: str) -> Path:
        problem = server_name_problem(server)
        if problem is not None:  # never a path outside the pins' folder
            raise ValueError(problem)
        return self._root / f"{server}.json"

    def read(self, server: str) -> Pin | None:
        """The pin of ``server``; None when it has none (no file); :class:`PinError` when its
        file cannot be read or is not a pin of that server."""
        path = self._path(server)
        try:
            if path.stat().st_size > MAX_PIN_BYTES:
                raise PinError(f"{path} is larger than {MAX_PIN_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise PinError(f"{path} cannot be read: {exc.__class__.__name__}") from None
        try:
            pin = Pin.from_json(text)
        except PinError as exc:
            raise PinError(f"{path}: {exc}") from None
        if pin.server != server:
            raise PinError(f"{path} is the pin of another server ({pin.server[:40]!r})")
        return pin

    def write(self, pin: Pin) -> None:
        """Replace ``pin.server``'s pin with ``pin`` at once (0600, its folder made if needed)."""
        write_atomic(self._path(pin.server), pin.to_json() + "\n")
