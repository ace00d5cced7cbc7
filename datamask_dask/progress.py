"""Progress bars for Dask computations: partitions done, and the learning steps of the chunks in flight.

``progress=None`` (the default of :func:`datamask_dask.write_selection`) shows a bar only where
someone watches: stderr is a terminal, or the code runs in a Jupyter kernel. ``True`` forces it
(``datamask select --progress``), ``False`` silences it. The bar goes to stderr, so stdout stays
the command's result::

    [################              ] | 40% Completed | 12.3s | learning partition 5, chunk 2: step 120/400

Tasks done are counted by a :class:`dask.diagnostics.ProgressBar` on the local schedulers
(threads, processes, sync) and from the futures' states on a distributed client. Learner runs
report their steps through :mod:`datamask_dask.telemetry`: in this process directly, from Dask
workers as distributed events, so one chunk of a million rows does not look like a hang.

:func:`compute_parts` computes one delayed part per partition of a finished result (``datamask
embed``, ``datamask score``) and counts the parts and their rows: the bar shows parts done, rows/s
and the time left; without a bar, each finished part is a log line (``datamask_dask`` logger)::

    [########                ] | 3/20 parts | 3072/20480 rows | 41.2 rows/s | 7m left | 1m15s
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

import dask
from dask.callbacks import Callback
from dask.diagnostics import ProgressBar

from . import telemetry
from .errors import WorkerMemoryError, worker_deaths_explained

#: Characters of the bar, and seconds between two draws.
WIDTH, DRAW_INTERVAL = 40, 0.1
_log = logging.getLogger("datamask_dask.progress")


def wanted(progress: bool | None) -> bool:
    """Whether to show a bar: ``progress`` if given, else when stderr is a TTY or in a notebook."""
    if progress is not None:
        return bool(progress)
    if os.environ.get("DATAMASK_PROGRESS", "").lower() in ("1", "true", "yes"):
        return True
    with contextlib.suppress(AttributeError, ValueError):  # no stderr, or a closed one
        if sys.stderr.isatty():
            return True
    return _in_notebook()


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None or "ipykernel" not in sys.modules:
        return False
    try:
        return type(shell.get_ipython()).__name__ == "ZMQInteractiveShell"
    except Exception:
        return False


def client_of(scheduler):
    """The distributed Client a computation will run on, or None for the local schedulers."""
    if "distributed" not in sys.modules:  # no client can exist: leave its import to those who use it
        return None
    from distributed import Client, default_client

    if isinstance(scheduler, Client):
        return scheduler
    if scheduler is None and dask.config.get("scheduler", None) in (None, "dask.distributed"):
        with contextlib.suppress(ValueError):
            return default_client()
    return None


def compute(*collections, scheduler=None, progress: bool | None = None, kept: list = ()):
    """``dask.compute(*collections, scheduler=scheduler)`` with a progress bar when :func:`wanted`;
    workers that die running a task raise :class:`~datamask_dask.errors.WorkerMemoryError`.
    ``kept``: Delayeds computed with them and left where they are, after the collections' values:
    futures on a distributed client (a later graph takes them on its workers), values otherwise."""
    with worker_deaths_explained():
        return _compute(*collections, scheduler=scheduler, progress=progress, kept=list(kept))


def persist(collection, *, scheduler=None, progress: bool | None = None):
    """``collection`` persisted where the package's computations on ``scheduler`` run (:func:`client_of`):
    futures on a distributed client (returned at once; the computations that take them show their
    tasks), else values in this process, read under a bar when :func:`wanted`."""
    client = client_of(scheduler)
    if client is not None:
        return client.persist(collection)
    with worker_deaths_explained(), _Bar() if wanted(progress) else contextlib.nullcontext():
        return collection.persist(scheduler=scheduler)


def _compute(*collections, scheduler=None, progress: bool | None = None, kept: list):
    client = client_of(scheduler)
    if client is None:
        from .threads import one_blas_thread

        with one_blas_thread():  # a task per core
            if not wanted(progress):
                return dask.compute(*collections, *kept, scheduler=scheduler)
            bar = _Bar()
            telemetry.add_step_sink(bar)  # the learners run in this process
            try:
                with bar:
                    return dask.compute(*collections, *kept, scheduler=scheduler)
            finally:
                telemetry.remove_step_sink(bar)
    futures = client.compute(list(collections) + kept)
    if wanted(progress):
        bar = _Bar()
        client.subscribe_topic(telemetry.STEP_TOPIC, lambda event: bar(event[1]))  # (time, message)
        try:
            _wait(client, futures, bar)
        finally:
            client.unsubscribe_topic(telemetry.STEP_TOPIC)
            bar.end()
    else:
        _wait(client, futures)
    values, held = client.gather(futures[:len(collections)]), futures[len(collections):]
    for future in held:
        if future.exception() is not None:  # waits for it, and moves no value
            future.result()  # raises what the task raised
    return (*values, *held)


def _wait(client, futures: list, bar=None, on_done=None) -> None:
    """Until every future is done or failed: ``on_done(number)`` once for each that finishes, and the bar
    (if any) redrawn meanwhile. Where a worker stays paused (:class:`~datamask_dask.stalls.Stalls`), the
    futures are cancelled and :class:`~datamask_dask.errors.WorkerMemoryError` says what to change."""
    from .stalls import Stalls, every_worker

    stalls = Stalls(lambda: every_worker(client.scheduler_info))
    started, finished = time.perf_counter(), set()
    while True:
        for number, future in enumerate(futures):
            if number not in finished and future.done():
                finished.add(number)
                if on_done is not None:
                    on_done(number)
        if bar is not None:
            bar._draw_bar(len(finished) / len(futures) if futures else 1.0, time.perf_counter() - started)
        if len(finished) == len(futures):
            return
        stalled = stalls.look()
        if stalled is not None:
            client.cancel(futures)
            raise WorkerMemoryError(stalled[1])
        time.sleep(DRAW_INTERVAL)


class _Bar(ProgressBar):
    """One bar line on stderr, redrawn in place: Dask's bar on the local schedulers (as a context
    manager), drawn by :func:`compute` on a client. ``bar(event)`` takes a learner's step event."""

    def __init__(self):
        super().__init__(dt=DRAW_INTERVAL, out=sys.stderr)
        self._drawn = 0
        self._runs: dict[str, dict] = {}  # run -> its latest event, oldest run first
        self._lock = threading.Lock()  # events come from worker threads or the client's loop

    def __call__(self, event: dict) -> None:
        with self._lock:
            if event["step"] >= event["steps"]:
                self._runs.pop(event["run"], None)
            else:
                self._runs[event["run"]] = event

    def _text(self, fraction: float, elapsed: float) -> str:
        from dask.utils import format_time

        text = (f"[{'#' * int(WIDTH * fraction):<{WIDTH}}] | {int(100 * fraction)}% Completed | "
                f"{format_time(elapsed)}")
        with self._lock:
            runs = list(self._runs.values())
        if runs:  # " | learning partition 5, chunk 2: step 120/400 (+1 more)"
            more = f" (+{len(runs) - 1} more)" if len(runs) > 1 else ""
            text += f" | learning {runs[0]['where']}: step {runs[0]['step']}/{runs[0]['steps']}{more}"
        return text

    def _draw_bar(self, fraction: float, elapsed: float) -> None:
        text = self._text(fraction, elapsed)
        # a shorter line is padded over the longer one before
        padding, self._drawn = " " * max(0, self._drawn - len(text)), len(text)
        with contextlib.suppress(ValueError):  # the stream was closed under us
            self._file.write(f"\r{text}{padding}")
            self._file.flush()

    def end(self) -> None:
        """End the line (the local schedulers' bar ends its own when the computation does)."""
        with contextlib.suppress(ValueError):
            self._file.write("\n")
            self._file.flush()


