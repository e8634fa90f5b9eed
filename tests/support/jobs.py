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
