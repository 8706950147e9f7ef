"""CPU-bound background load, so that a measurement can show how a runtime behaves on a machine it
shares (as an application on an edge device always does).

``busy_processes(n)`` starts ``n`` processes that each keep one core busy with a pure-Python loop
for as long as the ``with`` block runs. They are daemons started with ``spawn`` (no copy of the
parent's threads or TVM state), terminated and joined when the block ends, and each one also stops
by itself after ``max_seconds`` or when its parent is gone, so none outlives a crashed parent.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import time
from typing import Iterator

from edgec.errors import EdgecError

# A bound on each process's life, far past any measurement, in case the parent dies unannounced.
MAX_SECONDS = 4 * 3600.0


def _spin(ready, parent: int, max_seconds: float) -> None:
    """Keep one core busy until the parent is gone or ``max_seconds`` have passed."""
    ready.put(os.getpid())
    deadline = time.monotonic() + max_seconds
    value = 0
    while time.monotonic() < deadline and os.getppid() == parent:
        for step in range(200_000):  # about 10 ms of work between the checks above
            value ^= step


def _wait_started(processes: list, ready, timeout: float = 60.0) -> None:
    """Wait until every process has entered its loop; fail in one line if one died first."""
    deadline = time.monotonic() + timeout
    started = 0
    while started < len(processes):
        try:
            ready.get(timeout=0.2)
            started += 1
        except queue.Empty:
            dead = [p.exitcode for p in processes if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                why = f"exit code {dead[0]}" if dead else f"not running after {timeout:.0f} s"
                # spawn runs the parent's main script again in the child: unguarded, it fails there
                raise EdgecError(
                    f"a --busy background process did not start ({why}); a script that runs "
                    "edgec's bench must keep its top-level code under "
                    "`if __name__ == \"__main__\":`") from None


@contextlib.contextmanager
def busy_processes(count: int, max_seconds: float = MAX_SECONDS) -> Iterator[list[int]]:
    """Run ``count`` CPU-bound processes for the duration of the block; yields their pids.

    The block starts once every process is running its loop. ``count`` 0 starts nothing.
    """
    if count < 0:
        raise EdgecError("--busy must be at least 0 (the number of CPU-bound background processes)")
    if count == 0:
        yield []
        return
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    processes = [context.Process(target=_spin, args=(ready, os.getpid(), max_seconds),
                                 name=f"edgec-busy-{index}", daemon=True)
                 for index in range(count)]
    try:
        for process in processes:
            process.start()
        _wait_started(processes, ready)
        yield [process.pid for process in processes]
    finally:
        for process in processes:
            if process.pid is not None:
                process.terminate()
        for process in processes:
            if process.pid is not None:
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()
                    process.join()
        ready.close()
        ready.join_thread()
