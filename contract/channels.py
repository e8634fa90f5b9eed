"""The channels relaybot has: one registry, read by every table that lists channels (issue 25).

A channel is a plugin. Its package declares a :class:`Channel` spec in the Python entry-point
group ``relaybot.channels`` (pyproject.toml: ``<name> = "gateways.<name>.channel:CHANNEL"``),
the way a third-party ``relaybot-telegram`` package would; :func:`channels` finds them with
``importlib.metadata`` once per process (cached) and loads the spec modules only: a spec module
imports the contract and pydantic, never its platform's client library. What a spec names by a
dotted reference (``"module:attr"``: the gateway's runner, its doctor probes, its onboarding
questions, its erasure hook) is imported by the application or the worker when it runs it
(:func:`load`), so neither imports a gateway statically.

The tables that read the registry: the config sections and their environment variables
(contract/config.py), what each gateway uses and reloads (contract/config_watch.py), the lease's
account (gateways/lease.py), the streams the worker reads, the ACL file (deploy/acl.py), the
Redis probes and doctor's checks (relaybot/doctor_*.py), onboarding, ``relaybot gateway
<name>``, the erasure hooks (worker/scrub.py). A channel they are asked about and the registry
does not list is an :class:`UnknownChannel` error, never a default.

A package whose channel does not load, names another channel, has a name no stream key can
hold, or declares a channel relaybot's own package (or a second package) declares is left out,
logged (``channels.refused``) and shown by doctor (``channels.packages``): one bad plugin stops
no process, and none replaces a shipped channel.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, ClassVar, Self

import structlog
from pydantic import BaseModel, ConfigDict

from contract.keys import Keys

log = structlog.get_logger(__name__)

GROUP = "relaybot.channels"  # the entry-point group a channel's package declares its spec in

Probe = tuple[str, ...]  # a Redis command with its keys, as doctor sends it under an ACL user


class UnknownChannel(LookupError):
    """A channel no installed package declares (``relaybot.channels`` entry points)."""

    def __init__(self, name: str, known: tuple[str, ...], why: tuple[str, ...] = ()) -> None:
        said = f"unknown channel {name!r}: the channels are {', '.join(known)}"
        super().__init__("; ".join([said, *why]))
        self.name = name


class ChannelSection(BaseModel):
    """A channel's section of config.toml (``[<channel>]``), validated as strictly as every
    other section. Gateway code reads its own with :meth:`of` (``ToyConfig.of(cfg)``)."""

    model_config = ConfigDict(extra="forbid")

    SECTION: ClassVar[str]  # the section's name: the channel's

    @property
    def configured(self) -> bool:
        """Whether the gateway has what it needs to run (else it idles)."""
        return True

    @classmethod
    def of(cls, cfg: object) -> Self:
        """This channel's section of a configuration (contract.config.Config)."""
        value = getattr(cfg, cls.SECTION, None)
        if not isinstance(value, cls):
            raise UnknownChannel(cls.SECTION, names())
        return value


@dataclass(frozen=True)
class Erasure:
    """A channel's erasure hook (its spec's ``erase`` names one): what the worker runs, after an
    erasure, on what the channel's gateway keeps in Redis beyond the streams and queues."""

    # the counts :attr:`scrub` reports (0 when it did not run): the erasure log's fields
    counts: tuple[str, ...]
    # scrub(r, keys, erased event ids, event ids whose subject repeated an erased one's)
    scrub: Callable[[Any, Keys, list[str], list[str]], dict[str, int]]
    # dead_letter(raw, event_erased, sender_erased): does a raw platform payload the gateway
    # made a dead letter of belong to an erased message or sender?
    dead_letter: Callable[[str, Callable[[str], bool], Callable[[str], bool]], bool] | None = None
    # said(counts): the erasure report's words for its counts (``relaybot memory erase``)
    said: Callable[[Mapping[str, Any]], str] | None = None
    # raw_texts(value): the texts inside a raw platform payload (a mail's decoded parts), where an
    # erased text is looked for; nothing when the value is not one of its payloads
    raw_texts: Callable[[str], Iterable[str]] | None = None


@dataclass(frozen=True)
class Channel:
    """What relaybot knows of a channel: everything a central table needs, in one place."""

    name: str  # the sessions' prefix, the stream's suffix, the heartbeat's gateway:<name>
    title: str  # "the toy gateway": help texts
    order: int = 100  # where it is listed (the shipped ones: 0, 10, 20)
    # config.toml's [<name>] (None: the channel has no section)
    section: type[ChannelSection] | None = None
    # environment variable -> key of the section; later entries win over earlier ones
    env: tuple[tuple[str, str], ...] = ()
    # what its gateway uses of the configuration and what it reloads without a restart
    # (contract/config_watch.py: ``section`` or ``section.key``)
    uses: tuple[str, ...] = ("redis", "delivery")
    reloads: tuple[str, ...] = ()
    # keys whose change the worker takes too (the owner's addresses in the section)
    worker_uses: tuple[str, ...] = ()
    # the platform account its gateway acts as, from its section (None for a channel without
    # one); the lease is per channel and
    # account); None: the channel takes no lease (the terminal: one per person, many at once)
    account: Callable[[Any], str] | None = None
    # the owner's addresses that its section lists (the worker adds them to owner.aliases)
    owner_addresses: Callable[[Any], list[str]] | None = None
    # tables of its section whose keys the owner names (room ids): doctor's typo check skips them
    free_keys: tuple[str, ...] = ()
    # paths its section names that hold the owner's data (kept private like the home: 0600/0700)
    private: Callable[[Any], list[Path]] | None = None
    # what doctor says of a section with settings that stay inert (the key that turns the
    # gateway on is missing): (what it found, what to do); None when there is nothing to say
    inert: Callable[[Any], tuple[str, str] | None] | None = None
    # its Redis ACL user's rules (deploy/redis/users.acl), ``{prefix}`` for the key prefix
    acl: str = ""
    # the commands (with keys) its gateway sends beyond the common ones: doctor's ACL probes
    probes: Callable[[Keys], list[Probe]] | None = None
    # dotted references, imported when used (:func:`load`)
    gateway: str = ""  # run(cfg, r) -> exit code: ``relaybot gateway <name>``
    doctor: str = ""  # group(cfg, timeout, add): its checks (contract/checks.py), ``<name>.*``
    doctor_budget: float = 4  # timeouts its doctor group may take
    onboard: str = ""  # the onboarding questions of its section
    erase: str = ""  # its Erasure (worker/scrub.py runs it)
    # whether an entry's audience is the platform's (the worker checks claims) and whether the
    # gateway publishes redactions of its messages
    audience: bool = False
    redactions: bool = False
    # whether its messages carry a subject their replies repeat (an erased one's is taken out of
    # them: memory/subjects.py)
    subjects: bool = False
    platform: str = ""  # the platform's name in words ("" : the channel's name)
    hint: str = ""  # how to configure it, said when it idles


