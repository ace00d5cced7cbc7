"""A Dask worker preload that measures each task's own peak memory, by task prefix: the worker
process's peak resident memory while the task runs (Linux's VmHWM, reset through
/proc/self/clear_refs as it starts) above its resident memory as it starts. What the worker holds
of earlier tasks' results is left out; what it receives or sends while the task runs is counted
in. Each worker writes its largest peak per prefix as JSON into ``$DATAMASK_TASK_PEAKS`` (a folder)
whenever one grows. A worker of one thread runs one task at a time, so each peak is its task's.

Loaded by ``DASK_DISTRIBUTED__WORKER__PRELOAD`` (``jobs.checkout_job(..., task_peaks=True)``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dask.utils import key_split
from distributed import WorkerPlugin


def _status(field: str) -> int:
    """A field of /proc/self/status in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class TaskPeaks(WorkerPlugin):
    name = "datamask-task-peaks"

    def setup(self, worker):
        self.path = Path(os.environ["DATAMASK_TASK_PEAKS"]) / f"{os.getpid()}.json"
        self.started: dict = {}
        self.peaks: dict[str, int] = {}

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing":
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")  # VmHWM back to VmRSS
            self.started[key] = _status("VmRSS")
        elif start == "executing" and key in self.started:
            peak, prefix = _status("VmHWM") - self.started.pop(key), key_split(key)
            if peak > self.peaks.get(prefix, -1):
                self.peaks[prefix] = peak
                self.path.write_text(json.dumps(self.peaks))


def collected(folder) -> dict[str, int]:
    """The workers' files in ``folder`` as one: each task prefix's largest own peak, in bytes, largest
    first."""
    peaks: dict[str, int] = {}
    for path in Path(folder).glob("*.json"):  # one file a worker
        for prefix, most in json.loads(path.read_text()).items():
            peaks[prefix] = max(most, peaks.get(prefix, 0))
    return dict(sorted(peaks.items(), key=lambda item: -item[1]))


async def dask_setup(worker):
    await worker.plugin_add(TaskPeaks())
