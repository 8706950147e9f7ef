"""``python -m edgec``: the CLI."""

from edgec.cli import entry_point

entry_point()
