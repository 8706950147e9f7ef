"""A target's MetaSchedule tuning database: ``autotune/<target>/tuning_records.jsonl``.

The database file is JSON lines, each line self-contained: ``{"workload": [key, *workload]}``
(MetaSchedule's JSON of the kernel) or ``{"key": key, "record": record}`` (its JSON of a measured
schedule), where ``key`` is the kernel's structural hash. No line refers
to another by position, so writers never need to agree on numbering:

- appends hold an exclusive ``fcntl.flock`` on the file, so concurrent tuners serialize and lose
  nothing;
- a line torn by a kill is skipped when reading and cut off before the next append, so a killed
  tune keeps every record it finished and the next one resumes from them.

MetaSchedule's look-ups ignore the target (an x86 record would apply to an Arm build), hence one
database per target, named after it.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from edgec.core.targets import Target, autotune_dir
from edgec.errors import StageInputError

RECORDS_FILE = "tuning_records.jsonl"


def open_database(target: Target, must_exist: bool = True) -> TuningDatabase | None:
    """The target's database; None (or an error, with ``must_exist``) when it has no records."""
    path = autotune_dir(target) / RECORDS_FILE
    if not path.is_file() or path.stat().st_size == 0:
        if must_exist:
            raise StageInputError(f"target '{target.name}' has no tuning database at '{path}'; "
                                  f"create it with `edgec tune MODEL --target {target.name}`")
        return None
    return TuningDatabase(path)


def _key(mod: tvm.IRModule) -> str:
    return str(tvm_ffi.structural_hash(mod))


@derived_object
class TuningDatabase(ms.database.PyDatabase):
    """MetaSchedule records in memory, each new one also appended to a JSON-lines file under a lock.

    Look-ups (best record per kernel) are MetaSchedule's own ``MemoryDatabase``.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.location = str(self.path.parent)
        self.memory = ms.database.MemoryDatabase(module_equality="structural")
        self.skipped_lines = 0
        self._workloads: dict[str, Any] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.is_file():
            return
        pending: list[tuple[str, Any]] = []
        with open(self.path, "rb") as handle:
            for raw in handle:
                try:
                    doc = json.loads(raw)
                    if "workload" in doc:
                        key = doc["workload"][0]
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
            workload = self.memory.commit_workload(mod)
            self._workloads[key] = workload
            self._append([{"workload": [key, *workload.as_json()]}])
        return self._workloads[key]

    def commit_tuning_record(self, record: ms.database.TuningRecord) -> None:
        key = _key(record.workload.mod)
        if key not in self._workloads:  # a workload this process did not commit itself
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
