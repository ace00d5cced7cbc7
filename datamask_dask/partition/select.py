"""The select step of one partition: eligible rows, chunks, the learner, ``selected``.

Engine-agnostic: :func:`select_partition` takes a pandas or cuDF frame and the plan of
:mod:`datamask_dask.plan.reduce`; the Dask operator maps it over partitions, the Spark
integration calls it inside ``mapInArrow``. Rows the plan lists as shadowed (near-duplicates of a
better row, ``diversity_scope="table"``) are ineligible: never selected, score ``-inf``; the row
kept for each group stands for it (the plan's ``weights``), which the learner's Facility counts.

Consecutive partitions whose eligible rows of a group fit in one chunk together are learned as
one (a *pack*, :class:`~datamask_dask.plan.types.Pack`): chunks that select apart cover the same
neighbourhoods twice, so small partitions would select worse than the table they make up. Each
member's :func:`pack_rows` hands its eligible rows to :func:`learn_pack`, which learns them exactly
as one partition of those rows (the first member's seed, their quotas summed), and each member's
:func:`select_partition` takes its part of the result.

Every step adds what it measures to the :class:`~datamask_dask.telemetry.Measures` its task passes
in: a pack's go with the pack, a partition's with its selection.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import InputDataError
from ..learn.engine import learn_mask
from ..plan import context, regions
from ..plan.memory import MemoryPlan
from ..plan.quotas import fit_budget, split_budget, split_quota
from ..plan.types import Cell, Plan
from ..telemetry import Measures
from . import adapters, explain
from .checks import check_vectors, group_codes, quality_values, token_values
from .spec import SelectSpec


@dataclass(kw_only=True)
class _Partition:
    """One select task's rows (a partition, or the rows of a pack): its inputs, and the output columns
    its cells fill in."""

    frame: Any  # the partition, pandas or cuDF (None for a pack: its rows were checked where they were read)
    number: int  # the partition (a pack: its first member), which seeds its chunks
    plan: Plan
    source: adapters.EmbeddingRows  # adapters.embedding_source, or _Rows for a pack
    quality: np.ndarray
    tokens: np.ndarray | None
    device: str
    memory: MemoryPlan
    weights: np.ndarray | None  # how many rows each row stands for (near-duplicate groups), or None
    selected: np.ndarray
    scores: np.ndarray | None
    reasons: np.ndarray | None  # explain: each row's reason code (explain.REASONS), set as steps decide
    measures: Measures  # what its steps measure, for its task's result
    place: int | None = None  # a routed pack's (Pack.seed_place), which seeds its chunks
    others: tuple | None = None  # and for Pair_simi, the other packs' planned picks (Plan.others)

    @property
    def spec(self) -> SelectSpec:
        return self.plan.spec

    def token_counts(self) -> np.ndarray:
        """The rows' token counts, which a cell with a token budget reads."""
        if self.tokens is None:
            raise RuntimeError(f"partition {self.number}: a token budget without token counts; please "
                               "report this with the run record")
        return self.tokens


@dataclass(frozen=True)
class PackRows:
    """One member's eligible rows of a pack, in position order: what :func:`learn_pack` learns."""

    partition: int
    positions: np.ndarray  # int64: the rows' positions in the partition
    quality: np.ndarray
    # float32, checked: a numpy array, or a torch tensor on the GPU of a cuDF partition (pickled with its
    # device where the pack is learned on another worker)
    embeddings: object
    tokens: np.ndarray | None
    weights: np.ndarray | None
    device: str
    seconds: float = 0.0  # extracting them: the pack that learns them counts it
    areas: np.ndarray | None = None  # int64, in regions: each row's area, as routed (regions.locate)


