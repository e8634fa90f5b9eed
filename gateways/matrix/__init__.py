"""The Matrix channel: its spec (channel.py), gateway, sync loop, events and login."""
