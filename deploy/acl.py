"""deploy/redis/users.acl, generated: one Redis ACL user per process, from the channel registry.

The worker's and the jobs process's users are here; each gateway's is its channel's spec's
``acl`` rules (contract/channels.py), so a channel's account line lives in its folder. The
shipped file is this module's output for the default prefix (a test checks they are the same);
after adding a channel or changing a spec's rules, regenerate it::

    python -m deploy.acl > deploy/redis/users.acl

``--prefix`` writes the file for another ``redis.prefix`` (every ``relaybot:`` in it changes).
The file needs Redis >= 7.0 (the terminal's read-only selector for ``relaybot status``);
``--redis-6.2`` writes it without selectors, for a Redis 6.2 (status then shows less).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from contract import channels as registry

DEFAULT_PREFIX = "relaybot:"
# the processes that are not a channel's gateway: every key under the prefix, rq's too
PROCESSES = (
    ("worker", "~{prefix}* ~rq:* &* +@all -@dangerous +info +client +bgrewriteaof +bgsave"),
    ("jobs", "~{prefix}* ~rq:* &* +@all -@dangerous +info +client"),
)


def user_line(name: str, rules: str, prefix: str = DEFAULT_PREFIX) -> str:
    """One ``user`` line: ``relaybot-<name>``, on, a placeholder password, its rules."""
    return f"user relaybot-{name} on >CHANGE-ME-{name} {rules.format(prefix=prefix)}"


def render(prefix: str = DEFAULT_PREFIX, *, selectors: bool = True) -> str:
    """The ACL file: the default user off, the worker, jobs, then each channel with ACL rules.
    ``selectors`` False: without the ``(...)`` selectors Redis 6.2 does not know."""
    lines = ["user default off"]
    lines += [user_line(name, rules, prefix) for name, rules in PROCESSES]
    lines += [user_line(ch.name, ch.acl, prefix) for ch in registry.channels() if ch.acl]
    if not selectors:
        lines = [re.sub(r"\s*\([^)]*\)", "", line) for line in lines]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.acl", description=__doc__)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="redis.prefix of the install")
    parser.add_argument(
        "--redis-6.2",
        dest="six",
        action="store_true",
        help="for Redis 6.2: no read-only selectors (status under relaybot-cli shows less)",
    )
    args = parser.parse_args(argv)
    if not args.prefix or any(c.isspace() for c in args.prefix):
        parser.error(f"--prefix {args.prefix!r}: an ACL key pattern, not empty, no whitespace")
    sys.stdout.write(render(args.prefix, selectors=not args.six))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