@dataclass(frozen=True)
class Routes:
    """Where a pass routed a partition's eligible rows (:func:`pack_rows` in regions): their positions,
    ascending, and each one's area. The share pass keeps them for the select pass, which then routes no
    row again: the areas are the plan's, whatever its quotas and packs."""

    positions: np.ndarray  # int64
    areas: np.ndarray  # int64

    @classmethod
    def of(cls, rows: Mapping[int, PackRows]) -> Routes:
        """From a partition's :func:`pack_rows`."""
        routed = [r for r in rows.values() if r.areas is not None]
        positions = np.concatenate([np.zeros(0, dtype=np.int64), *(r.positions for r in routed)])
        order = np.argsort(positions, kind="stable")
        return cls(positions[order], np.concatenate([np.zeros(0, dtype=np.int64),
                                                     *(r.areas for r in routed)])[order])

    def areas_of(self, positions: np.ndarray, number: int) -> np.ndarray:
        at = np.minimum(np.searchsorted(self.positions, positions), max(0, self.positions.size - 1))
        if positions.size and (not self.positions.size or (self.positions[at] != positions).any()):
            raise RuntimeError(f"partition {number}: rows the share pass did not route; please report this "
                               "with the run record")
        return self.areas[at]


@dataclass(frozen=True)
class PackPart:
    """A pack's outcome for one member's eligible rows (those of its :class:`PackRows`): the positions it
    selects, and where the selection scores or explains its rows, every row's position with its score
    and reason. Every member's select task takes the whole :class:`PackResult`, so it stays small."""

    picked: np.ndarray  # int64: the positions of the rows selected, in the member partition
    positions: np.ndarray | None = None  # int64: every row's position, with scores or reasons
    scores: np.ndarray | None = None  # float32 logits, with score_column
    reasons: np.ndarray | None = None  # int8 codes, with explain (selected rows are marked by the member)


@dataclass(frozen=True)
class PackResult:
    """A learned pack (:func:`learn_pack`): each member's part, and what learning it measured."""

    index: int  # in the plan's packs
    parts: Mapping[int, PackPart]  # member partition -> its part
    measures: Measures


def select_partition(frame, plan: Plan, partition_info=None, packs: Iterable[PackResult] = (),
                     measures: Measures | None = None):
    """Add ``selected`` (and the score column) to one partition, following the plan.

    ``packs``: the :func:`learn_pack` results of the packs this partition is in (any others are
    ignored; what learning them measured is theirs). ``measures``: where its stage seconds and learning
    curves go."""
    measures = Measures() if measures is None else measures
    measures.took(frame)
    spec = plan.spec
    number = partition_info["number"] if partition_info is not None else 0
    n = len(frame)
    selected = np.zeros(n, dtype=bool)
    scores = np.full(n, np.nan, dtype=np.float32) if spec.score_column else None
    # explain: rows of no cell (a group whose quota is 0 everywhere) had no quota
    reasons = np.full(n, explain.QUOTA_EXHAUSTED, dtype=np.int8) if spec.explain else None
    part = _open(frame, plan, number, measures, selected, scores, reasons)
    if part is not None:
        learned = {result.index: result for result in packs}
        packed: list[int] = []
        for cell, rows, where in _cells(part):
            eligible = _eligible(part, cell, rows)
            index = plan.pack_of(number, cell.group)
            if plan.routed:
                packed += plan.packs_of(number) if eligible.size else []
            elif index is None:
                _select_cell(part, cell, eligible, where)
            else:
                packed.append(index)
        for index in packed:
            if index not in learned or number not in learned[index].parts:
                raise RuntimeError(f"partition {number}: the result of pack {index} is missing; please "
                                   "report this with the run record")
            result = learned[index].parts[number]
            selected[result.picked] = True
            if result.positions is None:
                continue
            if scores is not None and result.scores is not None:  # both, with a score column
                scores[result.positions] = result.scores
            if reasons is not None and result.reasons is not None:  # both, with explain
                reasons[result.positions] = result.reasons
    if reasons is not None:
        reasons[selected] = explain.SELECTED
    return frame.assign(**selection_columns(frame, spec, selected, scores, reasons, plan.explain.get(number)))


# --------------------------------------------------------------------------- the columns a selection adds


