"""One run: a selection carried from its source to its sink, resumably and all or nothing.

:func:`execute` is the only place a run is planned, written, marked, resumed, summarised, recorded
and committed, for every engine (:class:`Engine`: Dask, Spark) and every sink
(:mod:`datamask_dask.io.sinks`: parquet directory or file, Delta, Iceberg)::

    check the output -> lock it -> plan (validates the input) -> open the work area (resume?)
    -> tasks: select, summarise, write through the sink, mark finished
    -> summary -> run record -> the sink's commit -> remove the work area

The lock (:func:`~datamask_dask.io.output.output_lock`) is held from the plan to the commit, so a
second run on the same output refuses at once instead of interleaving.

The run record, the same for every engine and sink, goes where each output keeps metadata:
``_datamask_run.json`` in a parquet directory (with the files it lists), the ``datamask.run``
footer key of a single parquet file, a Delta commit's custom metadata, an Iceberg snapshot's
summary. ``check_target`` recognises an output of ours by it, and
:class:`~datamask_dask.run.summary.RunSummary` and the report read it back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd
import pyarrow as pa

from .. import telemetry
from ..config import default_settings
from ..io.output import library_versions, output_lock
from ..io.records import as_json, dumps
from ..options import SelectOptions
from ..plan.reduce import plan_warnings
from ..plan.types import Plan
from ..telemetry import Measures
from .record import RunRecord
from .summary import SAMPLE_ROWS, part_summary, sample_columns, signature_share, summarise_run
from .work import WorkArea, now, open_work

if TYPE_CHECKING:  # the spec travels inside the plan; the run only reads it
    from ..partition.spec import SelectSpec

log = logging.getLogger(__name__)

# Settings that change how a run checks its input, not what it selects.
_NOT_IN_IDENTITY = ("check_ids", "validate")
# The optional libraries a run record names the versions of, where its engine or its sink uses them.
_LIBRARIES = {"spark": "pyspark", "delta": "deltalake", "iceberg": "pyiceberg"}


class Engine(Protocol):
    """What runs a selection's tasks: :class:`datamask_dask.dask_engine.runs.DaskEngine`,
    :class:`datamask_spark.writer.SparkEngine`."""

    name: str

    @property
    def input_schema(self) -> pa.Schema:
        """The input's Arrow schema, as the selection reads it (the run record's input columns)."""

    def plan(self, progress: bool | None) -> Plan:
        """The quota plan (the pass that validates the input)."""

    def schema(self, plan: Plan) -> pa.Schema:
        """The output's Arrow schema."""

    def run(self, plan: Plan, todo: list[int], task: PartTask,
            progress: bool | None) -> tuple[list[dict], dict[int, Measures]]:
        """Select partitions ``todo`` and hand each to ``task`` with its measures: the markers ``task``
        returned, and what learning each pack it learned measured (pack index -> measures), once each."""


@dataclasses.dataclass(frozen=True)
class PartTask:
    """What a task does with its selected partition: summarise it, write it through the sink's
    writer, mark it finished in the work area. Picklable: it travels to the workers."""

    work: WorkArea
    write: Callable[[Any, int], dict | None]  # the sink's writer: (frame, number) -> descriptor
    spec: SelectSpec
    share: float  # of the selected rows' signatures kept for the summary
    sample_rows: int  # rows of this partition sampled for the summary
    seed: int
    # (frame, run_id) -> the columns written (the selection-only output), or None
    project: Callable[[Any, str], Any] | None = None
    token_column: str | None = None  # counted in the summary where the table has it

    def __call__(self, frame, number: int, measures: Measures) -> dict:
        """``frame``: the partition with the selection's columns (pandas, cuDF or Arrow); ``measures``:
        what selecting it measured, which the marker returned carries with the write's seconds."""
        rows = frame
        if isinstance(frame, pa.Table):  # the summary reads a few columns as pandas
            names = [n for n in (*sample_columns(self.spec), self.spec.by, self.token_column)
                     if n is not None and n in frame.column_names]
            rows = frame.select(list(dict.fromkeys(names))).to_pandas(types_mapper=pd.ArrowDtype)
        part = part_summary(rows, number, self.spec, self.sample_rows, self.seed, self.share,
                            self.token_column, measures.curves)
        sample = part.pop("sample")
        with measures.timed("write"):
            if self.project is not None:
                frame = self.project(frame, self.work.run_id)
            written = self.write(frame, number)
            marker = {"partition": number, "rows": part.pop("rows"), "selected": part.pop("selected"),
                      "written": written, "summary": part}
            self.work.mark(number, marker, sample)
        return {**marker, "sample": sample, "stages": measures.stages}


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What :func:`execute` did: the run record (as the output keeps it), the sink's commit result,
    the partitions computed and reused, the driver's phases (the record's and the commit after it)
    and the whole call's seconds."""

    record: dict
    written: dict
    computed: tuple
    reused: tuple
    phases: dict
    seconds: float


