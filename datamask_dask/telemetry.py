"""What a selection measures: the seconds each task spends in each stage (reading, checking,
extracting, learning, writing) and the learning curves of a few chunks, for the run summary; and the
steps of the learner runs in flight, for progress bars.

Measurements are values. A task makes a :class:`Measures`, its stages add to it (:meth:`Measures.timed`,
:meth:`Measures.curve`), and it returns it with its result: a partition's scan in its plan summary, a
learned pack with the pack, a selected partition in its marker. The writer sums them into
:attr:`datamask_dask.SelectionReport.stages`, each pack's once. The package's readers leave their
seconds on the frame they make (``frame.attrs[READ]``), which the first task to take the frame counts
(:meth:`Measures.took`): a read Dask runs as a task of its own is counted where its rows are used.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

#: The ``attrs`` key under which the package's readers leave the seconds a frame took to read.
READ = "datamask.read_seconds"
#: Curves a task keeps (later ones are dropped), and points per curve.
MAX_CURVES, CURVE_POINTS = 4, 64


@dataclass
class Measures:
    """One task's stage seconds and learning curves (each thinned to ``CURVE_POINTS``, at most
    ``MAX_CURVES``)."""

    stages: dict[str, float] = field(default_factory=dict)
    curves: list[dict] = field(default_factory=list)

    @contextlib.contextmanager
    def timed(self, stage: str):
        """Add the wall time of the ``with`` block to ``stage``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add({stage: time.perf_counter() - started})

    def add(self, stages: dict[str, float]) -> None:
        for stage, seconds in stages.items():
            self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def took(self, frame, count: bool = True) -> None:
        """Count the seconds the package's reader took to make ``frame`` (once: they leave the frame;
        ``count=False`` drops them, counted already where the frame is read once for several passes)."""
        attrs = getattr(frame, "attrs", None)  # pandas, and cuDF from 24.08
        seconds = attrs.pop(READ, None) if attrs is not None else None
        if seconds is not None and count:
            self.add({"read": float(seconds)})

    def curve(self, label: str, history) -> None:
        """Keep a learner run's per-step objective (``MaskResult.history``), thinned to ``CURVE_POINTS``."""
        values = [float(v) for v in history]
        if not values or len(self.curves) >= MAX_CURVES:
            return
        if len(values) > CURVE_POINTS:
            steps = [round(i * (len(values) - 1) / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)]
        else:
            steps = list(range(len(values)))
        self.curves.append({"chunk": label, "steps": len(values), "step": steps,
                            "objective": [round(values[s], 6) for s in steps]})


def timed_read(read):
    """``read`` (a reader of one partition) leaving the seconds it took in its frame's ``attrs``."""

    @functools.wraps(read)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        frame = read(*args, **kwargs)
        attrs = getattr(frame, "attrs", None)  # pandas, and cuDF from 24.08
        if attrs is not None:
            attrs[READ] = time.perf_counter() - started
        return frame

    return timed


def add_up(parts) -> dict[str, float]:
    """Sum stage seconds over several tasks' stages."""
    out: Counter = Counter()
    for part in parts:
        out.update(part or {})
    return dict(out)


# --------------------------------------------------------------------------- learning steps in flight

#: Distributed event topic of learning-step events, and seconds between two events of one run.
STEP_TOPIC, STEP_INTERVAL = "datamask-learning-steps", 0.5
_step_sinks: list = []  # callables of this process that take step events (local schedulers)
_run_numbers = itertools.count()


class StepCounter:
    """Counts one learner run's steps (``where``: its name, ``"partition 5, chunk 2"``) and publishes
    ``{"run", "where", "step", "steps"}`` events.

    An event goes out at the first step, then at most every ``STEP_INTERVAL`` seconds, and at the
    last step (``step == steps``: the run is over): to this process's sinks (the local schedulers'
    bar) and, inside a Dask worker, as a distributed event on ``STEP_TOPIC`` (a client's bar). The
    check per step is a clock read, nothing a learner step notices.
    """

    def __init__(self, steps: int, where: str = "chunk"):
        self.steps, self.step, self._sent, self.where = int(steps), 0, -math.inf, where
        self.run = f"{os.getpid()}-{threading.get_ident()}-{next(_run_numbers)}"

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