def selection_columns(frame, spec: SelectSpec, selected: np.ndarray, scores: np.ndarray | None,
                      reasons: np.ndarray | None, links: dict | None = None) -> dict:
    """The columns a selection adds to ``frame`` (a partition, pandas or cuDF), by name: ``selected``,
    the score column, the explain columns (``reasons``: their codes; ``links``: the plan's ``explain``
    entry of the partition)."""
    columns = {spec.selected_column: selected}
    if spec.score_column and scores is not None:  # made for the score column
        columns[spec.score_column] = scores
    if spec.explain and reasons is not None:  # made with explain
        columns.update(explain.explain_columns(frame, spec.id_column, reasons, links))
    return columns


def selection_meta(meta, spec: SelectSpec):
    """The select pass's output as an empty frame (Dask's ``meta``), from the input's ``meta``."""
    return meta.assign(**selection_columns(meta, spec, np.zeros(0, dtype=bool), np.zeros(0, dtype=np.float32),
                                           np.zeros(0, dtype=np.int8)))


def selection_fields(spec: SelectSpec, schema: pa.Schema) -> list[pa.Field]:
    """The Arrow fields of the columns a selection adds to an input of Arrow ``schema``, in order."""
    fields = [pa.field(spec.selected_column, pa.bool_())]
    if spec.score_column:
        fields.append(pa.field(spec.score_column, pa.float32()))
    if spec.explain:
        fields += explain.arrow_fields(schema.field(spec.id_column).type)
    return fields


def output_schema(spec: SelectSpec, schema: pa.Schema) -> pa.Schema:
    """The select pass's output for an input of Arrow ``schema``, on any engine: its columns, then the
    selection's."""
    return pa.schema([*schema, *selection_fields(spec, schema)], metadata=schema.metadata)


def selection_arrays(out, spec: SelectSpec, schema: pa.Schema) -> list[tuple[pa.Field, pa.Array]]:
    """The added columns of ``out`` (a selected pandas partition) as Arrow arrays of
    :func:`selection_fields`' types."""
    pairs = []
    for field in selection_fields(spec, schema):
        values = pa.array(out[field.name])
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        pairs.append((field, values.cast(field.type)))
    return pairs


def pack_rows(frame, plan: Plan, partition_info=None, routes: Routes | None = None) -> dict[int, PackRows]:
    """This partition's eligible rows of each pack it is in, by pack index: its part of
    :func:`learn_pack`'s input (checked as a select task checks them). In regions, each eligible row
    goes to the pack of its area (:func:`datamask_dask.plan.regions.locate`, or ``routes``, where an
    earlier pass routed them); with ``pieces="context"``, to the piece it is dealt to
    (:func:`datamask_dask.plan.context.deal`); and every pack the partition is a member of gets an
    entry, empty where none of its rows lies in it.
    The frame's read is left to its select task to count."""
    number = partition_info["number"] if partition_info is not None else 0
    part = _open(frame, plan, number, Measures())
    out: dict[int, PackRows] = {}
    if part is None:
        return out
    for cell, rows, where in _cells(part):
        index = plan.pack_of(number, cell.group)
        if index is None and not plan.routed:
            continue
        eligible = _eligible(part, cell, rows)
        started = time.perf_counter()
        embeddings = _unit_rows(part, eligible, where)  # on the GPU it stays there: the pack learns there
        if plan.routed:
            if not eligible.size:
                continue
            area, pack_of_row = _route(plan, number, embeddings,
                                       None if routes is None else routes.areas_of(eligible, number))
            seconds = time.perf_counter() - started  # the packs share it by their rows
            for index in plan.packs_of(number):
                mine = np.flatnonzero(pack_of_row == index)
                out[index] = _pack_part(part, number, eligible[mine], embeddings[mine],
                                        seconds * mine.size / eligible.size,
                                        None if area is None else area[mine])
        elif index is not None:
            out[index] = _pack_part(part, number, eligible, embeddings, time.perf_counter() - started)
    return out


