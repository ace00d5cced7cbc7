""":func:`select_table`: the one door from a table URI to a table URI (parquet, Delta, Iceberg), with
incremental runs, on Dask or on Spark (what ``datamask select`` runs). The run itself is
:func:`datamask_dask.run.protocol.execute`; a Dask frame already in hand goes through
:func:`datamask_dask.run.selection.write_selection`."""

from __future__ import annotations

import dataclasses
import importlib
import time

from ..config import normalise_keys, resolve_options
from ..dask_engine.runs import DaskEngine
from ..errors import OptionError
from ..io.storage import input_fingerprint, resolve
from ..io.tables import (
    SelectionOnly,
    open_sink,
    parse_table_uri,
    pieces_frame,
    pieces_version,
    table_pieces,
    table_record,
)
from ..partition import adapters
from .protocol import execute
from .record import RunRecord
from .summary import SAMPLE_ROWS

OUTPUT_COLUMNS = ("all", "selection")
ENGINES = ("dask", "spark")


@dataclasses.dataclass(frozen=True)
class TableRunReport:
    """Outcome of :func:`select_table`: the output written, what was read, the run record, and the
    partitions computed and those taken from an interrupted run."""

    output: str
    rows: int
    selected: int
    run_id: str
    source: dict
    written: dict
    record: dict
    seconds: float
    computed: tuple = ()
    reused: tuple = ()


