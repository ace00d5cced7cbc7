"""Resumable, atomic selection runs: :func:`write_selection` (what ``datamask select`` runs).

A run over ``OUT`` keeps its work in a hidden sibling directory until it is complete::

    .OUT.datamask-work/                 (next to OUT, never inside it)
        manifest.json                   options, seed, input fingerprint, quota plan digest, run log
        part-00042.parquet              partition 42 with ``selected``: complete and fsynced
        part-00042.done                 its completion marker (JSON: rows, selected, bytes, run id)
        part-00042.parquet.tmp-<hex>    a part being written (ignored; gone with the directory)

- **Markers.** Each partition's task writes its part under a temporary name, fsyncs it, renames
  it into place, then writes its ``.done`` marker the same way (and fsyncs the directory). A
  marker therefore only ever names a complete part. A task that runs twice (a worker died after
  writing, the task was retried) writes the same bytes again: the selection is deterministic.
- **Resume.** Running again with the same output finds the work directory, checks that the
  options, the input and the quota plan are those of the manifest, and recomputes only the
  partitions without a valid marker (marker readable, same run id, row count as planned, part
  file present with the recorded size and rows). Anything else in the manifest refuses with a
  :class:`ResumeError` that names what changed. The plan is computed again (it is cheap, and it
  re-validates the input) and must hash to the recorded digest; the input fingerprint combines
  each partition's content digest from the plan pass (ids, quality, tokens, groups, embedding
  norms and projections) with an optional caller-given fingerprint (``datamask select`` passes
  the input files' names, sizes and modification times, which covers the other columns).
- **Commit.** When every partition has its marker, the parts are hard-linked (copied where links
  are not possible) into a hidden staging directory as ``part.N.parquet`` (or streamed into one
  file), which is fsynced and renamed onto ``OUT``; an existing ``OUT`` is renamed aside first
  and removed after. Readers never see a partial output, and a run that fails leaves any
  previous ``OUT`` as it was. The work directory is removed last.

Safety (:mod:`datamask_dask.io.output`): the output may not overlap the input, ``overwrite``
replaces only an output of an earlier datamask run (it carries a run record,
``_datamask_run.json`` or a ``datamask.run`` footer key: options, seed, versions, input, rows,
stage times), and a second run on the same output refuses while the first holds its lock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import dask
import pyarrow as pa
import pyarrow.parquet as pq

from .. import progress as progress_bars
from .. import telemetry
from ..config import default_settings, load_config
from ..dask_engine.operator import compute_plan, partitions, selection_spec
from ..errors import DataMaskError
from ..partition import adapters
from ..partition.select import select_partition
from ..plan.types import Plan
from .output import (
    FOOTER_KEY,
    MANIFEST,
    RUN_RECORD,
    check_target,
    committing,
    library_versions,
    output_lock,
    publish,
    publish_objects,
    remove_own,
    staging_path,
    work_location,
)
from .parquet import concatenate, to_arrow, write_table
from .records import as_json, dumps, plain
from .storage import Location, fsync_dir, resolve
from .summary import SAMPLE_ROWS, RunSummary, partition_summary, signature_share, summarise_run

log = logging.getLogger(__name__)

FORMAT = 1  # version of the work directory layout
# Settings that change how a run checks its input, not what it selects.
_NOT_IN_FINGERPRINT = ("check_ids", "validate")


class ResumeError(DataMaskError):
    """An unfinished run's work directory does not match this run (options or input changed)."""


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
        Wall seconds of the driver's phases: ``plan``, ``select and write``, ``commit``.
    stages : dict
        Worker seconds summed over tasks, per stage (:mod:`datamask_dask.telemetry`): ``plan read``,
        ``plan check``, ``read``, ``select`` (of which ``extract`` and ``learn``), ``write``.
    record : dict
        The run record kept with the output (:mod:`datamask_dask.io.output`): settings after
        profile and config (``record["profile"]`` names the profile), versions, input, counts.
    summary : RunSummary
        The same record as an object (:class:`datamask_dask.io.summary.RunSummary`): objective vs
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


def work_dir(path: str | os.PathLike) -> Path:
    """The work directory of a run writing to the local ``path``: a hidden sibling of it
    (:func:`~datamask_dask.io.output.work_location` for any URI)."""
    return Path(work_location(resolve(path)).path)