def _route(plan: Plan, number: int, embeddings,
           area: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray]:
    """Each of partition ``number``'s eligible rows' area (None: dealt pieces have none) and pack index
    (``area``: the areas an earlier pass routed them to)."""
    if plan.context is not None:
        start, pieces = plan.dealt(number)
        return None, np.asarray(pieces)[context.deal(start, len(embeddings), len(pieces))]
    if plan.centroids is None or plan.areas is None or plan.area_region is None:
        raise RuntimeError(f"partition {number}: rows routed without regions or pieces; please report this "
                           "with the run record")
    if area is None:
        area = regions.locate(adapters.host_rows(embeddings), plan.centroids, plan.areas, plan.area_region,
                              regions.grain(plan.spec.options.metric).searched)
    return area, plan.pack_of_area()[area]


def _pack_part(part: _Partition, number: int, positions: np.ndarray, embeddings, seconds: float,
               areas: np.ndarray | None = None) -> PackRows:
    return PackRows(partition=number, positions=positions, quality=part.quality[positions],
                    embeddings=embeddings, tokens=None if part.tokens is None else part.tokens[positions],
                    weights=None if part.weights is None else part.weights[positions], device=part.device,
                    seconds=seconds, areas=areas)


def learn_pack(pieces: list[dict[int, PackRows]], plan: Plan, index: int) -> PackResult:
    """Learn pack ``index`` of the plan from its members' :func:`pack_rows`, as one partition of their
    rows in table order: each member's part of the outcome, and what learning it measured."""
    pack, measures = plan.packs[index], Measures()
    rows = _members(pieces, plan, index)
    measures.add({"extract": sum(r.seconds for r in rows)})
    part = _pack_partition(rows, plan, index, measures) if rows else None
    if part is not None:
        cell = Cell(pack.label, pack.group, part.selected.size, pack.quota, pack.budget)
        _select_cell(part, cell, np.arange(part.selected.size), _pack_name(plan, index))
    spans, start = {}, 0
    for r in rows:
        spans[r.partition] = (r, slice(start, start + r.positions.size))
        start += r.positions.size
    parts = {}
    every = part is not None and (part.scores is not None or part.reasons is not None)  # positions too
    for number in pack.partitions:  # members without rows in a routed pack get an empty part
        if number not in spans or part is None:
            parts[number] = PackPart(np.zeros(0, dtype=np.int64))
            continue
        member, span = spans[number]
        parts[number] = PackPart(member.positions[part.selected[span]], member.positions if every else None,
                                 None if part.scores is None else part.scores[span],
                                 None if part.reasons is None else part.reasons[span])
    return PackResult(index, parts, measures)


@dataclass(frozen=True)
class AreaSummaries:
    """What a pass found of some of the plan's areas (:func:`pack_curve`, :func:`area_sums`), for
    :func:`~datamask_dask.plan.reduce.share_regions`, in flat arrays (a few arrays move between workers
    far faster than thousands of small ones): ``areas`` their indices, ``rows`` their rows, ``values``
    their values one area after another (``lengths`` each): Facility's marginal-gain curves, Pair_simi's
    normalised qualities; ``sums`` Pair_simi's sums of unit rows, one row an area."""

    areas: np.ndarray
    rows: np.ndarray
    lengths: np.ndarray
    values: np.ndarray
    sums: np.ndarray | None
    stages: Mapping[str, float]

    @classmethod
    def of(cls, found: Mapping[int, tuple], stages: Mapping[str, float]) -> AreaSummaries:
        """From ``{area: (rows, values)}`` or ``{area: (rows, values, sums)}``."""
        areas = sorted(found)
        tuples = [found[a] for a in areas]
        return cls(np.array(areas, dtype=np.int64), np.array([t[0] for t in tuples], dtype=np.int64),
                   np.array([len(t[1]) for t in tuples], dtype=np.int64),
                   np.concatenate([np.zeros(0), *(t[1] for t in tuples)]),
                   np.stack([t[2] for t in tuples]) if tuples and len(tuples[0]) > 2 else None, stages)

    def items(self) -> Iterator[tuple[int, tuple]]:
        """``(area, (rows, values))`` or ``(area, (rows, values, sums))``, by area."""
        ends = np.cumsum(self.lengths)
        for k, area in enumerate(self.areas.tolist()):
            values = self.values[ends[k] - self.lengths[k]:ends[k]]
            rows = int(self.rows[k])
            yield area, (rows, values) if self.sums is None else (rows, values, self.sums[k])


