"""A trivial rq job the tests enqueue to see that the jobs process runs jobs.

The jobs process imports it by its dotted name: every relaybot process the tests start runs as
``python -m relaybot`` from the repository (tests/support/procs.py), so ``tests`` is importable.
"""


def ping_job() -> str:
    return "pong"


def failing_job() -> str:
    """A job that fails as a summary job did on an invalid config.toml (issue 26)."""
    raise ValueError("config.toml: [worker] foo: Extra inputs are not permitted")


def leaking_job(message: str) -> str:
    """A job whose exception carries secrets (a URL's password, an api_key=...)."""
    raise RuntimeError(message)


def slow_job(marker: str) -> str:
    """A job that runs until it is stopped the first time (it leaves ``marker``, then sleeps),
    and ends at once the next time (it leaves ``marker`` + ``.done``): a job interrupted, then
    run again."""
    import os
    import time
    from pathlib import Path

    path = Path(marker)
    if path.exists():
        Path(marker + ".done").write_text(str(os.getpid()), encoding="utf-8")
        return "done"
    path.write_text(str(os.getpid()), encoding="utf-8")
    time.sleep(600)
    return "slept"