def write_selection(ddf, path: str | os.PathLike, ratio=None, *, config=None, overwrite: bool = False,
                    resume: bool = True, single_file: bool = False, scheduler=None,
                    input_fingerprint=None, input_location=None, progress: bool | None = None,
                    summary_rows: int = SAMPLE_ROWS, storage_options: dict | None = None,
                    **options) -> SelectionReport:
    """Select rows (as :func:`~datamask_dask.datamask_select`) and write the result, resumably.

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
    path : str or path
        Output directory (``part.N.parquet`` per non-empty partition), or file with
        ``single_file``: a local path or a URI (``s3://bucket/out/``, see
        :mod:`datamask_dask.io.storage`). It appears only once complete (on an object store:
        its run record, written last, is what marks it complete).
    ratio, config, **options
        As for :func:`~datamask_dask.datamask_select` (``memory_budget``, ``validate``...).
    overwrite : bool
        Replace ``path`` if it exists and an earlier datamask run wrote it (only once the new
        output is complete; see :mod:`datamask_dask.io.output`); otherwise an existing ``path``
        raises before anything is computed.
    resume : bool
        Reuse the finished partitions of an interrupted run on the same ``path`` (see the module
        notes). ``False`` discards them and starts again.
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
        Rows of the output sampled for the run summary's objective and near-duplicate figures
        (:mod:`datamask_dask.io.summary`); 0 skips the sample.
    storage_options : dict, optional
        For a URI ``path``: the fsspec filesystem's options (credentials, ``endpoint_url``...).

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
    target = resolve(path, storage_options)
    inputs = [input_location] if input_location is not None else []
    check_target(target, overwrite=overwrite, inputs=inputs)
    with output_lock(target):
        check_target(target, overwrite=overwrite, inputs=inputs)  # as it is now that we hold the lock
        return _write_selection(ddf, target, ratio, config, resume, single_file, scheduler, input_fingerprint,
                                input_location, options, progress, summary_rows)


def _write_selection(ddf, target: Location, ratio, config, resume, single_file, scheduler, input_fingerprint,
                     input_location, options, progress=None, summary_rows=SAMPLE_ROWS) -> SelectionReport:
    start = time.perf_counter()
    work = work_location(target)
    manifest = read_manifest(work) if resume or committing(target) is not None else None
    settings = load_config(config, ratio=ratio, backend=adapters.backend(ddf._meta), **options)
    spec = selection_spec(ddf, ratio, config=config, scheduler=scheduler, **options)
    plan = compute_plan(ddf, spec, scheduler=scheduler, progress=progress)  # validates the input
    phases = {"plan": time.perf_counter() - start}
    record = _record(ddf, settings, spec, plan, input_fingerprint)
    if manifest is not None:
        _check_same_run(manifest, record, target, work)
    else:
        work.remove()  # our hidden work directory: a stale one without a manifest, or resume=False
        work.makedirs()
        manifest = {**record, "format": FORMAT, "run_id": uuid.uuid4().hex, "runs": []}
    done = finished_partitions(work, manifest, plan.rows)
    todo = [i for i in range(ddf.npartitions) if i not in done]
    log.info("planned %s: %d rows in %d partitions (%.1f s)", target.uri, sum(plan.rows), len(plan.rows),
             phases["plan"])
    if done:
        log.info("resuming the unfinished run on %s: %d finished partition(s) reused, %d to compute",
                 target.uri, len(done), len(todo))
    manifest["runs"].append({"started": _now(), "computed": todo, "reused": sorted(done)})
    _write_json(work.child(MANIFEST), manifest)

    markers, computed = dict(done), []
    started = time.perf_counter()
    if todo:
        # One task per partition selects and writes it behind its read, so a worker holds one
        # partition at a time and nothing but a marker travels back. The partitions are those the
        # plan pass read (operator.partitions).
        plan_node = dask.delayed(plan, traverse=False, name=f"datamask-plan-{manifest['run_id']}")
        parts = partitions(ddf)
        columns = (settings.get("by"), settings.get("token_column"))
        tasks = [dask.delayed(_select_and_write, pure=True)(
            parts[number], plan_node, number, work, manifest["run_id"], columns,
            dask_key_name=(f"datamask-select-write-{manifest['run_id']}", number)) for number in todo]
        try:
            written = progress_bars.compute(*tasks, scheduler=scheduler, progress=progress)
        except BaseException:
            if not any(name.endswith(".done") for name in work.list()):  # nothing to resume or refuse
                work.remove()
            raise
        for marker in written:
            computed.append(marker.pop("stages"))
            markers[int(marker["partition"])] = as_json(marker)  # as a resumed run reads it
    phases["select and write"] = time.perf_counter() - started
    manifest["runs"][-1]["finished"] = _now()
    _write_json(work.child(MANIFEST), manifest)

    files = [work.child(markers[i]["file"]) for i in sorted(markers) if markers[i]["file"]]
    empty = _empty_table(ddf, spec) if not files else None
    started = time.perf_counter()
    summary = summarise_run(files, markers, settings, plan.spec, sample_rows=summary_rows,
                            seed=int(settings.get("seed") or 0))
    phases["summary"] = time.perf_counter() - started
    report = SelectionReport(target.uri, sum(m["rows"] for m in markers.values()),
                             sum(m["selected"] for m in markers.values()), tuple(todo), tuple(sorted(done)),
                             time.perf_counter() - start, phases,
                             telemetry.add_up([plan.stages, *computed]))
    started = time.perf_counter()
    record = run_record(report, settings, manifest, markers, input_location, summary)
    if target.local:
        commit([Path(f.path) for f in files], Path(target.path), single_file=single_file, empty=empty,
               record=record)
    else:
        commit_objects(files, target, work, manifest, single_file=single_file, empty=empty, record=record)
    work.remove()
    phases["commit"] = time.perf_counter() - started
    log.info("committed %s: %d rows, %d selected (%.1f s in all)", target.uri, report.rows, report.selected,
             time.perf_counter() - start)
    return dataclasses.replace(report, seconds=time.perf_counter() - start, record=record,
                               summary=RunSummary(record))


# --------------------------------------------------------------------------- manifest


def read_manifest(work) -> dict | None:
    """The manifest of an unfinished run, or None when there is none (or it is unreadable)."""
    try:
        manifest = json.loads(resolve(work).child(MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def _record(ddf, settings: Mapping, spec, plan: Plan, input_fingerprint) -> dict:
    """What identifies a run: its options and its input (as the manifest stores them)."""
    options = {k: v for k, v in settings.items() if k not in _NOT_IN_FINGERPRINT}
    return as_json({
        "settings": options,
        "memory_budget": spec.memory_budget,
        "input": {
            "partitions": ddf.npartitions,
            "columns": {str(c): str(t) for c, t in ddf._meta.dtypes.items()},
            "rows": list(plan.rows),
            "content": _hash(list(plan.digests)),
            "fingerprint": input_fingerprint,
        },
        "plan": _hash(plan.identity()),
    })


def _record_bytes(value) -> bytes:
    return dumps(value, indent=1).encode()


def _hash(value) -> str:
    text = dumps(value)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _check_same_run(manifest: dict, record: dict, target: Location, work: Location) -> None:
    """Refuse to resume into a run started with other options or on another input."""
    hint = (f"Run again with the original options and input to resume, pass resume=False (--no-resume) "
            f"to discard the finished partitions in {work}, or write to another output than {target}.")
    old, new = manifest["settings"], record["settings"]
    defaults = as_json(default_settings())  # a setting added since the run started had its default
    changed = sorted(k for k in set(old) | set(new)
                     if old.get(k, defaults.get(k)) != new.get(k, defaults.get(k)))
    if changed:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:8])
        raise ResumeError(f"cannot resume the unfinished run on {target}: it was started with other "
                          f"options ({shown}). {hint}")
    old, new = manifest["input"], record["input"]
    keys = ("partitions", "columns", "rows", "content", "fingerprint")
    changed = [k for k in keys if old.get(k) != new.get(k)]
    if changed:
        raise ResumeError(f"cannot resume the unfinished run on {target}: the input changed since it "
                          f"started (different {', '.join(changed)}). {hint}")
    if manifest["plan"] != record["plan"]:
        raise ResumeError(f"cannot resume the unfinished run on {target}: the quota plan differs from the "
                          f"one it started with although options and input match. {hint}")


def finished_partitions(work, manifest: dict, rows: list[int]) -> dict[int, dict]:
    """Partitions with a valid completion marker: ``{partition: marker}``."""
    work, done = resolve(work), {}
    present = set(work.list())
    for number, n_rows in enumerate(rows):
        if f"{part_stem(number)}.done" not in present:
            continue
        try:
            marker = json.loads(work.child(f"{part_stem(number)}.done").read_bytes())
        except (OSError, ValueError):
            continue
        if marker.get("run_id") != manifest["run_id"] or marker.get("rows") != n_rows:
            continue
        if marker.get("file"):
            part = work.child(marker["file"])
            try:
                if part.size() != marker["bytes"] or _parquet_rows(part) != n_rows:
                    continue
            except (OSError, pa.ArrowException):
                continue
        done[number] = marker
    return done


# --------------------------------------------------------------------------- parts and markers


def _parquet_rows(part: Location) -> int:
    return pq.ParquetFile(part.path, filesystem=None if part.local else part.fs).metadata.num_rows


def part_stem(number: int) -> str:
    return f"part-{number:05d}"


def _select_and_write(frame, plan: Plan, number: int, work: Location, run_id: str,
                      columns=(None, None)) -> dict:
    """Select partition ``number`` of the table and write it; its marker, with this task's stage seconds."""
    telemetry.take_curves()  # curves left on this thread by other work are not this partition's
    with telemetry.timed("select"):
        selected = select_partition(frame, plan, {"number": number})
    # Group counts, tokens and learning curves for the run summary (datamask_dask.io.summary).
    summary = partition_summary(selected, plan.spec.selected_column, *columns,
                                embedding_column=plan.spec.embedding_column, number=number,
                                share=signature_share(plan))
    with telemetry.timed("write"):
        marker = write_part(selected, work, number, run_id, plan.spec.selected_column, summary)
    # This thread's stage seconds since the last take: the read fused in front of this task too.
    return {**marker, "stages": telemetry.take()}