def pack_curve(pieces: list[dict[int, PackRows]], plan: Plan, index: int) -> AreaSummaries:
    """Facility's summary of each area of a region's pack, from its members' :func:`pack_rows` (none: a
    region no row reached): the area's rows and marginal-gain curve
    (:func:`datamask_dask.plan.regions.gain_curve`), which needs the area's rows in one task."""
    import torch

    from ..learn.knn import top_neighbours
    from ..threads import one_cpu_thread

    areas = plan.packs[index].areas
    rows = _members(pieces, plan, index)
    if not rows:
        return AreaSummaries.of({}, {})
    started = time.perf_counter()
    part = _pack_partition(rows, plan, index, Measures())
    n = part.selected.size
    options = plan.spec.options
    quality = _normalised(plan, part.quality)
    weights = np.ones(n) if part.weights is None else part.weights
    embeddings = adapters.host_rows(part.source.rows(np.arange(n)))
    area_of_row = np.concatenate([_routed(r, index) for r in rows])
    by_area = np.argsort(area_of_row, kind="stable")  # each area's rows in pack order, by one sort
    placed, ids = area_of_row[by_area], np.asarray(areas, dtype=np.int64)
    starts, stops = np.searchsorted(placed, ids, "left"), np.searchsorted(placed, ids, "right")
    eligible, planned = plan.eligible, plan.planned
    quality_weight = options.lamb / max(1, planned)
    coverage_weight = (1 - options.lamb) / max(1, sum(plan.rows))
    curves: dict[int, tuple] = {}
    with one_cpu_thread():  # one order of every float sum, on any worker
        for area, start, stop in zip(areas, starts, stops, strict=True):
            at = by_area[start:stop]
            if not at.size:
                continue
            vectors = torch.as_tensor(embeddings[at])
            # (the seed only counts where the search is approximate)
            generator = None if at.size <= options.exact_neighbours else \
                torch.Generator().manual_seed(derive_seed(options.seed, 0, 0, 0, area))
            similarities, neighbours = top_neighbours(
                vectors, vectors, options.neighbours, generator=generator, exact_max=options.exact_neighbours,
                probes=options.probes)
            curves[area] = (at.size, regions.gain_curve(
                quality[at], np.asarray(neighbours), np.asarray(similarities), weights[at],
                regions.curve_limit(at.size, eligible, planned), quality_weight, coverage_weight))
    # the plan pass's: its members' extraction, and the curves
    seconds = sum(r.seconds for r in rows) + time.perf_counter() - started
    return AreaSummaries.of(curves, {"plan curve": seconds})


def area_sums(routed: Mapping[int, PackRows], plan: Plan) -> AreaSummaries:
    """Pair_simi's summary of the areas one partition's eligible rows lie in, from its :func:`pack_rows`:
    their count, normalised qualities and the float64 sum of their unit rows
    (:func:`datamask_dask.plan.regions.share_pairs`). Counts, qualities and sums add up across
    partitions, so no area's rows need to meet in one task."""
    started = time.perf_counter() - sum(rows.seconds for rows in routed.values())  # their routing counts
    pieces = {index: rows for index, rows in sorted(routed.items()) if rows.positions.size}
    if not pieces:
        return AreaSummaries.of({}, {"plan curve": time.perf_counter() - started})
    area = np.concatenate([_routed(rows, index) for index, rows in pieces.items()])
    order = np.argsort(area, kind="stable")
    areas, starts, counts = np.unique(area[order], return_index=True, return_counts=True)
    embeddings = np.concatenate([adapters.host_rows(rows.embeddings) for rows in pieces.values()])
    quality = _normalised(plan, np.concatenate([rows.quality for rows in pieces.values()]))[order]
    sums = regions.run_sums(embeddings, order, starts)  # in row order, on any worker
    counts = counts.astype(np.int64)
    return AreaSummaries(areas.astype(np.int64), counts, counts, quality, sums,
                         {"plan curve": time.perf_counter() - started})


