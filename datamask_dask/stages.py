"""Stage clocks: seconds a selection spends reading, checking, extracting, learning and writing.

Each worker thread keeps its own totals. The code of a stage adds to them (:func:`timed`), and the
task that ends a unit of work takes them (:func:`take`): a partition's plan summary and its
completion marker carry the seconds of the stages that ran on that thread since the last take,
including the parquet read Dask fused in front of the task. The writer sums them into
:attr:`datamask_dask.SelectionReport.stages`, so benchmarks and run summaries see where the time
went without patching the package.
"""

from __future__ import annotations

import contextlib
import threading
import time

_local = threading.local()


def _totals() -> dict[str, float]:
    totals = getattr(_local, "totals", None)
    if totals is None:
        totals = _local.totals = {}
    return totals


@contextlib.contextmanager
def timed(stage: str):
    """Add the wall time of the ``with`` block to ``stage`` on this thread."""
    started = time.perf_counter()
    try:
        yield
    finally:
        totals = _totals()
        totals[stage] = totals.get(stage, 0.0) + time.perf_counter() - started


def take() -> dict[str, float]:
    """This thread's stage seconds since the last take (and reset them)."""
    totals = dict(_totals())
    _totals().clear()
    return totals


def add_up(parts) -> dict[str, float]:
    """Sum stage seconds over several takes."""
    out: dict[str, float] = {}
    for part in parts:
        for stage, seconds in (part or {}).items():
            out[stage] = out.get(stage, 0.0) + seconds
    return out
