"""The toy channel: a channel added the way a third-party package adds one (docs/architecture.md,
"Recipe: adding a channel"). It reads lines from a file and appends the replies to another.

Its files are all here: ``channel.py`` (the spec), ``config.py`` (``[toy]``), ``normalize.py``
(a line as a normalized message), ``gateway.py`` (the platform client the shared runner drives)
and ``doctor.py`` (its doctor check). It is registered through the ``relaybot.channels`` entry
point of a ``toy-0.dist-info`` directory that the test writes (tests/support/channels.py).
"""
