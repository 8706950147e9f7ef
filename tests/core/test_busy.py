"""The background load: the processes run while the block runs and are gone after it, also when
the block fails."""

from pathlib import Path

import pytest

from edgec.core.busy import busy_processes
from edgec.errors import EdgecError


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_processes_live_exactly_as_long_as_the_block():
    with busy_processes(2) as pids:
        assert len(set(pids)) == 2 and all(map(_alive, pids))
    assert not any(map(_alive, pids))
    with pytest.raises(RuntimeError, match="inside"):
        with busy_processes(1) as pids:
            raise RuntimeError("inside")
    assert not any(map(_alive, pids))


def test_none_or_a_negative_count():
    with busy_processes(0) as pids:
        assert pids == []
    with pytest.raises(EdgecError, match="--busy"):
        with busy_processes(-1):
            pass


def test_a_process_that_dies_at_start_fails_in_one_line(monkeypatch):
    """A child that exits before its loop (as one re-running an unguarded main script does)."""
    import edgec.core.busy as busy

    monkeypatch.setattr(busy, "_spin", _exit_at_once)
    with pytest.raises(EdgecError, match="did not start \\(exit code 3\\).*__main__"):
        with busy.busy_processes(1):
            pass


def _exit_at_once(ready, parent, max_seconds):
    raise SystemExit(3)
