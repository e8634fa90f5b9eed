"""Names vulture takes for dead code in the library but that are used where it cannot see.

Read by vulture as one more source file (``[tool.vulture]`` in pyproject.toml; the gate is
tests/unit/test_dead_code.py): a name used here counts as used everywhere (vulture matches names,
not owners). Only false positives belong here, each with the reason it is not dead. Code that
nothing but tests uses is dead: it goes, it is not listed here. Validators that pydantic calls
are left out by ``ignore_decorators`` in the same section, not named one by one.
The one exception, in its own section at the end: a counter or flag a test reads to observe
an effect it cannot see from outside (a checkpoint that ran, a script in flight).
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

# rq runs it by its dotted name, "worker.profile_job.profile" (worker/profile_derive.py)
_.profile

# rq runs it by its dotted name, "worker.schedule_job.fire" (worker/scheduling.py)
_.fire

# rq's worker installs it as its SIGTERM/SIGINT handler (worker/jobs.py Worker overrides it)
_.request_stop

# the export header's field, written as a dict (memory/export.py), validated on import
_.exported_at

# Scrubbed's counts, read through dataclasses.asdict into the erasure's log line and answer
_.stream_entries
_.queued_replies
_.inflight_replies
_.dead_letters

# the benchmarks' loader (memory/bulk.py): bench/ is not scanned, it holds no library code
_.insert_log
_.optimize_index
_.insert_summaries
_.rows_in
_.first_sender_entity
_.event_span
_.row_keys

# counters and flags a test reads to observe what it cannot see from outside: checkpoints run
# (tests/unit/test_checkpoint.py), the commit script in flight (test_commit_line.py), entries
# the read script dead-lettered (test_streams.py), memory failures a turn rode out
# (test_admin_degraded.py, test_context_budget.py)
_.checkpoints
_.in_flight
_.dead_lettered
_.memory_failures

# a module's __getattr__ (PEP 562): Python calls it for the names the module computes lazily
# from the channel registry (contract/config.py, config_watch.py, messages.py)
_.__getattr__

# loaded by their "module:attr" names from a channel's spec (contract/channels.py: gateway,
# doctor, onboard, erase), as the entry points name the specs themselves
_.run_email
_.email_group
_.matrix_group
_.ONBOARDING
_.ERASURE

# a room's guest access as its state says (gateways/matrix/events.py Openness, compared whole in
# tests/unit/test_room_audience.py); Openness.open says why it does not open a room by itself
_.guest_access

# a backup's tar members (relaybot/backup_archive.py): tarfile writes these TarInfo fields
_.mtime
_.gid
_.gname
_.uname