def execute(engine: Engine, sink, options: SelectOptions, *, resume: bool = True,
            summary_rows: int = SAMPLE_ROWS, source: dict | None = None, output: dict | None = None,
            fingerprint=None, incremental: dict | None = None, project=None,
            progress: bool | None = None) -> RunOutcome:
    """Run a selection on ``engine`` into ``sink`` (see the module notes).

    Parameters
    ----------
    options : SelectOptions
        The options after profile and config (recorded as ``settings``, and part of the run's identity).
    resume : bool
        Reuse the partitions an interrupted run of the same job finished; False starts afresh.
    source, output : dict
        What the run record says about the input and the output (``output`` is part of the
        identity a resumed run must match).
    fingerprint : JSON-able, optional
        Extra identity of the input (e.g. its files' names, sizes and modification times).
    project : callable, optional
        ``(frame, run_id) -> frame``: the columns written, where not every column is.
    """
    start = time.perf_counter()
    settings = options.to_dict()
    sink.check()  # before anything is computed
    with output_lock(sink.location):
        sink.check()  # as it is now that we hold the lock
        log.info("planning %s: checking the input, near-duplicates and quotas", sink.uri)
        plan = engine.plan(progress)
        phases = {"plan": time.perf_counter() - start}
        spec, schema, newest = plan.spec, engine.schema(plan), sink.newest_run()
        identity = as_json({
            "settings": {k: v for k, v in settings.items() if k not in _NOT_IN_IDENTITY},
            "input": {"partitions": len(plan.rows),
                      "columns": {f.name: str(f.type) for f in engine.input_schema},
                      "rows": list(plan.rows), "content": _hash(list(plan.digests)),
                      "fingerprint": fingerprint},
            # An append continues the output's state; a whole output is replaced whatever it holds (so
            # whether it may be replaced is not the job's identity: a rerun with --overwrite resumes).
            "output": {**{k: v for k, v in (output or {}).items() if k != "mode"}, "format": sink.format,
                       "after": newest if (output or {}).get("mode") == "append" else None},
            "plan": _hash(plan.identity()),
        })
        work, manifest = open_work(sink.location, identity, resume=resume, committed=newest,
                                   defaults=as_json(default_settings()))
        done = work.finished(list(plan.rows), lambda descriptor: sink.holds(work, descriptor))
        todo = [number for number in range(len(plan.rows)) if number not in done]
        log.info("planned %s: %d rows in %d partition(s) (%.1f s)", sink.uri, sum(plan.rows), len(plan.rows),
                 phases["plan"])
        for said in plan_warnings(plan):  # an unknown group is legitimate in a filtered or incremental input
            log.warning("%s: %s", sink.uri, said)
        if done:
            log.info("resuming the unfinished run on %s: %d finished partition(s) reused, %d to compute",
                     sink.uri, len(done), len(todo))
        manifest["runs"].append({"started": now(), "computed": todo, "reused": sorted(done)})
        work.write_manifest(manifest)

        seed = int(options.learner.seed or 0)
        task = PartTask(work, sink.writer(work), spec, signature_share(plan),
                        math.ceil(summary_rows / max(len(plan.rows), 1)), seed, project, options.token_column)
        started = time.perf_counter()
        try:
            returned, packs = engine.run(plan, todo, task, progress) if todo else ([], {})
        except BaseException:
            if not work.any_finished():  # nothing to resume: leave nothing behind
                sink.abort(work)
                work.remove()
            raise
        phases["select and write"] = time.perf_counter() - started
        markers = {**{m["partition"]: m for m in returned}, **done}
        parts = [markers[number] for number in range(len(plan.rows))]
        # a pack's curves with its first member's (as a partition's own: at most MAX_CURVES)
        pack_curves: dict[int, list] = {}
        for index, measures in sorted(packs.items()):
            pack_curves.setdefault(plan.packs[index].partitions[0], []).extend(measures.curves)

        started = time.perf_counter()
        summary = summarise_run([{**p["summary"], "partition": p["partition"], "rows": p["rows"],
                                  "sample": p["sample"],
                                  "curves": [*p["summary"].get("curves", []),
                                             *pack_curves.get(p["partition"], [])][:telemetry.MAX_CURVES]}
                                 for p in parts], spec, token_column=options.token_column,
                                sample_rows=summary_rows, seed=seed)
        phases["summary"] = time.perf_counter() - started
        libraries = [_LIBRARIES[name] for name in (engine.name, sink.format) if name in _LIBRARIES]
        record = RunRecord(
            run_id=work.run_id, engine=engine.name, options=options,
            input={**(source or {}), **identity["input"]},  # with its partitions' rows and digest
            output={**(output or {}), "uri": sink.uri, "format": sink.format},
            partitions=tuple({k: p[k] for k in ("partition", "rows", "selected")} for p in parts),
            computed=tuple(todo), reused=tuple(sorted(done)), phases=phases,
            stages=telemetry.add_up([plan.stages, *(markers[n].get("stages", {}) for n in todo),
                                     *(measures.stages for measures in packs.values())]),
            summary=summary, versions=library_versions(*libraries), finished=now(), incremental=incremental,
            memory_budget=spec.memory_budget, pieces=plan.pieces).to_dict()
        started = time.perf_counter()
        written = sink.commit(work, manifest, [p["written"] for p in parts], schema, record)
        work.remove()
        phases["commit"] = time.perf_counter() - started
    log.info("committed %s: %d rows, %d selected (%.1f s in all)", sink.uri, record["rows"],
             record["selected"], time.perf_counter() - start)
    return RunOutcome(record, written, tuple(todo), tuple(sorted(done)), phases, time.perf_counter() - start)


def _hash(value) -> str:
    return hashlib.blake2b(dumps(value).encode(), digest_size=16).hexdigest()
