"""A computation that a worker paused for want of memory holds for good fails, naming what to change.

Dask pauses a worker whose process passes its pause share of the memory limit. Memory held outside
the tasks' results (the allocator's, a library's) may never fall back, and then Dask's scheduler
neither moves the tasks the worker holds nor gives up on them: the computation would wait for ever.
:class:`Stalls` tells such a worker from the scheduler's description of its workers. It is watched
in two places, alike:

- the package's own waits (:func:`datamask_dask.progress.compute`, the writers and the CLI), which
  cancel their futures and raise :class:`~datamask_dask.errors.WorkerMemoryError`;
- on the scheduler, :class:`StallWatch` (registered by :func:`watch_stalls` when a selection is
  built on a distributed client), which fails the package's tasks the worker holds with that error,
  so that a user's own ``datamask_select(ddf).compute()`` ends too.

Loaded only where a distributed client runs.
"""

from __future__ import annotations

import logging
import time

import dask
from dask.utils import format_bytes, key_split
from distributed.diagnostics.plugin import SchedulerPlugin

from .errors import SMALLER_TASKS, WorkerMemoryError

#: Seconds a worker may stay paused with work it will not start before the job fails.
STALL_SECONDS = 60.0
_LOOK = 1.0  # seconds between two looks at the workers
_log = logging.getLogger(__name__)


class Stalls:
    """Whether a computation has stopped for want of memory: a worker that Dask paused, running nothing,
    while it holds tasks to run (or while every worker is paused), for ``seconds`` on end.
    ``workers()``: the workers as ``Client.scheduler_info()["workers"]`` describes them (None: the
    scheduler did not answer)."""

    def __init__(self, workers, seconds: float | None = None):
        self.workers, self.seconds = workers, STALL_SECONDS if seconds is None else seconds
        self.since: dict[str, float] = {}
        self.looked = time.monotonic()

    def look(self) -> tuple[str, str] | None:
        """The first worker stalled for ``seconds``, and the message that says so and what to change."""
        now = time.monotonic()
        if now - self.looked < _LOOK:
            return None
        self.looked = now
        workers = self.workers()
        if workers is None:  # the futures will say what became of the scheduler
            return None
        idle = {address for address, worker in workers.items()
                if worker.get("status") == "paused" and not _tasks(worker).get("executing")}
        every = bool(workers) and len(idle) == len(workers)
        stuck = {address for address in idle if every or _waiting(workers[address])}
        self.since = {address: self.since.get(address, now) for address in stuck}
        for address, since in self.since.items():
            if now - since >= self.seconds:
                return address, _message(address, workers[address], now - since)
        return None


def every_worker(describe) -> dict | None:
    """Every worker as ``describe`` (``Client.scheduler_info``, ``Scheduler.identity``) gives them, or
    None where the scheduler did not answer."""
    try:
        try:
            return describe(n_workers=-1)["workers"]
        except TypeError:  # a distributed that lists every worker without being asked
            return describe()["workers"]
    except Exception:
        return None


def watch_stalls(client) -> None:
    """:class:`StallWatch` on ``client``'s scheduler (once per scheduler)."""
    try:
        client.register_plugin(StallWatch())
    except Exception as exc:  # e.g. a scheduler without the package: the package's own waits still watch
        _log.debug("no stall watch on the scheduler: %s", exc)


class StallWatch(SchedulerPlugin):
    """On the scheduler: the tasks that a stalled worker holds (:class:`Stalls`), and those no worker can
    take while every worker is paused, fail with :class:`~datamask_dask.errors.WorkerMemoryError`
    where they are the package's (``datamask-*``) or feed one; another computation's are left alone."""

    name, idempotent = "datamask-stall-watch", True

    def __init__(self):
        self.seconds = STALL_SECONDS  # as the client that registers the watch has it

    async def start(self, scheduler) -> None:
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        self.stalls = Stalls(lambda: every_worker(scheduler.identity), self.seconds)
        self.callback = PeriodicCallback(self.look, _LOOK * 1000)
        self.callback.start()

    async def close(self) -> None:
        self.callback.stop()

    def look(self) -> None:
        try:
            stalled = self.stalls.look()
            if stalled is not None:
                self.fail(*stalled)
        except Exception:  # a distributed whose scheduler differs: the watch ends, never the scheduler
            _log.warning("the stall watch stopped", exc_info=True)
            self.callback.stop()

    def fail(self, address: str, message: str) -> None:
        from distributed.core import error_message

        scheduler, stimulus = self.scheduler, f"datamask-stall-{time.time()}"
        held = scheduler.workers[address].processing if address in scheduler.workers else ()
        unplaced = [*scheduler.queued, *scheduler.unrunnable] if not scheduler.running else []
        error = {key: value for key, value in error_message(WorkerMemoryError(message)).items()
                 if key != "status"}
        for task in [*held, *unplaced]:
            if not any(_ours(t) for t in (task, *task.dependents)):  # another computation's: left alone
                continue
            if task.state == "processing":
                scheduler.handle_task_erred(key=task.key, run_id=task.run_id, stimulus_id=stimulus,
                                            worker=task.processing_on.address, **error)
            elif task.state in ("queued", "no-worker"):  # no worker holds it: no stimulus of a worker's fits
                recommendations, to_clients, to_workers = scheduler._transition(
                    task.key, "erred", stimulus, cause=task.key, **error)
                scheduler._transitions(recommendations, to_clients, to_workers, stimulus)
                scheduler.send_all(to_clients, to_workers)


def _ours(task) -> bool:
    return key_split(task.key).startswith("datamask-")


def _tasks(worker: dict) -> dict:
    return (worker.get("metrics") or {}).get("task_counts") or {}


def _waiting(worker: dict) -> int:
    """Tasks a worker holds that it has yet to run (or fetch the inputs of)."""
    return sum(count for state, count in _tasks(worker).items()
               if state in ("ready", "constrained", "waiting", "fetch", "flight", "missing"))


def _message(address: str, worker: dict, seconds: float) -> str:
    held, limit = (worker.get("metrics") or {}).get("memory") or 0, worker.get("memory_limit") or 0
    pause = dask.config.get("distributed.worker.memory.pause", False)
    where = f", past the {float(pause):.0%} at which Dask pauses a worker" if pause else ""
    return (f"worker {address} has been paused for {seconds:.0f} s with tasks it will not start: its process "
            f"holds {format_bytes(held)} of its {format_bytes(limit)} memory limit{where}, and the job would "
            f"wait for ever. To make the tasks fit: {SMALLER_TASKS}")
