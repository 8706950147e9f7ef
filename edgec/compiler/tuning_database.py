"""A target's MetaSchedule tuning database: ``tuning_records.jsonl`` in its autotune folder.

The database file is JSON lines, each line self-contained: ``{"workload": [key, *workload]}``
(MetaSchedule's JSON of the kernel) or ``{"key": key, "record": record}`` (its JSON of a measured
schedule), where ``key`` is the kernel's structural hash. No line refers
to another by position, so writers never need to agree on numbering:

- appends hold an exclusive ``fcntl.flock`` on the file, so concurrent tuners serialize and lose
  nothing;
- a line torn by a kill is skipped when reading and cut off before the next append, so a killed
  tune keeps every record it finished and the next one resumes from them.

MetaSchedule's look-ups ignore the target (an x86 record would apply to an Arm build), hence one
database per target, named after it. The records shipped with edgec (if a release has any) are read
with the user's; new ones go to the user's file only (which files: ``edgec.core.locations``).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Iterable

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from edgec.core.locations import TUNING_RECORDS_FILE as RECORDS_FILE
from edgec.core.locations import read_files, user_file
from edgec.core.targets import Target
from edgec.errors import StageInputError


def open_database(target: Target, must_exist: bool = True) -> TuningDatabase | None:
    """The target's database (the user's records over the shipped ones); None (or an error, with
    ``must_exist``) when it has no records."""
    path = user_file(target, RECORDS_FILE)
    if not any(p.stat().st_size for p in read_files(target, RECORDS_FILE)):
        if must_exist:
            raise StageInputError(f"target '{target.name}' has no tuning database at '{path}'; "
                                  f"create it with `edgec tune MODEL --target {target.name}`")
        return None
    return database_for(target)


def database_for(target: Target) -> TuningDatabase:
    """The target's database to tune into: it appends to the user's file, and reads the records
    shipped with edgec too."""
    path = user_file(target, RECORDS_FILE)
    return TuningDatabase(path, [p for p in read_files(target, RECORDS_FILE) if p != path])


def _key(mod: tvm.IRModule) -> str:
    return str(tvm_ffi.structural_hash(mod))


@derived_object
class TuningDatabase(ms.database.PyDatabase):
    """MetaSchedule records in memory, each new one also appended to a JSON-lines file under a lock.

    ``read_only``: more files of the same format whose records are read first and never written.
    Look-ups (best record per kernel) are MetaSchedule's own ``MemoryDatabase``.
    """

    def __init__(self, path: str | Path, read_only: Iterable[str | Path] = ()) -> None:
        super().__init__()
        self.path = Path(path)
        self.location = str(self.path.parent)
        self.memory = ms.database.MemoryDatabase(module_equality="structural")
        self.skipped_lines = 0
        self._workloads: dict[str, Any] = {}
        # Workloads with a line in ``path``: a record appended there names its workload by key,
        # so that line must be in the same file, whatever becomes of the read-only ones.
        self._own_workloads: set[str] = set()
        self._load([*map(Path, read_only), self.path])

    def _load(self, paths: list[Path]) -> None:
        pending: list[tuple[str, Any]] = []
        for path in paths:
            if not path.is_file():
                continue
            with open(path, "rb") as handle:
                for raw in handle:
                    try:
                        doc = json.loads(raw)
                        if "workload" in doc:
                            key = doc["workload"][0]
                            if path == self.path:
                                self._own_workloads.add(key)
                            if key not in self._workloads:
                                workload = ms.database.Workload.from_json(doc["workload"][1:])
                                self._workloads[key] = self.memory.commit_workload(workload.mod)
                        else:
                            pending.append((doc["key"], doc["record"]))
                    except Exception:  # noqa: BLE001 - a line torn by a kill, or not ours: skip it
                        self.skipped_lines += 1
        for key, record in pending:
            workload = self._workloads.get(key)
            try:
                self.memory.commit_tuning_record(
                    ms.database.TuningRecord.from_json(record, workload))
            except Exception:  # noqa: BLE001 - its workload line was lost, or it is malformed
                self.skipped_lines += 1

    def _append(self, docs: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(doc, separators=(",", ":")) + "\n" for doc in docs).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                size = handle.seek(0, os.SEEK_END)
                if size:
                    handle.seek(size - 1)
                    if handle.read(1) != b"\n":  # a torn last line from a killed writer
                        handle.seek(0)
                        handle.truncate(handle.read().rfind(b"\n") + 1)
                handle.write(data)  # append mode: always at the end
                handle.flush()
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def has_workload(self, mod: tvm.IRModule) -> bool:
        return self.memory.has_workload(mod)

    def commit_workload(self, mod: tvm.IRModule) -> ms.database.Workload:
        key = _key(mod)
        if key not in self._workloads:
            self._workloads[key] = self.memory.commit_workload(mod)
        if key not in self._own_workloads:
            self._own_workloads.add(key)
            self._append([{"workload": [key, *self._workloads[key].as_json()]}])
        return self._workloads[key]

    def commit_tuning_record(self, record: ms.database.TuningRecord) -> None:
        key = _key(record.workload.mod)
        if key not in self._own_workloads:  # a workload this process did not commit itself
            self.commit_workload(record.workload.mod)
            record = ms.database.TuningRecord(record.trace, self._workloads[key], record.run_secs,
                                              record.target, record.args_info)
        self.memory.commit_tuning_record(record)
        self._append([{"key": key, "record": record.as_json()}])

    def get_top_k(self, workload: ms.database.Workload, top_k: int) -> list:
        return self.memory.get_top_k(workload, top_k)

    def get_all_tuning_records(self) -> list:
        return self.memory.get_all_tuning_records()

    def records_for(self, mod: tvm.IRModule) -> int:
        """How many records the database holds for one kernel."""
        if not self.memory.has_workload(mod):
            return 0
        return len(self.memory.get_top_k(self.memory.commit_workload(mod), 1 << 30))

    def __len__(self) -> int:
        return len(self.memory)
