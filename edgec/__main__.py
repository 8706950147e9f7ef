"""``python -m edgec``: the CLI."""

from .cli import entry_point

entry_point()
