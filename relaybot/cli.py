"""The ``relaybot`` command and its subcommands.

Start-up is kept short: ``--version`` and ``--help`` read no configuration and import only
argparse (the arguments of a command are added only when that command is the one asked for, and
its module is imported then), and what a command needs (structlog, redis, pydantic's
configuration, the channel registry, the worker) is imported once its arguments are read.
``tests/unit/test_cli_imports.py`` keeps it so.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json
from relaybot import envfile, private

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from contract.config import Config


def _log() -> Any:
    import structlog

    return structlog.get_logger(__name__)


EXIT_TIMEOUT = 3
EXIT_NO_WORKER = 4
EXIT_CONFIG = 2
EXIT_BROKEN_PIPE = 128 + 13  # as a command killed by SIGPIPE


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a closed pipe under ``--help`` or ``--version`` is not swallowed
    (argparse ignores the OSError and exits 0, or Python fails flushing at exit with status
    120): it reaches :func:`main`, which ends quietly with 141 as for every other command."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(message)


class _Version(argparse._VersionAction):
    """``--version``: the installed version is looked up only when it is asked for."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        self.version = f"relaybot {version()}"
        super().__call__(parser, namespace, values, option_string)


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """relaybot's parser. Every command is listed (``--help``), but the arguments of the memory,
    reminders, entities, onboard, doctor and gateway commands, whose modules take time to import,
    are added only to ``command``'s parser (the one the command line names)."""
    p = _Parser(
        prog="relaybot",
        description="A self-hosted personal assistant: every channel, one memory.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    p.add_argument("-V", "--version", action=_Version, version="relaybot")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    chat = sub.add_parser("chat", help="chat in this terminal (starts what is missing)")
    chat.add_argument("-m", "--message", help="send one message, print the reply and exit")
    chat.add_argument("--session", help="resume (or name) a session; default: a new one")
    chat.add_argument(
        "--timeout",
        type=float,
        help="seconds to wait for a reply once the worker takes the message (default: the "
        "model's retries' worst case + 30, at least 120)",
    )
    chat.add_argument(
        "--queue-timeout",
        type=float,
        help="with -m: seconds to wait for the worker to take the message, behind other turns "
        "(default: as --timeout's default)",
    )

    worker = sub.add_parser("worker", help="run the one ordered worker")
    worker.add_argument(
        "--no-wait",
        action="store_true",
        help="exit (code 3) instead of waiting when another worker holds the lease",
    )
    sub.add_parser("jobs", help="run an rq worker for background jobs")
    gateway = sub.add_parser("gateway", help="run a channel's gateway (`gateway -h` lists them)")
    if command == "gateway":
        _gateway_parsers(gateway)
    sub.add_parser("redis", help="run the embedded Redis in the foreground (for the Procfile)")

    status = sub.add_parser("status", help="stream, pending, dead letters, queues, heartbeats")
    status.add_argument("--json", action="store_true", help="machine-readable output")

    cli = sub.add_parser("redis-cli", help="redis-cli connected to relaybot's Redis")
    cli.add_argument("args", nargs=argparse.REMAINDER)

    # memory and identity commands: each module adds its parsers with set_defaults(func=...)
    memory = sub.add_parser("memory", help="search, inspect, export, import and erase memory")
    if command == "memory":
        from relaybot import cli_curated, cli_memory, cli_notes, cli_search, cli_summaries

        msub = memory.add_subparsers(dest="memory_command", required=True, metavar="MEMORY_COMMAND")
        cli_memory.add_parsers(msub)
        cli_search.add_parsers(msub)
        cli_notes.add_parsers(msub)
        cli_summaries.add_parsers(msub)
        cli_curated.add_parsers(msub)
    _reminders_parser(sub, command)
    _tools_parser(sub, command)
    entities = sub.add_parser("entities", help="people and their handles, links between them")
    if command == "entities":
        from relaybot import cli_entities

        esub = entities.add_subparsers(dest="entities_command", required=True, metavar="COMMAND")
        cli_entities.add_parsers(esub)
    onboard = sub.add_parser(
        "onboard",
        help="first-run setup: who you are, your addresses, the model, the channels (tested)",
    )
    if command == "onboard":
        from relaybot import cli_entities

        cli_entities.add_onboard_arguments(onboard)
    doctor = sub.add_parser(
        "doctor", help="check Redis, the model, the channels, disk, config and processes"
    )
    if command == "doctor":
        from relaybot import doctor as doctor_command

        doctor_command.add_arguments(doctor)
    backup = sub.add_parser("backup", help="a consistent copy of memory, MEMORY.md and the config")
    restore = sub.add_parser("restore", help="put a backup back (no worker may run meanwhile)")
    if command in ("backup", "restore"):
        from relaybot import cli_backup

        cli_backup.add_arguments(backup, restore)
    return p


def _reminders_parser(sub: Any, command: str | None) -> None:
    """``relaybot reminders``: its arguments only when it is the command named."""
    reminders = sub.add_parser("reminders", help="reminders and recurring tasks: list, add, cancel")
    if command == "reminders":
        from relaybot import cli_reminders

        cli_reminders.add_arguments(reminders)


def _tools_parser(sub: Any, command: str | None) -> None:
    """``relaybot tools``: its arguments only when it is the command named."""
    tools = sub.add_parser(
        "tools", help="tools from MCP servers: each server's state and tools; approve a listing"
    )
    if command == "tools":
        from relaybot import cli_tools

        cli_tools.add_arguments(tools)


def _gateway_parsers(gateway: argparse.ArgumentParser) -> None:
    """``relaybot gateway <channel>``: one per channel of the registry that has a gateway (the
    terminal's is ``chat``)."""
    from contract import channels as registry

    gateway_sub = gateway.add_subparsers(dest="gateway", required=True, metavar="CHANNEL")
    for ch in registry.channels():
        if ch.gateway:
            one = gateway_sub.add_parser(ch.name, help=f"{ch.title} ([{ch.name}] in the config)")
            one.set_defaults(func=functools.partial(_run_gateway, ch.gateway))


def version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("relaybot")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
        return "unknown"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """relaybot's options, its command and the command's arguments. Everything after
    ``redis-cli`` is redis-cli's, options too (``--scan --pattern ...``): the command is the
    first word that is not one of relaybot's own options (which take no value)."""
    argv = list(argv)
    at = next((i for i, word in enumerate(argv) if not word.startswith("-")), None)
    command = None if at is None else argv[at]
    if at is not None and command == "redis-cli":
        args = _parser(command).parse_args(argv[: at + 1])
        args.args = argv[at + 1 :]
        return args
    return _parser(command).parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The entry point. A closed pipe (``relaybot memory export | head``) ends the command
    quietly, as it ends ``cat``: no traceback, exit status 141 (128 + SIGPIPE); so does
    ``relaybot --help | (exec 0<&-; true)`` (argparse's exit, flushed here, not at exit)."""
    try:
        try:
            code = _main(sys.argv[1:] if argv is None else argv)
        except SystemExit:  # argparse: --help, --version, a usage error
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # a pipe closed after the last write shows here
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that says nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    if argv is None:  # the process's own command (not a test calling main): it exits now
        _skip_the_last_collection()
    return code


def _skip_the_last_collection() -> None:
    """At exit, Python's last garbage collection walks every object the imports made (some
    30 ms for a chat, more for the worker, on every exit) only to free memory the kernel takes
    back anyway: the objects are moved out of its reach (``gc.freeze``). Nothing of relaybot's
    waits on that collection: stores, Redis connections, subprocesses and files are closed by
    the commands themselves, stdout is flushed above and logging's handlers at exit (atexit
    runs before that collection); what is not in a reference cycle is still freed as before."""
    gc.freeze()


def _main(argv: Sequence[str]) -> int:
    private.restrict_new_files()  # before anything is created: files 0600, directories 0700
    try:
        envfile.load_dotenv_here()  # the .env honcho reads, for the commands of a second terminal
        damaged = None
    except envfile.EnvFileError as exc:
        damaged = exc
    args = parse_args(argv)  # --help and --version work whatever .env holds
    if damaged is not None:
        echo(
            f"relaybot: cannot read .env: {damaged} (honcho start cannot either: fix the line, "
            f"or set {envfile.CHOICE}= to read none)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args.command == "chat":  # its zero-config worker starts beside it (relaybot/prestart.py)
        from relaybot import prestart

        prestart.start()
    # what every command needs, imported once its arguments are read (not for --help)
    from contract import imports

    imports.lean_structlog()  # without rich and Twisted (contract/imports.py)
    from contract import logs
    from contract.config import Config, ConfigError, ConfigUnreadable, default_home, load_config

    interactive = args.command not in ("worker", "jobs", "redis", "gateway")
    level = "DEBUG" if args.verbose else ("WARNING" if interactive else "INFO")
    logs.configure(args.command, level=level)
    try:
        cfg = load_config()
    except ConfigError as exc:
        # onboarding is how a broken config gets rewritten (not a file it cannot read: it could
        # not write it either) and says what is wrong with it; so does doctor, as a check
        unreadable = isinstance(exc, ConfigUnreadable)
        said_by_onboard = args.command == "onboard" and "not valid TOML" in str(exc)
        if args.command != "doctor" and not said_by_onboard:
            print(f"relaybot: configuration error: {exc}", file=sys.stderr)
        if args.command != "doctor" and (args.command != "onboard" or unreadable):
            return EXIT_CONFIG
        cfg = Config(home=default_home())
    if args.command != "doctor":  # doctor reports loose permissions (and how to fix them)
        _tighten_home(cfg)
    if cfg.logs.format != "auto":  # [logs] format (RELAYBOT_LOG_FORMAT still wins)
        logs.configure(args.command, level=level, fmt=cfg.logs.format)
    return _run(args, cfg)


def _run(args: argparse.Namespace, cfg: Config) -> int:
    """The command, with what it may fail on said in one line: a configuration found wrong once
    running (TLS), Redis refusing the account (exit 2) or not answering (exit 1), no embedded
    Redis binary (exit 2)."""
    import redis

    from contract import access, logs
    from contract.bus import redis_url
    from contract.config import ConfigError

    try:
        return _dispatch(args, cfg)
    except ConfigError as exc:  # found once running: a TLS misconfiguration (contract/redis_tls)
        print(f"relaybot: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except redis.RedisError as exc:
        return _redis_failed(cfg, exc, _role(args), access, logs.redact(redis_url(cfg)))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from deploy.embedded import EmbeddedRedisError

        if not isinstance(exc, EmbeddedRedisError):
            raise
        print(f"relaybot: {exc}", file=sys.stderr)  # no binary: installing one is the fix
        return EXIT_CONFIG


def _redis_failed(cfg: Config, exc: Exception, role: str, access: Any, where: str) -> int:
    """Redis refused this account (its password, or a command its ACL does not allow, at start
    or later: an ACL changed): a configuration error, never waited out, exit 2. Else Redis did
    not answer: exit 1."""
    if access.refusal(exc):
        print(f"relaybot: {access.line(cfg, exc, role)}", file=sys.stderr)
        return EXIT_CONFIG
    import redis

    if isinstance(exc, redis.exceptions.OutOfMemoryError):  # reached, but full: operations
        print(
            f"relaybot: Redis at {where} is full and refuses writes (maxmemory reached: {exc}) "
            "-- give it more memory (maxmemory in its redis.conf, or CONFIG SET maxmemory) or "
            "free some, then try again",
            file=sys.stderr,
        )
        return 1
    if isinstance(exc, redis.exceptions.ReadOnlyError):  # a replica: the URL is wrong
        print(
            f"relaybot: Redis at {where} is a read-only replica ({exc}) -- set REDIS_URL (or "
            "[redis] url) to its primary: relaybot writes",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    from contract import redis_tls  # only on this path

    if (tls := redis_tls.problem(exc, cfg, where)) is not None:
        print(f"relaybot: configuration error: {tls}", file=sys.stderr)
        return EXIT_CONFIG
    said = f"cannot reach Redis at {where}: {exc}"
    if cfg.embedded_redis and not (cfg.redis_dir / "redis.sock").exists():
        said += (
            " -- the embedded Redis is not running: it runs while `honcho start` (its redis "
            "line) or a zero-config `relaybot chat` runs; start one of them (or set REDIS_URL)"
        )
    print(f"relaybot: {said}", file=sys.stderr)
    return 1


def _role(args: argparse.Namespace) -> str:
    """Which process's Redis account a command runs as (deploy/redis/users.acl)."""
    if args.command in ("worker", "jobs"):
        return str(args.command)
    return str(args.gateway) if args.command == "gateway" else "cli"


def _tighten_home(cfg: Config) -> None:
    """Files from before (an older relaybot, a copy) others could read: made private, and said."""
    log = _log()
    try:
        done, failed = private.tighten(cfg)
    except OSError as exc:
        log.warning("home.permissions_unchecked", home=str(cfg.home), error=str(exc))
        return
    if done:
        log.warning(
            "home.permissions_tightened",
            detail="others could read these; they are now the owner's alone (0600/0700)",
            count=len(done),
            paths=[f"{x.path} {x.mode:04o}->{x.tightened:04o}" for x in done[:20]],
        )
    for loose, error in failed:
        log.warning(
            "home.permissions_loose",
            path=str(loose.path),
            mode=f"{loose.mode:04o}",
            error=str(error),
            fix=f"chmod go= {loose.path}",
        )


def _dispatch(args: argparse.Namespace, cfg: Config) -> int:
    if cfg.embedded_redis and args.command in ("worker", "jobs", "gateway"):
        from deploy import embedded

        embedded.redis_binary()  # none: EmbeddedRedisError, said now rather than waited for
    func = getattr(args, "func", None)
    if func is not None:  # the memory / reminders / entities / onboard subcommands
        return int(func(args, cfg))
    if args.command == "chat":
        from relaybot.chat import run_chat

        return run_chat(
            cfg,
            message=args.message,
            session=args.session,
            timeout=args.timeout,
            queue_timeout=args.queue_timeout,
            verbose=args.verbose,
        )
    if args.command == "worker":
        from contract.bus import wait_for_redis
        from relaybot import zeroconf

        if zeroconf.started_by_chat():  # the zero-config worker: it lives while a chat uses it
            # its Redis is started first, the worker's modules imported meanwhile (_run_worker)
            return zeroconf.run(cfg, functools.partial(_run_worker, cfg, args))
        return _run_worker(cfg, args, wait_for_redis(cfg, role="worker"))
    if args.command == "jobs":
        from contract import imports
        from contract.bus import wait_for_redis

        imports.lean_httpx()  # the model client's (contract/imports.py)
        imports.lean_httpcore()
        from worker.jobs import run_jobs

        return run_jobs(cfg, wait_for_redis(cfg, role="jobs"))
    if args.command == "redis":
        return _run_redis(cfg)
    if args.command == "status":
        from contract import access
        from contract.bus import connect
        from contract.timezone import owner_zone
        from relaybot.status import collect, render

        status = collect(
            connect(cfg), cfg.keys, account=access.account(cfg), memory_path=cfg.memory_path,
            grace=cfg.schedule.grace, zone=owner_zone(cfg.owner.timezone),
            has_model=cfg.model.configured, profiles_on=cfg.profiles.enabled,
        )  # fmt: skip
        if args.json:
            echo_json(status, indent=2)
        else:
            echo(render(status))
        return 0
    if args.command == "redis-cli":
        return _exec_redis_cli(cfg, args.args)
    raise AssertionError(args.command)  # argparse rejects unknown commands


def _run_worker(cfg: Config, args: argparse.Namespace, r: Any) -> int:
    from contract import imports

    imports.lean_httpx()  # the model client's (contract/imports.py)
    imports.lean_httpcore()
    from worker.main import run_worker

    return run_worker(cfg, r, wait_for_lease=not args.no_wait)


def _run_gateway(run: str, args: argparse.Namespace, cfg: Config) -> int:
    """``relaybot gateway <channel>``: the runner its spec names (imported only now)."""
    from contract import channels as registry
    from contract import imports
    from contract.bus import wait_for_redis

    imports.lean_httpx()  # what a gateway's platform client or its checks may use
    main: Callable[[Config, Any], int] = registry.load(run)
    return main(cfg, wait_for_redis(cfg, role=args.gateway))


def _run_redis(cfg: Config) -> int:
    from deploy import embedded

    log = _log()
    if not cfg.embedded_redis:
        # honcho stops every process when one exits, so stay up but do nothing
        log.info("redis.external", detail="REDIS_URL is set; the embedded Redis is not started")
        while True:
            time.sleep(3600)
    if embedded.ping(cfg):
        # a zero-config `relaybot chat` started it: exiting would make honcho stop everything
        log.warning(
            "redis.embedded_in_use",
            detail="an embedded Redis already runs for this RELAYBOT_HOME (a zero-config "
            "relaybot chat started it); the other processes use it, and this line starts its "
            "own when it stops",
        )
        while embedded.ping(cfg):
            time.sleep(1.0)
    return embedded.exec_foreground(cfg)


def _exec_redis_cli(cfg: Config, extra: list[str]) -> int:
    """redis-cli against relaybot's Redis. The embedded one, when nothing runs it (no chat, no
    ``honcho start``), is started for this command and stopped after it: the stream, the
    queues and the dead letters are on disk, and the README's recipes work at any time."""
    from contract import redis_tls
    from contract.config import ConfigError
    from deploy import embedded

    if (problem := redis_tls.file_problem(cfg)) is not None:  # as every command (bus.connect)
        raise ConfigError(problem)
    binary = embedded.redis_binary("redis-cli")
    env = dict(os.environ)
    if cfg.embedded_redis:
        target = ["-s", str(cfg.redis_dir / "redis.sock")]
    else:
        target = _redis_cli_target(cfg, env)
    argv = [binary, *target, *extra]
    if cfg.embedded_redis and not embedded.ping(cfg) and not embedded.supervised(cfg):
        from relaybot.runtime import Runtime

        with Runtime(cfg, start_worker=False):
            return subprocess.run(argv, check=False, env=env).returncode
    os.execve(binary, argv, env)
    return 0  # not reached


def _redis_cli_target(cfg: Config, env: dict[str, str]) -> list[str]:
    """redis-cli's options for ``[redis] url``. The password goes in ``REDISCLI_AUTH`` (not on
    the command line, where ``ps`` shows it), and a URL without a user (``redis://:pw@…``,
    Redis's ``requirepass``) authenticates as redis-py does, not as the user "" (redis-cli's
    ``-u`` answered WRONGPASS)."""
    from urllib.parse import parse_qs, unquote, urlsplit

    from contract.bus import redis_url

    parts = urlsplit(redis_url(cfg))
    query = parse_qs(parts.query)
    if parts.password:
        env["REDISCLI_AUTH"] = unquote(parts.password)
    out = ["--user", unquote(parts.username)] if parts.username and parts.password else []
    if parts.scheme == "unix":
        return [*out, "-s", unquote(parts.path), "-n", query.get("db", ["0"])[0]]
    out += ["-h", parts.hostname or "localhost", "-p", str(parts.port or 6379)]
    out += ["-n", parts.path.strip("/") or "0"]
    if parts.scheme == "rediss":
        out.append("--tls")
        r = cfg.redis
        for flag, path in (("--cacert", r.ca_file), ("--cert", r.cert_file), ("--key", r.key_file)):
            if path is not None:
                out += [flag, str(path)]
    return out


if __name__ == "__main__":
    sys.exit(main())
