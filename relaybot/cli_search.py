"""`relaybot memory search QUERY`: the owner's full-text search over the whole history.

The memory database is opened read-only (the worker is its only writer) and searched in the
owner's scope, which sees every conversation: the same search as the model's ``search_history``
tool (memory/search/), with the same filters. Exit codes: 0 (also when nothing matched),
1 the database cannot be read or an argument is wrong, 2 configuration error.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json

if TYPE_CHECKING:
    from contract.config import Config

EXIT_FAILED = 1
MAX_LIMIT = 50  # memory.search.MAX_LIMIT (not imported here: the CLI starts fast)
OWNER_HEADER = "Search results from the message history:"


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
        return value

    return parse


def _limit(text: str) -> int:
    value = int(_positive(int)(text))
    if value > MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"at most {MAX_LIMIT}")
    return value


def add_parsers(sub: Any) -> None:  # argparse's subparsers action has no public type
    """Add this module's subcommands; each sets `func(args, cfg) -> exit code`."""
    p = sub.add_parser(
        "search",
        help="full-text search over the whole message history (read-only)",
        description="Search every conversation's messages, as the owner may. Words are matched "
        'with their variants (walk, walked, walking); "quoted words" match as a phrase; word* '
        "matches a prefix. Common words are ignored.",
    )
    p.add_argument("query", nargs="+", help="words to look for")
    p.add_argument("--days", type=_positive(float), help="only the last N days")
    p.add_argument("--channel", help="only this channel (cli, or a gateway's)")
    p.add_argument(
        "--sender",
        help="only messages of this sender: a handle channel:address, an address, an entity "
        "id e-… (with the handles linked to it), 'owner', or the assistant's name (its replies); "
        "never a display name",
    )
    p.add_argument("--conversation", help="only this conversation (its id, as in the output)")
    p.add_argument(
        "--order",
        choices=("relevance", "time"),
        default="relevance",
        help="best matches first (default), or newest first",
    )
    p.add_argument(
        "--limit", type=_limit, default=10, help=f"at most N matches (default 10, max {MAX_LIMIT})"
    )
    p.add_argument("--json", action="store_true", help="JSON Lines: one match per line")
    p.set_defaults(func=cmd_search)


def cmd_search(args: argparse.Namespace, cfg: Config) -> int:
    from contract.messages import Privacy
    from contract.timezone import owner_zone
    from memory.errors import MemoryFailure, SearchError
    from memory.types import OwnerResolver, Scope, SearchQuery
    from memory.view import MemoryView, format_hits, hit_record

    if not cfg.memory_path.exists():
        echo(f"no memory database yet at {cfg.memory_path} (the worker creates it)")
        return 0
    query = SearchQuery(
        text=" ".join(args.query),
        days=args.days,
        channel=args.channel,
        sender=args.sender,
        conversation=args.conversation,
        order=args.order,
        limit=args.limit,
    )
    scope = Scope(conversation="cli", privacy=Privacy.OWNER, entity="owner")
    assistant = cfg.worker.assistant_name
    zone = owner_zone(cfg.owner.timezone)  # the times as the model's search_history shows them
    try:
        with MemoryView(cfg.memory_path) as store:
            owners = store.owners(OwnerResolver(cfg.owner_aliases))
            result = store.search(scope, query, owners=owners, assistant=assistant)
    except SearchError as exc:
        echo(f"relaybot: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except MemoryFailure as exc:
        echo(
            f"relaybot: cannot search the memory database {cfg.memory_path}: {exc}", file=sys.stderr
        )
        return EXIT_FAILED
    if not result.terms:
        echo("relaybot: nothing to search for: give some words", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        for hit in result.hits:
            echo_json(hit_record(hit, assistant, owners, zone), ensure_ascii=False)
        if result.corrupt:
            echo(f"relaybot: {result.corrupt} damaged messages skipped", file=sys.stderr)
        return 0
    echo(
        format_hits(
            result, assistant, header=OWNER_HEADER, max_chars=1 << 30, owners=owners, zone=zone
        )
    )
    return 0


__all__ = ["add_parsers", "cmd_search"]
