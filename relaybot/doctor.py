"""``relaybot doctor``: every check at once, each with a verdict and a fix hint.

The groups (config, disk, redis, processes, model, scheduler, mcp, each channel's) run side by
side, each on a daemon thread of its own with a time budget (a multiple of ``--timeout``): a dead
host costs its group a few seconds and never holds up the others, and a group that is still stuck
when its budget runs out is reported as failed where it stood. A group that crashes is one failed
check, never the end of doctor. Exit code 1 when any check failed (warnings alone: 0); ``--json``
prints the checks as JSON.

The local checks (config, disk) come first and need no network; the configuration is loaded
even when it does not load for the processes (unknown keys are reported, then left out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contract import channels as registry
from contract.config import (
    Config,
    ConfigError,
    ConfigUnreadable,
    apply_env,
    config_digest,
    default_home,
    load_config,
    parse_config,
    read_config_bytes,
)
from contract.messages import describe_validation_error
from contract.terminal import json_safe, safe
from relaybot.doctor_verdict import (
    Check,
    Verdict,
    config_keys,
    disk_space,
    exit_code,
    fail,
    ok,
    permissions,
    skipped,
    unknown_keys,
    without,
)

Add = Callable[[Check], None]
DEFAULT_TIMEOUT = 5.0
# each group's budget, in --timeout units (a group makes several requests in turn)
# seconds, in timeouts, each group may take; a channel's group: its spec's doctor_budget
BUDGET = {
    "disk": 4,
    "redis": 6,
    "processes": 2,
    "model": 16,
    "scheduler": 2,
    "mcp": 2,
    **{ch.name: ch.doctor_budget for ch in registry.channels() if ch.doctor},
}
MAX_WALK = 20_000  # paths looked at under RELAYBOT_HOME for the permission check


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``relaybot doctor``'s arguments (its parser is relaybot/cli.py's)."""
    p.add_argument("--json", action="store_true", help="the checks as JSON")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per network step (default {DEFAULT_TIMEOUT:.0f}; the model's answer "
        "may take 6 times that)",
    )
    p.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace, cfg: Config) -> int:
    """The configuration main() loaded is not used: doctor loads its own, and reports why it
    does not load instead of refusing to run."""
    report = diagnose(cfg.home, timeout=args.timeout)
    # what servers answered is in the checks: made inert for the terminal (contract.terminal)
    sys.stdout.write(
        (json_safe(json.dumps(as_json(report), indent=2)) if args.json else safe(render(report)))
        + "\n"
    )
    return exit_code(report.checks)


class Report:
    def __init__(self, home: Path, digest: str | None) -> None:
        self.home, self.digest = home, digest
        self.checks: list[Check] = []


# -- the configuration -------------------------------------------------------------------------


def load(home: Path, env: Mapping[str, str]) -> tuple[list[Check], Config | None, str | None]:
    """The config checks, the configuration to check the rest with (None: it cannot be made),
    and the config file's digest (None: no file)."""
    path = home / "config.toml"
    checks: list[Check] = []
    digest: str | None = None
    data: dict[str, Any] = {}
    try:
        raw = read_config_bytes(home)
    except ConfigUnreadable as exc:  # a directory, root's after a sudo edit, a link to nothing
        fix = f"{exc.fix}; the processes that run keep their last good configuration, new ones "
        checks.append(fail("config.file", exc.problem, fix + "refuse to start until then"))
        return checks, None, None
    if raw is not None:
        digest = config_digest(raw)
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            checks.append(
                fail(
                    "config.file",
                    f"{path} is not valid TOML: {exc}",
                    "fix that line (relaybot onboard rewrites the file)",
                )
            )
            return checks, None, digest
        checks.append(ok("config.file", f"{path} read (digest {digest})", digest=digest))
    else:
        checks.append(ok("config.file", f"no {path}: defaults and the environment"))
    if registry.refused():  # said only when a package's channel was left out
        checks.append(channel_packages())
    unknown = unknown_keys(data, Config)
    checks.append(config_keys(path, unknown))
    try:
        cfg = load_config(home, env)
        checks.append(zone_check(cfg, env))
        return checks, cfg, digest
    except ConfigError as exc:
        if not unknown:
            checks.append(
                fail(
                    "config.values",
                    str(exc),
                    "fix that value in config.toml (or the environment variable named)",
                )
            )
            return checks, None, digest
    # only unknown keys (as far as we know): check the rest with them left out
    data = without(data, [p for p, _ in unknown])
    try:
        apply_env(data, env)
        return checks, Config.model_validate({**data, "home": home}), digest
    except ConfigError as exc:  # a RELAYBOT_<SECTION>__<KEY> that names no key
        checks.append(fail("config.values", str(exc), "fix that environment variable"))
        return checks, None, digest
    except ValidationError as exc:
        checks.append(fail("config.values", describe_validation_error(exc), "fix that value"))
        return checks, None, digest


