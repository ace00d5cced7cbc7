""":func:`write_selection`: a selection written as parquet, resumably and atomically (what
``datamask select`` runs). The run itself is :func:`datamask_dask.run.protocol.execute`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..config import resolve_options
from ..dask_engine.operator import require_dask
from ..dask_engine.runs import DaskEngine
from ..io.staging import work_location
from ..io.storage import resolve
from ..io.tables import open_sink, parse_table_uri
from ..partition import adapters
from .protocol import execute
from .summary import SAMPLE_ROWS, RunSummary


@dataclasses.dataclass(frozen=True)
class SelectionReport:
    """Outcome of :func:`write_selection`.

    Attributes
    ----------
    path : str
        The output written.
    rows, selected : int
        Rows written and rows selected.
    computed, reused : tuple of int
        Partitions computed by this run, and partitions taken from an interrupted run.
    seconds : float
        Wall time of the whole call.
    phases : dict
        Wall seconds of the driver's phases: ``plan``, ``select and write``, ``summary``.
    stages : dict
        Worker seconds summed over tasks, per stage (:mod:`datamask_dask.telemetry`): ``plan read``,
        ``plan check``, ``read``, ``select`` (of which ``extract`` and ``learn``), ``write``.
    record : dict
        The run record kept with the output (:mod:`datamask_dask.run.protocol`): settings after
        profile and config (``record["profile"]`` names the profile), versions, input, counts.
    summary : RunSummary
        The same record as an object (:class:`datamask_dask.run.summary.RunSummary`): objective vs
        baselines on a sample, near-duplicates, groups, tokens, learning curves; ``.to_pandas()``.
    """

    path: str
    rows: int
    selected: int
    computed: tuple
    reused: tuple
    seconds: float
    phases: dict = dataclasses.field(default_factory=dict)
    stages: dict = dataclasses.field(default_factory=dict)
    record: dict = dataclasses.field(default_factory=dict)
    summary: RunSummary | None = None


def work_dir(path: str | os.PathLike):
    """The work area of a run writing to the local ``path``: a hidden sibling of it
    (:mod:`datamask_dask.run.work`)."""
    return Path(work_location(resolve(path)).path)


def write_selection(ddf, path: str | os.PathLike, ratio=None, *, config=None, overwrite: bool = False,
                    resume: bool = True, single_file: bool = False, scheduler=None,
                    input_fingerprint=None, input_location=None, progress: bool | None = None,
                    summary_rows: int = SAMPLE_ROWS, storage_options: dict | None = None,
                    catalog_properties: dict | None = None, **options) -> SelectionReport:
    """Select rows (as :func:`~datamask_dask.datamask_select`) and write the result, resumably.

    Each partition's task writes its part and a completion marker into a hidden work area next to
    ``path`` (:mod:`datamask_dask.run.work`); the output appears once every partition is written,
    in one step (:mod:`datamask_dask.io.output`). A run that was interrupted is resumed by running
    it again: only the partitions without a marker are computed.

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
    path : str or path
        Output directory (``part.N.parquet`` per non-empty partition), or file with
        ``single_file``: a local path or a URI (``s3://bucket/out/``, see
        :mod:`datamask_dask.io.storage`). It appears only once complete (on an object store:
        its run record, written last, is what marks it complete). Or a Delta or Iceberg table URI
        (``delta:///path``, ``delta+s3://...``, ``iceberg://CATALOG/ns.table``, see
        :mod:`datamask_dask.io.tables`): every partition's file is added in one commit, with the run
        record.
    ratio, config, **options
        As for :func:`~datamask_dask.datamask_select` (``memory_budget``, ``validate``...).
    overwrite : bool
        Replace ``path`` if it exists and an earlier datamask run wrote it (only once the new
        output is complete; see :mod:`datamask_dask.io.output`); otherwise an existing ``path``
        raises before anything is computed.
    resume : bool
        Reuse the finished partitions of an interrupted run on the same ``path``. ``False``
        discards them and starts again.
    single_file : bool
        Write one parquet file (the partitions' rows in order) instead of a directory.
    scheduler : optional
        Passed to ``dask.compute``: a distributed Client, ``"threads"``, ``"sync"``...
    input_fingerprint : str or JSON-able, optional
        Extra identity of the input recorded in the manifest (e.g. file names, sizes and
        modification times); a resume with another value refuses.
    input_location : str or path, optional
        Where the input lives: recorded in the run record, and ``path`` may not be it, contain it
        or lie inside it.
    progress : bool, optional
        Progress bar of partitions done (:mod:`datamask_dask.progress`); by default only when
        stderr is a terminal or in a notebook.
    summary_rows : int
        Rows sampled, stratified by partition, for the run summary's objective and near-duplicate
        figures (:mod:`datamask_dask.run.summary`); 0 skips the sample.
    storage_options : dict, optional
        For a URI ``path``: the fsspec filesystem's options (credentials, ``endpoint_url``...), or
        deltalake's for a Delta table.
    catalog_properties : dict, optional
        For an Iceberg table: its catalog's properties (``uri``, ``warehouse``...), as pyiceberg's
        ``load_catalog`` takes them.

    Returns
    -------
    SelectionReport

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is False.
    UnsafeOutputError
        ``path`` overlaps the input, exists but was not written by datamask, or another run is
        writing it now.
    ResumeError
        An interrupted run on ``path`` used other options or another input.
    OptionError, InputDataError
        As :func:`~datamask_dask.datamask_select`, before anything is written.
    """
    require_dask(ddf, "write_selection")
    target = parse_table_uri(path)
    sink = open_sink(target, mode="overwrite" if overwrite else "error", inputs=[input_location],
                     catalog_properties=catalog_properties, storage_options=storage_options,
                     single_file=single_file)
    resolved = resolve_options(config, ratio=ratio, backend=adapters.backend(ddf._meta), **options)
    engine = DaskEngine(ddf, resolved, scheduler=scheduler)
    outcome = execute(engine, sink, resolved, resume=resume, summary_rows=summary_rows,
                      source={"location": None if input_location is None else str(input_location)},
                      output={"columns": "all", "single_file": single_file},  # as select_table's
                      fingerprint=input_fingerprint, progress=progress)
    record = outcome.record
    return SelectionReport(target.uri, record["rows"], record["selected"], outcome.computed, outcome.reused,
                           outcome.seconds, outcome.phases, record["stages"], record, RunSummary(record))
