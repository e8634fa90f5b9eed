"""The turn facade: what a turn of the worker reads and writes of memory.

- :class:`Memory` (memory/facade.py): recording a message and its reply, the context, commands,
  derived entries, redactions and degraded mode, through one object; :class:`MemorySettings`,
  what it is configured with (plain values, never the application's configuration);
- :func:`privacy_of`: a scope's privacy class (what a turn may see, memory/privacy.py);
- the turn's tools' reads and writes, each through the privacy rule: ``notes``
  (memory/notes/: remember, recall), ``search`` (memory/search/: search_history),
  ``summary_view`` (layer 1's summaries a scope may see), ``profile_view`` (layer 2's profile
  facts a scope may see: the ``profile`` tool reads them through :meth:`Memory.profile`),
  :func:`memory_write` (MEMORY.md).

The worker imports memory through this module, memory.writer, memory.errors and memory.types
only (an import-linter contract in pyproject.toml).
"""

from memory import notes, profile_view, search, summary_view
from memory.curated import memory_write
from memory.facade import Memory, MemorySettings
from memory.privacy import privacy_of

__all__ = [
    "Memory",
    "MemorySettings",
    "memory_write",
    "notes",
    "privacy_of",
    "profile_view",
    "search",
    "summary_view",
]
