"""Everything relaybot keeps is the owner's alone: files 0600, directories 0700.

New files: every ``relaybot`` process sets the umask 077 as it starts, so what it creates (the
memory database and its ``-wal``/``-shm``, config.toml, the embedded Redis's files, a channel's
store, logs, exports) and what its children create (``redis-server``) is private.

Files from before (an older relaybot, a copy, an editor that kept a file's 0644): each command
takes the group's and others' bits off everything under ``RELAYBOT_HOME`` (and off the memory
database and a channel's store where the configuration puts them elsewhere), and says so in its
log (``home.permissions_tightened``), once: afterwards there is nothing left to tighten.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # every command sets the umask before its arguments are read: nothing heavy
    from contract.config import Config

PRIVATE_UMASK = 0o077
OTHERS = 0o077  # the group's and everyone else's permission bits


@dataclass(frozen=True)
class Loose:
    """A path that others may read, write or enter: its mode before, and after tightening."""

    path: Path
    mode: int

    @property
    def tightened(self) -> int:
        return self.mode & ~OTHERS


def restrict_new_files() -> None:
    """Files and directories this process (and its children) creates: 0600 / 0700."""
    os.umask(PRIVATE_UMASK)


def _tree(root: Path) -> Iterator[Path]:
    """``root`` and everything under it, without following symbolic links."""
    if not root.exists() or root.is_symlink():
        return
    yield root
    if not root.is_dir():
        return
    for top, dirs, files in os.walk(root, followlinks=False, onerror=None):
        for name in (*dirs, *files):
            yield Path(top, name)


def private_paths(cfg: Config) -> Iterator[Path]:
    """What relaybot keeps for the owner: the home, and what the configuration puts elsewhere."""
    from contract import channels as registry

    home = cfg.home
    yield from _tree(home)
    memory = cfg.memory_path
    if not memory.is_relative_to(home):
        for suffix in ("", "-wal", "-shm", "-journal"):
            yield from _tree(memory.with_name(memory.name + suffix))
    for ch in registry.channels():  # what a channel's section puts elsewhere (a crypto store)
        for path in ch.private(getattr(cfg, ch.name)) if ch.private is not None else ():
            if not path.is_relative_to(home):
                yield from _tree(path)


def loose_paths(cfg: Config) -> list[Loose]:
    """Paths others may read, write or enter (symbolic links are left alone: their mode means
    nothing, and their target may not be ours)."""
    found = []
    for path in private_paths(cfg):
        try:
            st = path.lstat()
        except FileNotFoundError:  # gone meanwhile (a -shm, a socket)
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & OTHERS:
            found.append(Loose(path, mode))
    return found


def tighten(cfg: Config) -> tuple[list[Loose], list[tuple[Loose, OSError]]]:
    """Take the group's and others' bits off every loose path; what was tightened, and what
    could not be (a file owned by someone else)."""
    done: list[Loose] = []
    failed: list[tuple[Loose, OSError]] = []
    for loose in loose_paths(cfg):
        try:
            os.chmod(loose.path, loose.tightened)
        except FileNotFoundError:
            continue
        except OSError as exc:
            failed.append((loose, exc))
        else:
            done.append(loose)
    return done, failed
