"""Names vulture takes for dead code in the library but that are used where it cannot see.

Read by vulture as one more source file (``[tool.vulture]`` in pyproject.toml; the gate is
tests/unit/test_dead_code.py): a name used here counts as used everywhere (vulture matches names,
not owners). Only false positives belong here, each with the reason it is not dead. Code that
nothing but tests uses is dead: it goes, it is not listed here. Validators that pydantic calls
are left out by ``ignore_decorators`` in the same section, not named one by one.
"""

# ruff: noqa: B018, F821

# pydantic reads a model's settings from its class attribute ``model_config``
_.model_config

# HTMLParser calls its subclass's handlers (gateways/email_parse.py, the HTML part as text)
_.handle_starttag
_.handle_endtag
_.handle_data

# argparse.ArgumentParser calls it for --help and --version (relaybot/cli.py _Parser)
_._print_message

# GroupPolicy("open") from config.toml's [matrix] group_policy (gateways/matrix_events.py)
_.OPEN

# rq runs it by its dotted name, "worker.summarize_job.summarize" (worker/derive.py)
_.summarize

# the export header's field, written as a dict (memory/export.py), validated on import
_.exported_at

# Scrubbed's counts, read through dataclasses.asdict into the erasure's log line and answer
_.stream_entries
_.queued_replies
_.inflight_replies
_.dead_letters
_.email_headers
_.email_subjects
