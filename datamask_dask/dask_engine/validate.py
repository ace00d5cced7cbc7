"""``validate_table`` (``datamask validate``): every check of a selection, no selection.

Runs the operator's checks (:mod:`datamask_dask.partition.checks`, the same functions as the
plan pass) on every partition and collects every problem instead of stopping at the first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import dask

from ..config import resolve_options
from ..errors import DataMaskError, Problem, messages, problems_error
from ..partition import adapters
from ..partition.checks import check_partition, summarise_check
from ..partition.spec import SelectSpec
from ..plan.reduce import (
    SHOW,
    dimension_problems,
    duplicate_problems,
    make_plan,
    starved_groups,
    unknown_groups,
)
from .operator import column_reads, id_graph, make_spec, require_dask


@dataclass
class ValidationReport:
    """Outcome of :func:`validate_table`."""

    rows: int = 0  # checked (0 when the checks could not start)
    partitions: int = 0
    dim: int | None = None  # of the embeddings (None when no row has one)
    columns: dict = field(default_factory=dict)  # name -> dtype, as the dataframe declares them
    problems: list = field(default_factory=list)  # of Problem
    # rows the plan selects, per group (None: no by=); with a token budget, the rows its split assumes
    planned: dict = field(default_factory=dict)
    tokens: bool = False  # whether the selection is by token budget
    unknown: dict = field(default_factory=dict)  # option -> its per-group keys that no row's group is
    starved: str | None = None  # the warning where most groups take no row (plan.reduce.starved_groups)

    @property
    def ok(self) -> bool:
        """Whether no problem was found."""
        return not self.problems

    def summary(self) -> str:
        """A short, human-readable outcome: the OK line or the numbered problems."""
        if self.ok:
            dim = "no embeddings" if self.dim is None else f"{self.dim}-d embeddings"
            return (f"OK: {self.rows} rows in {self.partitions} partition(s), {dim}, "
                    f"{len(self.columns)} columns")
        found = messages(self.problems)
        lines = [f"{len(found)} problem(s) found:"] + [f"  {i}. {text}" for i, text in enumerate(found, 1)]
        return "\n".join(lines)

    def selection(self) -> str:
        """What the plan selects, in words (empty where no plan was made): the rows, per group."""
        if not self.planned:
            return ""
        groups = [f"{label}: {rows}" for label, rows in self.planned.items() if label is not None]
        shown = f" ({', '.join(groups[:SHOW])}{', ...' if len(groups) > SHOW else ''})" if groups else ""
        about = "about " if self.tokens else ""  # the rows expected to fill a budget
        unknown = "".join(f"; {option} names {', '.join(map(repr, keys))}, which no row's group is"
                          for option, keys in self.unknown.items())
        starved = f"; {self.starved}" if self.starved else ""
        return f"the selection takes {about}{sum(self.planned.values())} rows{shown}{unknown}{starved}"

    def raise_if_failed(self) -> None:
        """Raise :class:`InputDataError` (or :class:`OptionError`) listing the problems, if any."""
        if self.problems:
            raise problems_error(self.problems)


# --------------------------------------------------------------------------- the whole table


def _validate_partition(frame, number: int, spec: SelectSpec) -> dict:
    check = check_partition(frame, number, spec, embeddings=True)
    summary = summarise_check(check) if not check.problems else None
    return {"rows": check.rows, "dim": check.dim, "problems": check.problems, "summary": summary}


def validate_table(ddf, ratio=None, *, config=None, scheduler=None, **options) -> ValidationReport:
    """Check a table and the options of a selection on it, without selecting anything.

    Runs the operator's checks (the same functions as the plan pass of
    :func:`~datamask_dask.datamask_select`) on every partition, reading the columns the selection
    would read, and collects every problem instead of stopping at the first. When the data pass,
    the quota plan is also made, so a ratio or token budget the data cannot meet is reported too.

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
    ratio, config, **options
        As for :func:`~datamask_dask.datamask_select`.
    scheduler : optional
        Passed to ``dask.compute`` (e.g. a distributed Client, ``"threads"``).

    Returns
    -------
    ValidationReport
        ``report.ok``, ``report.summary()``, ``report.raise_if_failed()``.

    Examples
    --------
    >>> report = validate_table(ddf, id_column="doc_id")   # doctest: +SKIP
    >>> print(report.summary())                            # doctest: +SKIP
    """
    require_dask(ddf, "validate_table")
    report = ValidationReport(partitions=ddf.npartitions,
                              columns={str(c): str(t) for c, t in ddf._meta.dtypes.items()})
    try:
        resolved = resolve_options(config, ratio=ratio, backend=adapters.backend(ddf._meta), **options)
        spec = make_spec(ddf, resolved, scheduler=scheduler)
    except DataMaskError as exc:
        report.problems = list(getattr(exc, "problems", None) or [Problem(str(exc))])
        return report
    spec = dataclasses.replace(spec, validate="full")
    parts = column_reads(ddf, spec.plan_columns)
    checks = [dask.delayed(_validate_partition, pure=True)(part, i, spec) for i, part in enumerate(parts)]
    ids = id_graph(parts, spec.id_column) if spec.check_ids else None
    checks, ids = dask.compute(checks, ids, scheduler=scheduler)
    report.rows = sum(c["rows"] for c in checks)
    dims = [c["dim"] for c in checks]
    report.dim = next((d for d in dims if d is not None), None)
    report.problems = [p for c in checks for p in c["problems"]]
    report.problems += dimension_problems(dims, spec.embedding_column)
    report.problems += duplicate_problems(ids, spec.id_column)
    if report.ok:  # the data are fine: can the quotas be met?
        try:
            plan = make_plan([c["summary"] for c in checks], None, report.dim, spec)
        except DataMaskError as exc:
            report.problems.append(Problem(str(exc)))
        else:
            cells = [cell for cells in plan.cells.values() for cell in cells]
            for cell in sorted(cells, key=lambda cell: cell.group):  # the groups in the plan's order
                report.planned[cell.label] = report.planned.get(cell.label, 0) + max(cell.quota, 0)
            report.tokens, report.unknown = spec.budget is not None, unknown_groups(plan)
            report.starved = starved_groups(plan)
    return report