def write_part(frame, work, number: int, run_id: str, selected_column: str, summary=None) -> dict:
    """Write one partition's part file and then its completion marker (each whole: see
    :meth:`~datamask_dask.io.storage.Location.write_bytes`; fsynced on local disk).

    Returns
    -------
    dict
        The marker: ``partition``, ``rows``, ``selected``, ``file`` (None for an empty
        partition), ``bytes``, ``run_id``, and ``summary`` (the part's run-summary figures).
    """
    work = resolve(work)
    rows = len(frame)
    selected = int(adapters.host_values(frame, selected_column).sum()) if rows else 0
    marker = {"partition": number, "rows": rows, "selected": selected, "file": None, "bytes": 0,
              "run_id": run_id, "summary": summary or {}}
    if rows:
        part = work.child(f"{part_stem(number)}.parquet")
        with part.open_write() as handle:
            _write_frame(frame, handle)
        marker.update(file=part.name, bytes=part.size())
    _write_json(work.child(f"{part_stem(number)}.done"), marker)
    return marker


def _write_frame(frame, handle) -> None:
    """A partition as parquet: cuDF's own GPU writer for cuDF frames (nothing goes through the host)."""
    if adapters.is_cudf(frame):
        frame.to_parquet(handle, index=False)
    else:
        write_table(to_arrow(frame), handle)


