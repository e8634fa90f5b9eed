"""The e-mail channel: its spec (channel.py), gateway, IMAP loop, parsing and SMTP."""
