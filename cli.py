"""Run the edgec CLI from a checkout that is not installed: ``python cli.py ...``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from edgec.cli import entry_point  # noqa: E402

if __name__ == "__main__":
    entry_point()