class Parts:
    """Parts finished out of ``len(rows)`` (``rows``: each part's row count), rows/s and time left."""

    def __init__(self, rows: list[int], keys: list | None = None):
        self.rows, self.total = [int(r) for r in rows], sum(int(r) for r in rows)
        self.index = {key: number for number, key in enumerate(keys or [])}
        self.done, self.rows_done, self.started = 0, 0, time.perf_counter()
        self._lock = threading.Lock()

    def finish(self, number: int) -> None:
        with self._lock:
            self.done += 1
            self.rows_done += self.rows[number]

    def finish_key(self, key) -> bool:
        """Count the part that Dask task ``key`` computed; False for any other task."""
        number = self.index.get(key)
        if number is not None:
            self.finish(number)
        return number is not None

    def describe(self) -> str:
        """``3/20 parts | 3072/20480 rows | 41.2 rows/s | 7m left``: an estimate once a part is done."""
        from dask.utils import format_time

        with self._lock:
            done, rows_done = self.done, self.rows_done
        text = f"{done}/{len(self.rows)} parts | {rows_done}/{self.total} rows"
        elapsed = time.perf_counter() - self.started
        if rows_done and elapsed > 0:
            rate = rows_done / elapsed
            text += f" | {rate:.1f} rows/s"
            if done < len(self.rows):
                text += f" | {format_time((self.total - rows_done) / rate)} left"
        return text