def context_round(frame, plan: Plan, partition_info=None, packs: Iterable[PackResult] = ()) -> context.Picks:
    """One partition's part of the context's next round (``pieces="context"``,
    :mod:`datamask_dask.plan.context`): its rows the plan selects, every piece learned as the round
    learns it, and their :class:`~datamask_dask.plan.context.Picks`. ``packs``: as for
    :func:`select_partition`."""
    started = time.perf_counter()
    number = partition_info["number"] if partition_info is not None else 0
    if plan.context is None:
        raise RuntimeError(f"partition {number}: a round of the context without one; please report this "
                           "with the run record")
    packs = list(packs)
    out = select_partition(frame, plan, partition_info, packs)
    picked = np.flatnonzero(adapters.host_values(out, plan.spec.selected_column).to_numpy())
    dim = plan.context.table.mean.size
    rows, quality = np.zeros((0, dim)), np.zeros(0)
    if picked.size:
        source = adapters.embedding_source(frame[plan.spec.embedding_column], f"partition {number}", plan.dim)
        rows = adapters.host_rows(source.rows(picked)).astype(np.float64)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        quality = _normalised(plan, quality_values(frame, plan.spec, f"partition {number}")[picked])
    learned = sum(sum(result.measures.stages.values()) for result in packs  # a pack's, by its first member
                  if plan.packs[result.index].partitions[0] == number)
    return context.picked(rows, quality, plan.context.table, time.perf_counter() - started + learned)


def _normalised(plan: Plan, quality: np.ndarray) -> np.ndarray:
    """Qualities scaled by the plan's range to [0, 1], as the learner sees them."""
    low, high = plan.ranges[0]
    return (quality - low) / (high - low) if high > low else np.zeros(quality.size)


def _routed(rows: PackRows, index: int) -> np.ndarray:
    """Each of a member's pack rows' area, as :func:`pack_rows` routed it."""
    if rows.areas is None:
        raise RuntimeError(f"partition {rows.partition}'s rows of pack {index} came without their areas; "
                           "please report this with the run record")
    return rows.areas


def _members(pieces: list[dict[int, PackRows]], plan: Plan, index: int) -> list[PackRows]:
    """Pack ``index``'s rows from its members' :func:`pack_rows`, in member order (in a routed pack,
    members without rows in it left out)."""
    pack = plan.packs[index]
    rows = [piece[index] for piece in pieces if index in piece]
    given = [r.partition for r in rows]
    expected = list(pack.partitions)
    if pack.routed:
        rows = [r for r in rows if r.positions.size]
        expected = [p for p in expected if p in {r.partition for r in rows}]
        given = [r.partition for r in rows]
    if given != expected:
        raise RuntimeError(f"pack {index} got the rows of partitions {given}, not of {expected}; please "
                           "report this with the run record")
    return rows


def _pack_partition(rows: list[PackRows], plan: Plan, index: int, measures: Measures) -> _Partition:
    """A pack's rows as one partition of them, in member order."""
    pack, spec = plan.packs[index], plan.spec
    quality = np.concatenate([r.quality for r in rows])
    embeddings = _concatenate([r.embeddings for r in rows])
    n, dim = embeddings.shape
    tokens = None if rows[0].tokens is None else np.concatenate([r.tokens for r in rows])
    weights = None  # a member without near-duplicates has none: its rows stand for themselves
    if any(r.weights is not None for r in rows):
        weights = np.concatenate([np.ones(r.positions.size) if r.weights is None else r.weights
                                  for r in rows])
    device = rows[0].device
    memory = spec.memory_plan(n, dim, _pack_name(plan, index), device, packed=True)
    return _Partition(frame=None, number=pack.partitions[0], plan=plan, source=_Rows(embeddings),
                      quality=quality, tokens=tokens, device=device, memory=memory,
                      weights=weights, measures=measures, selected=np.zeros(n, dtype=bool),
                      scores=np.full(n, np.nan, dtype=np.float32) if spec.score_column else None,
                      reasons=np.full(n, explain.QUOTA_EXHAUSTED, dtype=np.int8) if spec.explain else None,
                      place=pack.seed_place,
                      others=plan.others[index] if plan.others else None)