def zone_check(cfg: Config, env: Mapping[str, str]) -> Check:
    """Which time zone the model's context and the clock use, and where it came from."""
    from contract.timezone import resolve

    zone = resolve(cfg.owner.timezone, env)
    return ok("config.timezone", f"times are shown in {zone.describe()}", zone=zone.name)


def channel_packages() -> Check:
    """The channels' packages: each loads, names its channel rightly, replaces none of ours."""
    left_out = registry.refused()
    if not left_out:
        return ok("channels.packages", f"channels: {', '.join(registry.names())}")
    return fail(
        "channels.packages",
        "; ".join(left_out),
        "fix or uninstall that package (pip uninstall ...): relaybot's own channels cannot be "
        "replaced, and a channel two packages declare is left out",
    )


# -- disk --------------------------------------------------------------------------------------


def disk_group(cfg: Config, timeout: float, add: Add) -> None:
    places = {cfg.home, cfg.memory_path.parent}
    seen: set[int] = set()
    for wanted in sorted(places):
        place = wanted
        while not place.exists() and place != place.parent:  # not made yet: where it will be
            place = place.parent
        dev = place.stat().st_dev
        if dev in seen:
            continue
        seen.add(dev)
        usage = shutil.disk_usage(place)
        add(disk_space(place, usage.free, usage.total))
    add(permissions(cfg.home, modes(cfg)))


def modes(cfg: Config) -> dict[Path, int]:
    """st_mode of RELAYBOT_HOME, everything under it (symlinks not followed), and the memory
    database, its WAL, the workspace and config.toml wherever they are (through a link too)."""
    out: dict[Path, int] = {}

    def note(path: Path, *, follow: bool = False) -> None:
        try:
            mode = path.lstat().st_mode
            if follow and stat.S_ISLNK(mode):  # the data is where the link leads
                mode = path.stat().st_mode
        except OSError:
            return
        if not stat.S_ISLNK(mode):
            out[path] = mode

    note(cfg.home)
    for top, dirs, files in os.walk(cfg.home):
        for name in (*dirs, *files):
            note(Path(top) / name)
        if len(out) > MAX_WALK:
            break
    memory = cfg.memory_path
    for path in (memory, Path(f"{memory}-wal"), Path(f"{memory}-shm"), cfg.workspace_dir):
        note(path, follow=True)  # every message: a link to a readable file is as bad
    note(cfg.home / "config.toml", follow=True)
    return out


# -- running the groups ------------------------------------------------------------------------


