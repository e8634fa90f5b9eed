"""The terminal channel: its spec (channel.py) and the terminal gateway."""
