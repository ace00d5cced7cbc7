"""The Dask engine of a run (:func:`datamask_dask.run.protocol.execute`): the plan pass, then one task
per partition that selects it and hands it to the run's part task (summary, write, marker).

One task per partition, fused behind its read: a worker holds one partition at a time and nothing
but a marker travels back. The partitions are those the plan pass read (:func:`.operator.partitions`).

Where the input's size is known (a table's listing, :attr:`datamask_dask.io.pieces.Pieces.nbytes`) and
fits in ``HOLD_SHARE`` of the memory the tasks share (:func:`datamask_dask.plan.memory.memory_room`), the
columns the run reads are read once and held (persisted) through its passes: the plan's scan, its
near-duplicate check, the regions' share pass, the packs and the write each read the table otherwise.
Held partitions are Dask's to spill under memory pressure; a larger input is read pass by pass, so that
no worker ever holds more than the partitions its tasks work on.
"""

from __future__ import annotations

import logging

import dask
import pyarrow as pa

from .. import progress as progress_bars
from ..io.tables import SelectionOnly
from ..options import SelectOptions
from ..partition import adapters
from ..partition.select import PackResult, output_schema, select_partition
from ..partition.spec import SelectSpec
from ..plan.memory import memory_room
from ..plan.types import Plan
from ..telemetry import Measures
from .operator import column_reads, compute_plan, make_spec, pack_graph, partitions

log = logging.getLogger(__name__)

HOLD_SHARE = 0.2  # of the tasks' memory an input may take to be read once and held through the passes


class DaskEngine:
    """Select ``frame`` (a Dask DataFrame) on ``scheduler`` with resolved ``options``
    (:func:`datamask_dask.config.resolve_options`). ``project``: the columns the output keeps where it
    keeps only the selection's (:class:`datamask_dask.io.tables.SelectionOnly`). ``nbytes``: the
    input's size in memory, where known: it is then held through the run's passes if it fits.
    ``rows``: its rows, where known: the near-duplicate search is wired for them."""

    name = "dask"

    def __init__(self, frame, options: SelectOptions, *, scheduler=None,
                 project: SelectionOnly | None = None, nbytes: int | None = None, rows: int | None = None):
        self.source, self.options, self.scheduler, self.project = frame, options, scheduler, project
        self.frame, self.nbytes, self.rows = frame, nbytes, rows  # frame: the source, or it held
        self.routes: dict[int, object] = {}  # what the plan pass routed, for the select pass of its plan
        self.planned: Plan | None = None

    def plan(self, progress: bool | None = None) -> Plan:
        spec = make_spec(self.source, self.options, scheduler=self.scheduler)
        self.frame = self._held(spec, progress)
        self.planned, self.routes = compute_plan(self.frame, spec, scheduler=self.scheduler,
                                                 progress=progress, known_rows=self.rows)  # validates
        return self.planned

    def _held(self, spec: SelectSpec, progress: bool | None):
        """The source's columns this run reads, persisted, where its size is known and fits in
        ``HOLD_SHARE`` of the tasks' memory (on the CPU: a GPU's memory is the learner's); else the
        source, read by each pass."""
        if self.nbytes is None or adapters.is_cudf(self.source._meta):
            return self.source
        room = memory_room(progress_bars.client_of(self.scheduler))  # where the persist below holds it
        if room is None or self.nbytes > HOLD_SHARE * room:
            return self.source
        columns = list(self.source.columns)
        if self.project is not None:
            wanted = {*spec.plan_columns, *spec.select_columns, *self.project.reads(spec, columns)}
            columns = [c for c in columns if c in wanted]
        log.debug("reading the input once, held in memory through the passes: %d MiB", self.nbytes >> 20)
        return progress_bars.persist(self.source[columns], scheduler=self.scheduler, progress=progress)

    @property
    def input_schema(self) -> pa.Schema:
        from ..io.parquet import to_arrow

        return to_arrow(self.source._meta).schema

    def schema(self, plan: Plan) -> pa.Schema:
        schema = output_schema(plan.spec, self.input_schema)
        return schema if self.project is None else self.project(schema.empty_table(), "").schema

    def run(self, plan: Plan, todo: list[int], task,
            progress: bool | None = None) -> tuple[list[dict], dict[int, Measures]]:
        run_id = task.work.run_id
        plan_node = dask.delayed(plan, traverse=False, name=f"datamask-plan-{run_id}")
        spec = plan.spec
        if self.project is None:
            parts = partitions(self.frame)
        else:
            parts = column_reads(self.frame, self.project.reads(spec, self.source.columns), "datamask-read")
        key = f"datamask-select-write-{run_id}"
        routes = self.routes if plan is self.planned else None  # a plan made elsewhere routes its rows
        packs, learned = pack_graph(self.frame, plan, plan_node, todo, routes)
        held = self.frame is not self.source
        tasks = [dask.delayed(_select_part, pure=True)(
            parts[number], plan_node, number, task, packs.get(number, ()), held, dask_key_name=(key, number))
            for number in todo]
        # only the packs' measures travel back, not their rows
        measured = [dask.delayed(_measures, pure=True)(pack, dask_key_name=f"datamask-measures-{pack.key}")
                    for pack in learned.values()]
        try:
            out = progress_bars.compute(*tasks, *measured, scheduler=self.scheduler, progress=progress)
        finally:
            self.frame = self.source  # what was held is let go
        return list(out[:len(tasks)]), dict(zip(learned, out[len(tasks):], strict=True))


def _select_part(frame, plan: Plan, number: int, task, packs=(), held: bool = False) -> dict:
    """Select partition ``number`` of the table (``packs``: the results of the packs it is in) and hand
    it to ``task``, with what it measured (its read included, unless it was ``held``: then the plan
    pass, which read it, counted it); its marker."""
    measures = Measures()
    measures.took(frame, count=not held)  # before the select's clock starts: the read is a stage of its own
    with measures.timed("select"):
        selected = select_partition(frame, plan, {"number": number}, packs, measures)
    return task(selected, number, measures)


def _measures(result: PackResult) -> Measures:
    return result.measures