def select_table(input_uri, output_uri, ratio=None, *, output_columns: str = "all", mode: str = "error",
                 incremental: bool = False, config=None, engine: str = "dask", scheduler=None, spark=None,
                 row_filter=None, single_file: bool = False, catalog_properties=None, storage_options=None,
                 progress: bool | None = None, summary_rows: int = SAMPLE_ROWS, resume: bool = True,
                 prepare=None, backend: str = "pandas", **options) -> TableRunReport:
    """Read a table URI, select (:func:`~datamask_dask.datamask_select`), write to a table URI.

    The run record, with its summary (see :mod:`datamask_dask.run.summary`), goes into the
    output: the commit's metadata (Delta), the snapshot's summary (Iceberg), or
    ``_datamask_run.json`` (parquet).

    Parameters
    ----------
    input_uri, output_uri : str or path
        Table URIs (see :mod:`datamask_dask.io.tables`).
    ratio, config, **options
        As for :func:`~datamask_dask.datamask_select`.
    output_columns : {"all", "selection"}
        Every column plus ``selected`` (and the score), or the selection table only: id,
        ``selected``, the score column if asked, ``run_id``.
    engine : {"dask", "spark"}
        ``"dask"``: the input is read into a Dask DataFrame and run on ``scheduler`` (Dask's default:
        the current client, or threads). ``"spark"``: each piece of the input is read by the Python
        worker of its Spark task, on the session ``spark`` (None: the active one, or a local one; a
        function: the session it returns, called once the output and the input are checked;
        ``datamask_spark.files``), and writes the same output in any output format.
    single_file : bool
        A parquet output written as one file rather than a directory (Dask).
    mode : {"error", "append", "overwrite"}
        ``"error"``: the output may not exist. ``"append"`` (Delta and Iceberg) and ``"overwrite"``
        write into an output only when datamask wrote it (:mod:`datamask_dask.io.output`).
    incremental : bool
        Select only among the rows added to the input (Delta or Iceberg, appended to only)
        since the version/snapshot recorded by the output's newest run, and append them to the
        output; earlier selections stay as they are. With no earlier run, the whole input is
        selected (and written with ``mode``). With no new rows nothing is written.
    row_filter : str, optional
        Iceberg input only: rows to consider, pushed down.
    progress : bool, optional
        Progress bar on stderr (see :mod:`datamask_dask.progress`); by default only where watched.
    summary_rows : int
        Rows sampled (stratified by partition) for the run summary's comparison with quality
        top-k and random; 0 skips it.
    resume : bool
        Reuse the partitions an interrupted run of the same job finished (same input, options and
        output, the output unchanged since; see :mod:`datamask_dask.run.work`). ``False`` computes
        every partition again.
    catalog_properties, storage_options : dict, optional
        Iceberg catalog properties; the storage options of the input and output (fsspec's for
        parquet paths, deltalake's for Delta tables).
    prepare : callable, optional
        A function of the input's Dask DataFrame that gives the frame to select from (the CLI's
        ``--text-column`` computes the embedding and quality columns the input lacks).
    backend : {"pandas", "cudf"}
        ``"cudf"``: a parquet input is read into cuDF partitions on the GPU, where the job then learns
        with ``device="auto"`` (:func:`~datamask_dask.io.tables.read_table`).

    Returns
    -------
    TableRunReport
    """
    start = time.perf_counter()
    normalise_keys(options, "keyword arguments")  # a misspelt or misplaced one before the output is looked at
    if output_columns not in OUTPUT_COLUMNS:
        raise OptionError(f"output_columns must be one of {OUTPUT_COLUMNS}, not {output_columns!r}")
    if engine not in ENGINES:
        raise OptionError(f"engine must be one of {ENGINES}, not {engine!r}")
    source_uri, target = parse_table_uri(input_uri), parse_table_uri(output_uri)
    if engine == "spark":
        _spark_can_run(single_file, prepare, backend)
    since, previous = None, None
    if incremental:
        if source_uri.format == "parquet":
            raise OptionError("an incremental run needs a Delta or Iceberg input (it is keyed on their "
                              "versions)")
        recorded = table_record(target, catalog_properties=catalog_properties,
                                storage_options=storage_options)
        previous = None if recorded is None else RunRecord.from_dict(recorded)
        if previous is not None:
            seen = previous.input
            if seen.get("table") != list(source_uri.key):
                raise OptionError(f"the output {target.uri} was made from {seen.get('uri')}, not "
                                  f"{source_uri.uri}: an incremental run continues the runs of the same "
                                  "input")
            if mode == "overwrite":
                raise OptionError("an incremental run appends to its output; mode='overwrite' would drop the "
                                  "earlier selections (run without incremental to select the whole input "
                                  "again)")
            since = seen.get("version")
            mode = "append"
            if ratio is None and not options and config is None:
                ratio = previous.options.ratio
    sink = open_sink(target, mode=mode, inputs=[source_uri], catalog_properties=catalog_properties,
                     storage_options=storage_options, single_file=single_file)
    sink.check()  # before the input is read, or its text embedded
    # a parquet input's files, as a resume must find them (Delta and Iceberg inputs name their version)
    fingerprint = input_fingerprint(resolve(source_uri.location, storage_options)) \
        if source_uri.format == "parquet" else None
    output = {"columns": output_columns, "mode": mode, "single_file": single_file}  # as write_selection's
    # the input's pieces, listed once: each engine reads a piece a partition, in its own tasks
    pieces = table_pieces(source_uri, row_filter=row_filter, since=since,
                          catalog_properties=catalog_properties, storage_options=storage_options)
    described = {**pieces.source, "uri": source_uri.uri, "format": source_uri.format,
                 "version": pieces_version(pieces),
                 "since": since, "location": str(input_uri), "table": list(source_uri.key),
                 "row_filter": row_filter}
    if since is not None and not len(pieces):  # nothing added since the last run: nothing to write
        return TableRunReport(target.uri, 0, 0, "", described, {}, {}, time.perf_counter() - start)
    if engine == "spark":
        resolved = resolve_options(config, ratio=ratio, **options)
        project = SelectionOnly.of(resolved) if output_columns == "selection" else None
        run, starting = _spark_engine(spark, pieces, resolved, project)
        start += starting  # a session started here is start-up, as a Dask cluster's is
        described["read_by"] = "workers"
    else:
        frame = pieces_frame(pieces, source_uri, backend)
        frame = frame if prepare is None else prepare(frame)
        resolved = resolve_options(config, ratio=ratio, backend=adapters.backend(frame._meta), **options)
        project = SelectionOnly.of(resolved) if output_columns == "selection" else None
        # the listed size of what is read (text columns computed from it are held already)
        nbytes = sum(pieces.nbytes) if pieces.nbytes is not None and prepare is None else None
        rows = sum(pieces.rows) if pieces.rows is not None else None
        run = DaskEngine(frame, resolved, scheduler=scheduler, project=project, nbytes=nbytes, rows=rows)
    outcome = execute(run, sink, resolved, resume=resume, summary_rows=summary_rows, project=project,
                      source=described, output=output, fingerprint=fingerprint,
                      incremental=None if previous is None else {"since": since,
                                                                 "previous_run": previous.run_id},
                      progress=progress)
    record = outcome.record
    return TableRunReport(target.uri, record["rows"], record["selected"], record["run_id"], described,
                          outcome.written, record, time.perf_counter() - start, outcome.computed,
                          outcome.reused)


def _spark_can_run(single_file: bool, prepare, backend: str) -> None:
    """Refuse, by name, what the Spark engine does not do (it selects from the input's pieces as they
    are, and writes through the same sinks: a parquet directory, a Delta or an Iceberg table)."""
    refused = [what for bad, what in [
        (single_file, "single_file=True"), (prepare is not None, "prepare (text columns)"),
        (backend != "pandas", f"backend={backend!r}")] if bad]
    if refused:
        raise OptionError(f"the Spark engine selects from the input as it is: {', '.join(refused)} needs "
                          "the Dask engine")


def _spark_engine(spark, pieces, options, project):
    """Spark as the run's engine over the input's ``pieces`` (``datamask_spark.files.files_engine``), on
    ``spark`` (or the session it returns) or else the active Spark session or a local one, and the
    seconds a session took to start here; the engine is found by name, as the Spark integration builds
    on this package."""
    try:
        files = importlib.import_module("datamask_spark.files")
        job = importlib.import_module("datamask_spark.job")
    except ImportError as exc:
        raise OptionError("engine='spark' needs pyspark: pip install 'datamask-dask[spark]'") from exc
    started = time.perf_counter()
    session = spark() if callable(spark) else spark or job.get_spark()
    starting = time.perf_counter() - started
    return files.files_engine(session, pieces, options, project=project), starting
