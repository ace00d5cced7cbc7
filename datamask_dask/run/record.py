"""The run record every output keeps: what ran, on which input, with which options, and what it gave.

:func:`~datamask_dask.run.protocol.execute` makes one :class:`RunRecord` per run and every sink keeps
its :meth:`~RunRecord.to_dict` as JSON (``_datamask_run.json``, a parquet footer key, a Delta commit's
or an Iceberg snapshot's metadata). :meth:`RunRecord.from_dict` reads a record of this format back,
its settings as the :class:`~datamask_dask.options.SelectOptions` the run used, so that the report,
:class:`~datamask_dask.run.summary.RunSummary` and ``datamask explain`` read the options' fields
instead of re-deriving them from the settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..io.records import as_json
from ..options import SelectOptions
from .work import FORMAT


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One selection run, as its output records it (format :data:`~datamask_dask.run.work.FORMAT`)."""

    run_id: str
    engine: str  # "dask" or "spark"
    options: SelectOptions  # after profile and config
    input: Mapping[str, Any]  # where it came from, its partitions' rows and content digest
    output: Mapping[str, Any]  # its URI and format (and a table's mode)
    partitions: tuple[Mapping[str, int], ...]  # partition, rows, selected
    computed: tuple[int, ...]  # the partitions this run selected
    reused: tuple[int, ...]  # ... and those an interrupted run had finished
    phases: Mapping[str, float]  # the driver's wall seconds
    stages: Mapping[str, float]  # the workers' seconds per stage, summed over tasks
    summary: Mapping[str, Any]  # run.summary.summarise_run: groups, tokens, curves, objective on a sample
    versions: Mapping[str, str]
    finished: str
    incremental: Mapping[str, Any] | None = None  # the table version an incremental run continued from
    memory_budget: Any = None  # as the user set it (it sizes chunks)
    pieces: Mapping[str, Any] | None = None  # how the table was cut for the learner (Plan.pieces)

    @property
    def rows(self) -> int:
        return sum(int(p["rows"]) for p in self.partitions)

    @property
    def selected(self) -> int:
        return sum(int(p["selected"]) for p in self.partitions)

    def to_dict(self) -> dict:
        """The record as the output keeps it (plain JSON data)."""
        return as_json({
            "format": FORMAT, "tool": "datamask-dask", "kind": "selection", "run_id": self.run_id,
            "engine": self.engine, "seed": self.options.learner.seed, "profile": self.options.profile,
            "settings": self.options.to_dict(), "input": self.input, "output": self.output,
            "rows": self.rows, "selected": self.selected, "partitions": list(self.partitions),
            "computed": list(self.computed), "reused": list(self.reused), "phases": self.phases,
            "stages": self.stages, "summary": self.summary, "versions": self.versions,
            "finished": self.finished, "incremental": self.incremental, "memory_budget": self.memory_budget,
            "pieces": self.pieces,
        })

    @classmethod
    def from_dict(cls, record: Mapping) -> RunRecord:
        """A record an output keeps, read back: this format's, or an earlier one's with what it lacks empty
        (ValueError: not a selection's record, or a newer version's)."""
        kind = record.get("kind", "selection")
        if kind != "selection":
            raise ValueError(f"it was not written by `datamask select` (its run record is of a {kind!r} "
                             "run): give the output of `datamask select`")
        if int(record.get("format") or 0) > FORMAT:
            raise ValueError(f"its run record has format {record['format']}, newer than this version "
                             f"reads ({FORMAT}): upgrade datamask-dask")
        options = SelectOptions.from_settings(record.get("settings") or {}, profile=record.get("profile"))
        return cls(run_id=str(record.get("run_id")), engine=str(record.get("engine", "dask")),
                   options=options, input=record.get("input") or {}, output=record.get("output") or {},
                   partitions=tuple(record.get("partitions") or ()),
                   computed=tuple(record.get("computed") or ()), reused=tuple(record.get("reused") or ()),
                   phases=record.get("phases") or {},
                   stages=record.get("stages") or {}, summary=record.get("summary") or {},
                   versions=record.get("versions") or {}, finished=str(record.get("finished")),
                   incremental=record.get("incremental"), memory_budget=record.get("memory_budget"),
                   pieces=record.get("pieces"))