class _PartsBar(_Bar):
    """The bar of :func:`compute_parts` on the local schedulers: the parts' share, not the tasks'."""

    def __init__(self, parts: Parts):
        super().__init__()
        self.parts = parts

    def _posttask(self, key, result, dsk, state, worker_id) -> None:
        self.parts.finish_key(key)

    def _update_bar(self, elapsed: float) -> None:
        self._draw_bar(self.parts.done / max(1, len(self.parts.rows)), elapsed)

    def _text(self, fraction: float, elapsed: float) -> str:
        from dask.utils import format_time

        return f"[{'#' * int(WIDTH * fraction):<{WIDTH}}] | {self.parts.describe()} | {format_time(elapsed)}"


class _PartsLog(Callback):
    """Without a bar: a log line per finished part (the local schedulers)."""

    def __init__(self, parts: Parts, name: str):
        super().__init__()
        self.parts, self.name = parts, name

    def _posttask(self, key, result, dsk, state, worker_id) -> None:
        if self.parts.finish_key(key):
            _log.info("%s: %s", self.name, self.parts.describe())


def compute_parts(parts: list, rows: list[int], *, scheduler=None, progress: bool | None = None,
                  name: str = "write"):
    """``dask.compute(*parts)`` (one Delayed per part, ``rows`` its row count) showing parts done,
    rows/s and the time left: a bar where :func:`wanted`, else a log line per finished part."""
    with worker_deaths_explained():
        counter = Parts(rows, [part.key for part in parts])
        show = wanted(progress)
        client = client_of(scheduler)
        if client is None:
            with _PartsBar(counter) if show else _PartsLog(counter, name):
                return dask.compute(*parts, scheduler=scheduler)
        bar = _PartsBar(counter) if show else None
        futures = client.compute(list(parts))

        def finished(number: int) -> None:
            counter.finish(number)
            if bar is None:
                _log.info("%s: %s", name, counter.describe())

        try:
            _wait(client, futures, bar, finished)
        finally:
            if bar is not None:
                bar.end()
        return tuple(client.gather(futures))


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record, so a later redirection is followed."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def log_to_stderr(verbose: bool, progress: bool | None = None) -> None:
    """A command's batch job (no progress bar: ``progress`` False, or None off a terminal) or its
    ``--verbose`` logs what ran on stderr: phases, reused partitions, parts, commits."""
    batch = progress is False or (progress is None and not sys.stderr.isatty())
    if not (verbose or batch):
        return
    logger = logging.getLogger("datamask_dask")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(asctime)s datamask: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
