"""The project's own exceptions: every bad input ends here, with a message that says what to do."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

# How each door asks to write into an output that exists, for the sinks' messages: the command line's
# flag, the keyword of the door a message names, and the other door's (the command line shows its flags).
REPLACE_OUTPUT = "--overwrite (overwrite=True; select_table: mode='overwrite')"
WRITE_INTO_TABLE = "mode='append' or 'overwrite' (--mode; write_selection: overwrite=True)"
WRITING_DOORS = ("an output is replaced by write_selection(..., overwrite=True) or select_table(..., "
                 "mode='overwrite'), and appended to (Delta, Iceberg) by select_table(..., mode='append')")


class DataMaskError(ValueError):
    """Base class of every error datamask-dask raises on bad input or options."""


class OptionError(DataMaskError):
    """An option is out of range or unknown (the message names the option)."""


class InputDataError(DataMaskError):
    """The input data breaks the data contract (the message names the column, partition and rows)."""

    # set by a partition's checks, for the Problem they become
    column: str | None = None
    rows: tuple[int, ...] = ()


class StorageError(DataMaskError):
    """An object store could not be reached or refused a request (:mod:`datamask_dask.io.storage`): the
    message names the URI, what failed and what to set; ``reason`` is ``"credentials"`` (none found,
    or refused), ``"endpoint"``, ``"bucket"`` or ``"permission"``."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):  # keeps ``reason`` across processes (Dask workers)
        return type(self), (str(self), self.reason)


class DataMaskWarning(UserWarning):
    """What a selection on a Dask or Spark frame tells before it selects (a run's log says the same):
    ``warnings.filterwarnings("ignore", category=DataMaskWarning)`` silences it."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input or the options: ``message`` says what, where and what to do."""

    message: str
    column: str | None = None
    partition: int | None = None
    rows: tuple = ()  # first few row positions inside the partition (empty when not row-specific)

    def __str__(self) -> str:
        return self.message


def messages(problems: list[Problem]) -> list[str]:
    """The problems' distinct messages, in order (one message may name several columns)."""
    return list(dict.fromkeys(p.message for p in problems))


def problems_error(problems: list[Problem], kind: type[DataMaskError] = InputDataError) -> DataMaskError:
    """One exception for a list of problems: the first on the first line, the others after it."""
    error = kind("\n".join(messages(problems)))
    error.problems = list(problems)
    return error


class WorkerMemoryError(DataMaskError):
    """Workers ran out of memory: they died running a task, or Dask paused one for good (the message
    says which task or worker, and what to change)."""


#: What makes a job's tasks fit its workers, for the messages of :class:`WorkerMemoryError`.
SMALLER_TASKS = ("give the workers more memory (memory_limit=) or fewer threads each, split the input into "
                 "smaller partitions (ddf.repartition(npartitions=...)), or set max_chunk_rows= or "
                 "memory_budget= to learn in smaller chunks (a different chunking selects different rows)")


@contextlib.contextmanager
def worker_deaths_explained():
    """Raise Dask's ``KilledWorker`` in the block as :class:`WorkerMemoryError`, naming the task and
    the options that make tasks smaller, instead of a bare scheduler error."""
    try:
        yield
    except Exception as exc:
        if type(exc).__name__ != "KilledWorker":
            raise
        task = getattr(exc, "task", None) or str(exc)
        raise WorkerMemoryError(
            f"the workers died while running task {task!r}, which is what a worker out of memory does: "
            f"{SMALLER_TASKS}") from exc