def _write_atomic(path: Path, write) -> None:
    """``write(handle)`` into a temporary sibling, fsync it, rename it onto ``path``, fsync the directory."""
    temporary = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        with open(temporary, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    _fsync_dir(path.parent)


def _write_json(path, value: dict) -> None:
    """``value`` as JSON, written whole (``path``: a local Path or a :class:`Location`)."""
    data = _record_bytes(value)
    if isinstance(path, Location):
        path.write_bytes(data)
    else:
        _write_atomic(path, lambda handle: handle.write(data))


def _fsync_dir(path: Path) -> None:
    fsync_dir(os.fspath(path))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# --------------------------------------------------------------------------- commit


def _empty_table(ddf, spec) -> pa.Table:
    """The output schema with no rows (an empty table still gets a file)."""
    import numpy as np

    columns = {spec.selected_column: np.zeros(0, dtype=bool)}
    if spec.score_column:
        columns[spec.score_column] = np.zeros(0, dtype=np.float32)
    if spec.explain:
        from ..partition.explain import meta_columns

        columns.update(meta_columns(ddf._meta, spec.id_column))
    return to_arrow(adapters.with_columns(ddf._meta, columns))


def commit(files: list[Path], target: Path, *, single_file: bool = False,
           empty: pa.Table | None = None, record: dict | None = None) -> None:
    """Publish finished part files as ``target`` in one rename (see the module notes).

    Parameters
    ----------
    files : list of Path
        Part files in partition order; they are linked or copied, not moved.
    target : Path
    single_file : bool
        Stream the parts into one file instead of a directory of ``part.N.parquet``.
    empty : pyarrow.Table, optional
        Schema written when there are no parts.
    record : dict, optional
        The run record: ``_datamask_run.json`` in a directory (with the list of files written
        added), or the ``datamask.run`` footer key of a single file.
    """
    record = dict(record or {})
    staging = staging_path(target)
    try:
        if single_file:
            schema = pq.read_schema(files[0]).remove_metadata() if files else empty.schema
            schema = schema.with_metadata({FOOTER_KEY: _record_bytes(record)})
            _write_atomic(staging, lambda handle: concatenate(files, handle, schema))
        else:
            staging.mkdir()
            names = [f"part.{int(file.stem.split('-')[1])}.parquet" for file in files]
            for file, name in zip(files, names, strict=True):
                _link(file, staging / name)
            if not files:
                names = ["part.0.parquet"]
                _write_atomic(staging / names[0], lambda handle: write_table(empty, handle))
            _write_json(staging / RUN_RECORD, {**record, "files": names})
        publish(staging, target)
        _fsync_dir(target.parent)
    finally:
        remove_own(staging)


def commit_objects(files: list[Location], target: Location, work: Location, manifest: dict, *,
                   single_file: bool = False, empty: pa.Table | None = None,
                   record: dict | None = None) -> None:
    """Publish finished part files as ``target`` on an object store, where nothing can be renamed.

    A single file is one upload: readers see the old object or the new one. A directory is
    complete when its run record exists, so the record goes first when an old output is replaced
    and comes back last, listing the new files, once every part is copied in (server-side). The
    manifest records the old and new file names before anything in ``target`` changes: an
    interrupted commit is finished by the next run on the same output, which removes only names
    the old run record listed.
    """
    record = dict(record or {})
    if single_file:
        schema = (pq.read_schema(_parquet_source(files[0])).remove_metadata() if files else empty.schema)
        schema = schema.with_metadata({FOOTER_KEY: _record_bytes(record)})
        with target.open_write() as handle:
            concatenate([_parquet_source(f) for f in files], handle, schema)
        return
    names = [f"part.{int(f.name.split('-')[1].split('.')[0])}.parquet" for f in files] or ["part.0.parquet"]

    def remember(commit: dict) -> None:  # before target changes: the next run can finish this commit
        manifest["commit"] = commit
        _write_json(work.child(MANIFEST), manifest)

    def write() -> None:
        for file, name in zip(files, names, strict=False):
            file.copy_to(target.child(name))
        if not files:  # an empty table still gets its schema
            with target.child(names[0]).open_write() as handle:
                write_table(empty, handle)

    publish_objects(target, names, write, record, pending=manifest.get("commit"), remember=remember,
                    default=plain)


def _parquet_source(file: Location):
    """What pyarrow's parquet reader opens: a local path, or an open file of the object store."""
    return file.path if file.local else file.fs.open(file.path, "rb")


def run_record(report: SelectionReport, settings: Mapping, manifest: dict, markers: dict,
               input_location, summary: dict | None = None) -> dict:
    """What a finished output keeps about the run that made it (see :mod:`datamask_dask.io.output`)."""
    versions = library_versions()
    per_partition = [{"partition": i, "rows": markers[i]["rows"], "selected": markers[i]["selected"]}
                     for i in sorted(markers)]
    return as_json({
        "format": FORMAT, "tool": "datamask-dask", "kind": "selection", "run_id": manifest["run_id"],
        "finished": _now(), "input": {"location": None if input_location is None else str(input_location),
                                      **manifest["input"]},
        "settings": manifest["settings"], "seed": manifest["settings"].get("seed"),
        "profile": settings.get("profile"), "memory_budget": manifest["memory_budget"],
        "rows": report.rows, "selected": report.selected, "partitions": per_partition,
        "phases": report.phases, "stages": report.stages, "versions": versions, "summary": summary,
    })


def _link(source: Path, destination: Path) -> None:
    try:
        os.link(source, destination)
    except OSError:  # no hard links here (another filesystem): copy, then make it durable
        shutil.copyfile(source, destination)
        with open(destination, "rb") as handle:
            os.fsync(handle.fileno())
