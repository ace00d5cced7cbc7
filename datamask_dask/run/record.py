"""The run record: what an output keeps about the run that made it, the same for every engine and sink.

It goes where each output keeps metadata: ``_datamask_run.json`` in a parquet directory (with the
files it lists), the ``datamask.run`` footer key of a single parquet file, a Delta commit's custom
metadata, an Iceberg snapshot's summary. ``check_target`` recognises an output of ours by it, and
:class:`~datamask_dask.run.summary.RunSummary` and the report read it back.
"""

from __future__ import annotations

import dataclasses

from ..io.records import as_json
from .work import FORMAT


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run's record (JSON through :meth:`to_json`).

    Attributes
    ----------
    run_id : str
    engine : str
        ``"dask"`` or ``"spark"``.
    input : dict
        What was read: ``location`` / ``uri``, the format and snapshot where there is one,
        partitions, columns, rows per partition, the content digest.
    output : dict
        What was written: ``uri``, ``format``, ``columns`` (``all`` or ``selection``), ``mode``.
    settings : dict
        The options after profile and config (``seed``, ``profile`` among them).
    rows, selected : int
    partitions : list of dict
        ``partition``, ``rows``, ``selected`` of each.
    computed, reused : list of int
        Partitions this run computed, and those it took from an interrupted run.
    phases : dict
        Wall seconds of the driver's phases: ``plan``, ``select and write``, ``summary``.
    stages : dict
        Worker seconds summed over tasks, per stage (:mod:`datamask_dask.telemetry`).
    summary : dict or None
        The run summary (:mod:`datamask_dask.run.summary`).
    versions : dict
        Versions of the package and the libraries it ran with.
    finished : str
        When the run finished selecting (ISO 8601).
    incremental : dict or None
        For an incremental table run: the version it continued from and the run before it.
    memory_budget : int or None
        The memory budget the user set (it sizes chunks).
    """

    run_id: str
    engine: str
    input: dict
    output: dict
    settings: dict
    rows: int
    selected: int
    partitions: list
    computed: list
    reused: list
    phases: dict
    stages: dict
    summary: dict | None
    versions: dict
    finished: str
    incremental: dict | None = None
    memory_budget: int | None = None

    def to_json(self) -> dict:
        """The record as plain JSON data, with the fields every reader keys on first."""
        return as_json({"format": FORMAT, "tool": "datamask-dask", "kind": "selection",
                        "seed": self.settings.get("seed"), "profile": self.settings.get("profile"),
                        **dataclasses.asdict(self)})
