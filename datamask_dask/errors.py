"""The project's own exceptions: every bad input ends here, with a message that says what to do."""

from __future__ import annotations

from dataclasses import dataclass


class DataMaskError(ValueError):
    """Base class of every error datamask-dask raises on bad input or options."""


class OptionError(DataMaskError):
    """An option is out of range or unknown (the message names the option)."""


class InputDataError(DataMaskError):
    """The input data breaks the data contract (the message names the column, partition and rows)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input or the options: ``message`` says what, where and what to do."""

    message: str
    column: str | None = None
    partition: int | None = None
    rows: tuple = ()  # first few row positions inside the partition (empty when not row-specific)

    def __str__(self) -> str:
        return self.message


def problems_error(problems: list[Problem], kind: type[DataMaskError] = InputDataError) -> DataMaskError:
    """One exception for a list of problems: the first on the first line, the others after it."""
    error = kind("\n".join(p.message for p in problems))
    error.problems = list(problems)
    return error