_FIX = "fix or uninstall that package; relaybot's own channels cannot be replaced"
OWN = "relaybot"  # the distribution whose channels no other package may replace
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")  # contract.messages.ChannelName


@dataclass(frozen=True)
class _Found:
    channels: dict[str, Channel]
    refused: tuple[str, ...]  # a package's channel left out, and why (doctor shows them)


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return str(getattr(dist, "name", "") or "")


def _spec(ep: EntryPoint) -> Channel:
    """The spec an entry point names, or why it is not one (raised as ValueError)."""
    if not _NAME.fullmatch(ep.name):
        raise ValueError("not a channel name (a-z, 0-9, _ or -, at most 32, a letter first)")
    try:
        spec = ep.load()
    except Exception as exc:  # a broken package: any failure leaves it out, with its reason
        raise ValueError(f"does not load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(spec, Channel):
        raise ValueError("is not a contract.channels.Channel")
    if spec.name != ep.name:
        raise ValueError(f"declares the channel {spec.name!r}")
    return spec


@cache
def _registry() -> _Found:
    """Every package's channels. A package that does not load, names its channel wrongly, or
    declares a name relaybot's own package declares (or another package does too) is left out
    and said (:func:`refused`): one bad plugin stops no process, and none replaces a channel."""
    claims: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=GROUP):
        same = claims.setdefault(ep.name, [])
        if all((e.value, _distribution(e)) != (ep.value, _distribution(ep)) for e in same):
            same.append(ep)  # the same package seen twice on sys.path counts once
    found: dict[str, Channel] = {}
    refused: list[str] = []
    for name, eps in claims.items():
        own = [e for e in eps if _distribution(e) == OWN]
        chosen = own[:1] if own else (eps if len(eps) == 1 else [])
        for ep in eps:
            if ep not in chosen:
                by = ", ".join(f"{e.value} ({_distribution(e) or '?'})" for e in eps)
                refused.append(f"channel {name!r} = {ep.value}: declared more than once ({by})")
        for ep in chosen:
            try:
                found[name] = _spec(ep)
            except ValueError as exc:
                refused.append(f"channel {name!r} = {ep.value} ({_distribution(ep)}): {exc}")
    for reason in refused:
        log.error("channels.refused", reason=reason, fix=_FIX)
    ordered = dict(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))
    return _Found(ordered, tuple(refused))


def refused() -> tuple[str, ...]:
    """The packages' channels left out of the registry, each with why."""
    return _registry().refused


def channels() -> tuple[Channel, ...]:
    """Every registered channel, in listing order."""
    return tuple(_registry().channels.values())


def names() -> tuple[str, ...]:
    """The registered channels' names, in listing order."""
    return tuple(_registry().channels)


def channel(name: str) -> Channel:
    """The spec of ``name``; :class:`UnknownChannel` when no package declares it."""
    try:
        return _registry().channels[name]
    except KeyError:
        why = tuple(r for r in refused() if r.startswith(f"channel {name!r} "))
        raise UnknownChannel(name, names(), why) from None


@cache
def having(flag: str) -> frozenset[str]:
    """The names of the channels whose spec sets ``flag`` (``audience``, ``redactions``,
    ``subjects``): asked for every entry the worker takes, so kept."""
    return frozenset(ch.name for ch in channels() if getattr(ch, flag))


def forget() -> None:
    """Read the entry points again at the next call (a test that installed a channel)."""
    _registry.cache_clear()
    having.cache_clear()


def erasures() -> dict[str, Erasure]:
    """Each channel's erasure hook (its spec's ``erase``), imported at the first call."""
    return _erasures(channels())


@cache
def _erasures(specs: tuple[Channel, ...]) -> dict[str, Erasure]:
    found = {ch.name: load(ch.erase) for ch in specs if ch.erase}
    for name, hook in found.items():
        if not isinstance(hook, Erasure):
            raise TypeError(f"channel {name}: its erase reference is not a contract Erasure")
    return found


def load(reference: str) -> Any:
    """The object a dotted reference ``module:attr`` names, imported now, the way an entry
    point's object is (the same syntax, the same loader)."""
    module, _, attr = reference.partition(":")
    if not module or not attr:
        raise ValueError(f"not a module:attr reference: {reference!r}")
    return EntryPoint(name=attr, value=reference, group=GROUP).load()