def _pack_name(plan: Plan, index: int) -> str:
    return plan.packs[index].name(plan.spec.by is not None)


def _concatenate(blocks: list):
    """The members' embeddings as one matrix, where they are (numpy arrays, or torch tensors)."""
    if isinstance(blocks[0], np.ndarray):
        return np.concatenate(blocks)
    import torch

    return torch.cat(blocks)


class _Rows:
    """A pack's embeddings, already checked (a source for :func:`_learn`, which only reads them)."""

    checked = True

    def __init__(self, embeddings):
        self.embeddings, self.dim = embeddings, embeddings.shape[1]

    def rows(self, positions: np.ndarray) -> np.ndarray:
        # a chunk is a contiguous run of the pack's rows: a view, not a copy of a chunk's embeddings
        if positions.size and positions[-1] - positions[0] == positions.size - 1:
            return self.embeddings[positions[0]:positions[-1] + 1]
        return self.embeddings[positions]


def _open(frame, plan: Plan, number: int, measures: Measures, selected=None, scores=None,
          reasons=None) -> _Partition | None:
    """Check one partition against its plan and gather what its cells need (None: nothing to learn)."""
    spec = plan.spec
    where = f"partition {number}"
    n = len(frame)
    planned = plan.rows[number] if number < len(plan.rows) else 0
    if n != planned:
        raise InputDataError(
            f"{where} has {n} rows now but had {planned} when quotas were planned: the input must give "
            "the same rows each time it is computed (persist() it, or fix the non-deterministic step "
            "before datamask_select)")
    if not (n and plan.cells_of(number)):
        return None
    adapters.require_columns(frame, spec.select_columns, where)
    source = adapters.embedding_source(frame[spec.embedding_column], where, plan.dim)
    device = adapters.learner_device(spec.device, frame, where)
    memory = spec.memory_plan(n, source.dim, where, device)
    weights = None
    if number in plan.weights:
        kept, counts = plan.weights[number]
        weights = np.ones(n, dtype=np.float64)
        weights[kept] = counts
    return _Partition(frame=frame, number=number, plan=plan, source=source,
                      quality=quality_values(frame, spec, where),
                      tokens=token_values(frame, spec, where) if spec.budget is not None else None,
                      device=device, memory=memory, weights=weights,
                      measures=measures,
                      selected=np.zeros(n, dtype=bool) if selected is None else selected,
                      scores=scores, reasons=reasons)


def _cells(part: _Partition):
    """Each cell of the partition with its rows (the group's, near-duplicates set aside) and its name."""
    spec, number = part.spec, part.number
    where = f"partition {number}"
    codes, labels = group_codes(part.frame, spec, where)
    code_of = {label: code for code, label in enumerate(labels)}
    visible = np.ones(len(part.frame), dtype=bool)
    shadowed = part.plan.shadowed.get(number)
    if shadowed is not None and len(shadowed):
        visible[shadowed] = False  # near-duplicates of a better row elsewhere: ineligible
        if part.scores is not None:
            part.scores[shadowed] = -np.inf
        if part.reasons is not None:
            part.reasons[shadowed] = explain.NEAR_DUPLICATE
    for cell in part.plan.cells_of(number):
        rows = np.flatnonzero((codes == code_of[cell.label]) & visible)
        yield cell, rows, where if spec.by is None else f"{where}, group {cell.label!r}"


def _eligible(part: _Partition, cell: Cell, rows: np.ndarray) -> np.ndarray:
    """The cell's eligible rows (its best ``cell.eligible`` by quality), in position order; the rest of
    its rows are marked quality-pruned."""
    order = np.argsort(-part.quality[rows], kind="stable")
    eligible = np.sort(rows[order[:cell.eligible]])
    if part.scores is not None:
        part.scores[rows] = -np.inf
        part.scores[eligible] = np.nan
    if part.reasons is not None:
        part.reasons[rows] = explain.QUALITY_PRUNED
        part.reasons[eligible] = explain.QUOTA_EXHAUSTED
    return eligible


