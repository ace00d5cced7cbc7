"""Stage clocks: seconds a selection spends reading, checking, extracting, learning and writing,
and the learning curves of a few chunks, kept per worker thread for the run summary.

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


# --------------------------------------------------------------------------- learning curves

#: Curves a thread keeps until they are taken (older ones are dropped), and points per curve.
MAX_CURVES, CURVE_POINTS = 4, 64


def note_curve(label: str, history) -> None:
    """Keep a learner run's per-step objective (``MaskResult.history``), thinned to ``CURVE_POINTS``.

    Cheap and bounded: at most ``MAX_CURVES`` curves wait on a thread, so a caller that never
    takes them (``datamask_select`` outside the writer) holds a few hundred floats at most.
    """
    values = [float(v) for v in history]
    if not values:
        return
    if len(values) > CURVE_POINTS:
        steps = [round(i * (len(values) - 1) / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)]
    else:
        steps = list(range(len(values)))
    curves = getattr(_local, "curves", None)
    if curves is None:
        curves = _local.curves = []
    if len(curves) < MAX_CURVES:
        curves.append({"chunk": label, "steps": len(values), "step": steps,
                       "objective": [round(values[s], 6) for s in steps]})


def take_curves() -> list[dict]:
    """This thread's learning curves since the last take (and forget them)."""
    curves = getattr(_local, "curves", None) or []
    _local.curves = []
    return curves
