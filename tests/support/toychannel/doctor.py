"""``relaybot doctor``'s toy checks: the inbox file is there to be read."""

from __future__ import annotations

from contract.checks import Add, ok, skipped, warn
from contract.config import Config
from tests.support.toychannel.config import ToyConfig


def toy_group(cfg: Config, timeout: float, add: Add) -> None:
    section = ToyConfig.of(cfg)
    if not section.configured or section.inbox is None:
        add(skipped("toy.inbox", "[toy] has no inbox and outbox (the toy gateway idles)"))
    elif section.inbox.exists():
        add(ok("toy.inbox", f"{section.inbox} is there to be read"))
    else:
        add(warn("toy.inbox", f"{section.inbox} does not exist", "create it"))