def _select_cell(part: _Partition, cell: Cell, eligible: np.ndarray, name: str) -> None:
    """Select among one cell's eligible rows: chunks, learner, budget."""
    quality, scores, reasons = part.quality, part.scores, part.reasons
    if eligible.size == 0 or (cell.quota == 0 if cell.budget is None else cell.budget == 0):
        return
    n_chunks = math.ceil(eligible.size / part.memory.max_chunk_rows)
    chunk_of_row = np.arange(eligible.size) * n_chunks // eligible.size  # contiguous, near-equal
    if cell.budget is None:
        quotas = split_quota(quality[eligible], chunk_of_row, n_chunks, cell.quota, part.spec.oversample)
        budgets = None
    else:
        budgets, quotas = split_budget(quality[eligible], part.token_counts()[eligible], chunk_of_row,
                                       n_chunks, cell.budget, part.spec.oversample)
    for chunk_number in range(n_chunks):
        chunk = eligible[chunk_of_row == chunk_number]
        k = int(quotas[chunk_number])
        mask = np.zeros(chunk.size, dtype=bool)
        preference = quality[chunk]
        where = name if n_chunks == 1 else f"{name}, chunk {chunk_number}"
        if 0 < k < chunk.size:
            result = _learn(part, cell, chunk, k, chunk_number, where)
            mask, preference = result.mask, result.scores.astype(np.float64)
            if scores is not None:
                scores[chunk] = result.scores
        elif k >= chunk.size:
            mask[:] = True
        if reasons is not None and k > 0:
            reasons[chunk] = np.where(mask, explain.BUDGET_EXHAUSTED, explain.NOT_CHOSEN)  # if not selected
        if budgets is not None:
            mask = fit_budget(mask, part.token_counts()[chunk], preference, budgets[chunk_number])
        part.selected[chunk[mask]] = True
    if cell.budget is not None and n_chunks > 1:
        # Chunks round their budgets down separately: spend what is left on the best rows that fit.
        part.selected[eligible] = fit_budget(part.selected[eligible], part.token_counts()[eligible],
                                             quality[eligible], cell.budget)


def derive_seed(seed: int, partition: int, group: int, chunk: int, place: int | None = None) -> int:
    """Seed of one learner run, from (seed, partition, group, chunk, place) only: where it runs never
    matters (``partition``: :meth:`~datamask_dask.plan.types.Plan.seed_number`, empty partitions not
    counted; ``place``: a routed pack's :attr:`~datamask_dask.plan.types.Pack.seed_place`, else None)."""
    sequence = np.random.SeedSequence([int(seed) % 2**64, partition, group, chunk]
                                      + ([] if place is None else [place]))
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


def _unit_rows(part: _Partition, rows: np.ndarray, where: str):
    """The embeddings of ``rows`` (a copy, or a view of a pack's rows, which its members checked), checked
    unless the plan pass did."""
    embeddings = part.source.rows(rows)
    if part.spec.validate != "full" and not getattr(part.source, "checked", False):
        norms = check_vectors(embeddings, rows, part.frame, part.spec, where)
        if isinstance(embeddings, np.ndarray):
            embeddings /= norms[:, None]  # in place: the learner finds unit rows and copies nothing
    return embeddings


def _learn(part: _Partition, cell: Cell, chunk: np.ndarray, k: int, chunk_number: int, where: str):
    options = part.memory.options
    with part.measures.timed("extract"):
        embeddings = _unit_rows(part, chunk, where)
    seed = derive_seed(options.seed, part.plan.seed_number(part.number), cell.group, chunk_number, part.place)
    against = None if part.plan.context is None else part.plan.context.against(k, seed)
    try:
        with part.measures.timed("learn"):
            result = learn_mask(part.quality[chunk], embeddings, k, options, device=part.device,
                                quality_range=part.plan.ranges[cell.group],
                                weights=None if part.weights is None else part.weights[chunk],
                                others=part.others, where=where, seed=seed,
                                moments=against)
        part.measures.curve(where, result.history)  # for the run summary's learning curves
        return result
    except InputDataError as exc:
        raise InputDataError(f"{where}: {exc}") from exc