def diagnose(
    home: Path | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> Report:
    env = os.environ if env is None else env
    home = home or default_home(env)
    checks, cfg, digest = load(home, env)
    report = Report(home, digest)
    report.checks += checks
    if cfg is None:  # the disk checks still run (on RELAYBOT_HOME); the others need the config
        disk_group(Config(home=home), timeout, report.checks.append)
        because = "the configuration does not load (config.*)"
        report.checks += [skipped(g, because) for g in BUDGET if g not in ("disk", "processes")]
        report.checks += _processes_without_config(home, env, timeout, digest)
        return report
    from relaybot import doctor_mcp, doctor_model, doctor_redis, doctor_schedule

    def processes(c: Config, t: float, add: Add) -> None:
        doctor_redis.processes_group(c, t, add, runs_digest(digest))

    groups: dict[str, Callable[[Config, float, Add], None]] = {
        "disk": disk_group,
        "redis": doctor_redis.redis_group,
        "processes": processes,
        "model": doctor_model.model_group,
        "scheduler": doctor_schedule.scheduler_group,
        "mcp": doctor_mcp.mcp_group,
        **{ch.name: _channel_group(ch.doctor) for ch in registry.channels() if ch.doctor},
    }
    found: dict[str, list[Check]] = {name: [] for name in groups}
    threads = {
        name: threading.Thread(
            target=_guarded,
            args=(name, fn, cfg, timeout, found[name]),
            daemon=True,
            name=f"doctor-{name}",
        )
        for name, fn in groups.items()
    }
    started = time.monotonic()
    for thread in threads.values():
        thread.start()
    for name, thread in threads.items():
        budget = BUDGET[name] * timeout
        thread.join(max(0.0, started + budget - time.monotonic()))
        if thread.is_alive():
            found[name].append(
                fail(
                    f"{name}.timeout",
                    f"the {name} checks did not finish within {budget:.0f} s",
                    "a host that does not answer: check that it runs and that the network "
                    "or a firewall lets the connection through",
                )
            )
        report.checks += list(found[name])
    order = ["config", *groups]  # config.unused comes from the processes group
    report.checks.sort(key=lambda c: order.index(c.group) if c.group in order else len(order))
    return report


def _channel_group(reference: str) -> Callable[[Config, float, Add], None]:
    """A channel's checks (its spec's ``doctor``), imported when the group runs."""

    def group(cfg: Config, timeout: float, add: Add) -> None:
        registry.load(reference)(cfg, timeout, add)

    return group


def runs_digest(digest: str | None) -> str:
    """What a process of this config.toml reports as its ``config``: ``none`` without a file
    (contract.config.config_digest), so no file on both sides is the same config."""
    return digest if digest is not None else config_digest(None)


def _processes_without_config(
    home: Path, env: Mapping[str, str], timeout: float, digest: str | None
) -> list[Check]:
    """config.toml does not load, but the processes still run (with the last config they
    loaded): their heartbeats are read from the Redis the environment names (``REDIS_URL``, else
    the embedded one of RELAYBOT_HOME)."""
    from relaybot import doctor_redis

    try:
        fallback = parse_config(None, home, env)
    except ConfigError as exc:
        return [skipped("processes", f"the configuration does not load (config.*): {exc}")]
    out: list[Check] = []

    def beats(c: Config, t: float, add: Add) -> None:
        doctor_redis.processes_group(c, t, add, runs_digest(digest), judge_unused=False)

    _guarded("processes", beats, fallback, timeout, out)
    return out


def _guarded(
    name: str,
    fn: Callable[[Config, float, Add], None],
    cfg: Config,
    timeout: float,
    out: list[Check],
) -> None:
    try:
        fn(cfg, timeout, out.append)
    except Exception as exc:  # one broken probe is one failed check, never the end of doctor
        out.append(
            fail(
                f"{name}.error",
                f"the {name} check stopped: {type(exc).__name__}: {exc}",
                "this is a bug in relaybot doctor: report it with this output",
            )
        )


# -- output ------------------------------------------------------------------------------------

_LABEL = {Verdict.OK: "ok", Verdict.WARN: "WARN", Verdict.FAIL: "FAIL", Verdict.SKIPPED: "skip"}


def counts(checks: list[Check]) -> dict[str, int]:
    return {str(v): sum(1 for c in checks if c.verdict is v) for v in Verdict}


def as_json(report: Report) -> dict[str, Any]:
    return {
        "home": str(report.home),
        "config_digest": report.digest,
        "checks": [c.as_json() for c in report.checks],
        "counts": counts(report.checks),
        "exit_code": exit_code(report.checks),
    }


def render(report: Report) -> str:
    lines = [f"relaybot doctor: RELAYBOT_HOME {report.home}"]
    width = max((len(c.id) for c in report.checks), default=10)
    group = None
    for c in report.checks:
        if c.group != group:
            group = c.group
            lines += ["", group]
        lines.append(f"  {_LABEL[c.verdict]:<4}  {c.id:<{width}}  {c.summary}")
        if c.hint and c.verdict is not Verdict.OK:
            lines.append(f"        {'':<{width}}  -> {c.hint}")
    n = counts(report.checks)
    code = exit_code(report.checks)
    lines += [
        "",
        f"{n['ok']} ok, {n['warn']} warning(s), {n['fail']} failure(s), {n['skipped']} skipped"
        f" (exit {code})",
    ]
    return "\n".join(lines)
