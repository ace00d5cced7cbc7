"""Per worker thread: the seconds a selection spends in each stage (reading, checking, extracting,
learning, writing) and the learning curves of a few chunks, for the run summary; and the steps of
the learner runs in flight, for progress bars.

The code of a stage adds to its thread's totals (:func:`timed`); the task that ends a unit of work
takes them (:func:`take`), so a partition's plan summary and completion marker carry the stages
that ran on that thread since the last take, the parquet read Dask fused in front of the task
included. The writer sums them into :attr:`datamask_dask.SelectionReport.stages`: benchmarks and
run summaries see where the time went without patching the package.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
import threading
import time
from collections import Counter


class _ThreadState(threading.local):
    def __init__(self):
        self.totals: dict[str, float] = {}  # stage -> seconds since the last take
        self.curves: list[dict] = []
        self.where: str | None = None  # the learner runs' name in step events


_local = _ThreadState()


@contextlib.contextmanager
def timed(stage: str):
    """Add the wall time of the ``with`` block to ``stage`` on this thread."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _local.totals[stage] = _local.totals.get(stage, 0.0) + time.perf_counter() - started


def take() -> dict[str, float]:
    """This thread's stage seconds since the last take (and reset them)."""
    totals, _local.totals = _local.totals, {}
    return totals


def keep(totals: dict[str, float]) -> None:
    """Add stage seconds taken on another worker (a pack's, learned apart from its members' tasks)."""
    for stage, seconds in totals.items():
        _local.totals[stage] = _local.totals.get(stage, 0.0) + seconds


def add_up(parts) -> dict[str, float]:
    """Sum stage seconds over several takes."""
    out: Counter = Counter()
    for part in parts:
        out.update(part or {})
    return dict(out)


# --------------------------------------------------------------------------- learning curves

#: Curves a thread keeps until they are taken (later ones are dropped), and points per curve.
MAX_CURVES, CURVE_POINTS = 4, 64


def note_curve(label: str, history) -> None:
    """Keep a learner run's per-step objective (``MaskResult.history``), thinned to ``CURVE_POINTS``.

    Cheap and bounded: at most ``MAX_CURVES`` curves wait on a thread, so a caller that never
    takes them (``datamask_select`` outside the writer) holds a few hundred floats at most.
    """
    values = [float(v) for v in history]
    if not values or len(_local.curves) >= MAX_CURVES:
        return
    if len(values) > CURVE_POINTS:
        steps = [round(i * (len(values) - 1) / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)]
    else:
        steps = list(range(len(values)))
    _local.curves.append({"chunk": label, "steps": len(values), "step": steps,
                          "objective": [round(values[s], 6) for s in steps]})


def keep_curves(curves: list[dict]) -> None:
    """Keep curves taken on another thread (a pack's, learned apart from its members' tasks)."""
    _local.curves.extend(curves[:max(0, MAX_CURVES - len(_local.curves))])


def take_curves() -> list[dict]:
    """This thread's learning curves since the last take (and forget them)."""
    curves, _local.curves = _local.curves, []
    return curves


# --------------------------------------------------------------------------- learning steps in flight

#: Distributed event topic of learning-step events, and seconds between two events of one run.
STEP_TOPIC, STEP_INTERVAL = "datamask-learning-steps", 0.5
_step_sinks: list = []  # callables of this process that take step events (local schedulers)
_run_numbers = itertools.count()


@contextlib.contextmanager
def learning(where: str):
    """Name the learner runs of the ``with`` block (``"partition 5, chunk 2"``) in step events."""
    previous, _local.where = _local.where, where
    try:
        yield
    finally:
        _local.where = previous


class StepCounter:
    """Counts one learner run's steps and publishes ``{"run", "where", "step", "steps"}`` events.

    An event goes out at the first step, then at most every ``STEP_INTERVAL`` seconds, and at the
    last step (``step == steps``: the run is over): to this process's sinks (the local schedulers'
    bar) and, inside a Dask worker, as a distributed event on ``STEP_TOPIC`` (a client's bar). The
    check per step is a clock read, nothing a learner step notices.
    """

    def __init__(self, steps: int):
        self.steps, self.step, self._sent = int(steps), 0, -math.inf
        self.run = f"{os.getpid()}-{threading.get_ident()}-{next(_run_numbers)}"
        self.where = _local.where or "chunk"

    def __call__(self, count: int = 1) -> None:
        self.step = min(self.step + count, self.steps)
        now = time.monotonic()
        if now - self._sent >= STEP_INTERVAL or self.step == self.steps:
            self._sent = now
            _publish({"run": self.run, "where": self.where, "step": self.step, "steps": self.steps})

    def finish(self) -> None:
        """End the run early (a stage was skipped): its bar entry goes away."""
        if self.step < self.steps:
            self(self.steps - self.step)


def add_step_sink(sink) -> None:
    """Send this process's step events to ``sink(event)`` too (see :func:`remove_step_sink`)."""
    _step_sinks.append(sink)


def remove_step_sink(sink) -> None:
    with contextlib.suppress(ValueError):
        _step_sinks.remove(sink)


def _publish(event: dict) -> None:
    for sink in list(_step_sinks):
        sink(event)
    distributed = sys.modules.get("distributed")  # never imported here: only if the worker runs it
    if distributed is not None:
        try:
            worker = distributed.get_worker()
        except ValueError:  # not inside a worker's task
            return
        worker.log_event(STEP_TOPIC, event)
