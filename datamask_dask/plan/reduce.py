"""The reduction step: partition summaries -> the quota plan every partition's task follows.

Engine-agnostic: the Dask operator and the Spark integration collect one summary per partition
(:func:`datamask_dask.partition.checks.summarise_partition`) and the duplicate-id report, and
call :func:`make_plan` once.

In table scope, cells of one group in consecutive partitions whose eligible rows fit in one chunk
(``SelectSpec.chunk_rows``) together are *packed* (:func:`pack_cells`): learned as one partition of their
rows, so that a table of small partitions is learned in chunks as large as one large partition's (in
partition scope each partition is learned on its own).

With ``diversity_scope="table"``, shadowed rows (near-duplicates of a better row, see
:mod:`datamask_dask.dedup.search`) are ineligible: a group's quota is still ``round(ratio *
rows)`` over *all* its rows, planned on the sketches of the rows that remain (``prune`` then
applies to those). When a group has fewer rows left than its quota (or its token budget), it is
planned on every row and its shadowed rows become eligible again (and every row stands for
itself), so a ratio that the table can meet is always met exactly.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from .. import telemetry
from ..errors import DataMaskWarning, OptionError, Problem, problems_error
from . import context, regions
from .quotas import plan_rows, plan_tokens
from .types import Cell, Pack, PartitionSummary, Plan

if TYPE_CHECKING:  # the spec and the areas' summaries are the partition room's; the plan only reads them
    from ..partition.select import AreaSummaries
    from ..partition.spec import SelectSpec

SHOW = 5  # values quoted in a message


def make_plan(summaries: list[PartitionSummary], ids, dim: int | None, spec: SelectSpec) -> Plan:
    """Integer quotas (or token budgets) per partition and group, and the table-wide quality range.

    Raises
    ------
    InputDataError
        For duplicate ids or mixed embedding dimensions across partitions.
    OptionError
        For a ratio or token budget the data cannot meet.
    """
    dims = [s.dim for s in summaries]
    problems = duplicate_problems(ids, spec.id_column) + dimension_problems(dims, spec.embedding_column)
    if problems:
        raise problems_error(problems)
    if dim is None:
        dim = next((d for d in dims if d is not None), None)
    labels = sorted({label for s in summaries for label in s.cells},
                    key=lambda label: (type(label).__name__, label))
    ratios, budgets = _per_label(spec.ratio, labels), _per_label(spec.budget, labels)
    cell_lists: dict[int, list[Cell]] = {}
    ranges = {}
    shadowed: dict[int, list] = {}
    weights: dict[int, list] = {}
    for index, label in enumerate(labels):
        members = [(p, s.cells[label]) for p, s in enumerate(summaries) if label in s.cells]
        n_rows = sum(c.n for _, c in members)
        ranges[index] = (min(c.min for _, c in members), max(c.max for _, c in members))
        deduplicated = any(c.shadowed is not None for _, c in members)
        try:
            plan = _plan_group(label, [c.sketch for _, c in members], n_rows, ratios[label], budgets[label],
                               spec)
        except OptionError:
            if not deduplicated:
                raise
            # Too few rows are left once near-duplicates are set aside: plan this group on every row.
            every_row = [c.sketch if c.sketch_all is None else c.sketch_all for _, c in members]
            plan = _plan_group(label, every_row, n_rows, ratios[label], budgets[label], spec)
            deduplicated = False
        for (partition, cell), (eligible, quota, budget) in zip(members, plan.T, strict=True):
            cell_lists.setdefault(partition, []).append(
                Cell(label, index, int(eligible), int(quota), None if spec.budget is None else int(budget)))
            if deduplicated and cell.shadowed is not None:
                shadowed.setdefault(partition, []).append(cell.shadowed)
                if cell.kept is not None and len(cell.kept):
                    weights.setdefault(partition, []).append((cell.kept, cell.weights))
    cells = {p: tuple(c) for p, c in cell_lists.items()}
    places: dict = {}  # pieces="regions": centroids, areas, area_region
    packs: tuple[Pack, ...] = ()
    eligible = sum(c.eligible for cs in cells.values() for c in cs)
    table_context = None  # pieces="context": the table's moments, which every piece standardises by
    if spec.pieces == "regions" and eligible > spec.chunk_rows(dim):  # a table one chunk holds: learned whole
        places, packs = region_packs(cells, [s.sample for s in summaries], spec, dim, eligible)
    elif spec.pieces == "context" and eligible > spec.chunk_rows(dim):
        moments = context.table_moments([s.moments for s in summaries], [s.n for s in summaries])
        table_context = context.Context(moments)
        packs = dealt_packs(cells, spec.chunk_rows(dim))
    elif spec.diversity_scope == "table":
        packs = pack_cells(cells, spec.chunk_rows(dim))
    _check_packs(packs, cells, spec, dim)
    return Plan(spec=spec, cells=cells, packs=packs, **places, context=table_context,
                rows=tuple(int(s.n) for s in summaries), dim=dim, ranges=ranges,
                shadowed={p: np.sort(np.concatenate(v)) for p, v in shadowed.items()},
                weights={p: _stack_weights(v) for p, v in weights.items()},
                digests=tuple(s.digest for s in summaries),
                stages=telemetry.add_up(s.stages for s in summaries),
                explain=duplicate_links(summaries) if spec.explain else {})


def _check_packs(packs: tuple[Pack, ...], cells: dict[int, tuple[Cell, ...]], spec: SelectSpec,
                 dim: int | None) -> None:
    """Raise ``OptionError`` where the largest pack's chunk does not fit in the workers' memory: a pack
    gathers several partitions' rows, more than the plan pass checked in any one of them. Modelled as
    on CPU, the least a pack needs anywhere; its own task checks again where it learns."""
    if not packs or not spec.memory_limit or not dim:
        return
    if packs[0].routed:  # areas are packed up to a chunk's worth of rows, and pieces dealt as large at most
        largest = spec.chunk_rows(dim)
        where = "a piece of the table" if packs[0].dealt is not None else "a pack of areas"
    else:
        rows = [sum(c.eligible for p in pack.partitions for c in cells[p] if c.group == pack.group)
                for pack in packs]
        pack = packs[int(np.argmax(rows))]
        largest, where = max(rows), f"the pack of {pack.name(spec.by is not None)}"
    spec.memory_plan(largest, dim, where, packed=True)


def pack_cells(cells: dict[int, tuple[Cell, ...]], max_rows: int) -> tuple[Pack, ...]:
    """Per group, the runs of consecutive partitions (those with eligible rows of the group) whose
    eligible rows add up to at most ``max_rows``, where a run has two or more and something to select.

    A cell with more eligible rows than ``max_rows`` is learned on its own, in chunks, and ends the run.
    """
    members: dict[int, list] = {}
    for partition in sorted(cells):
        for cell in cells[partition]:
            if cell.eligible:
                members.setdefault(cell.group, []).append((partition, cell))
    packs = []

    def close(run: list) -> None:
        quota = sum(cell.quota for _, cell in run)
        budget = None if run[0][1].budget is None else sum(cell.budget for _, cell in run)
        if len(run) > 1 and (quota if budget is None else budget) > 0:
            packs.append(Pack(run[0][1].label, run[0][1].group, tuple(p for p, _ in run), quota, budget))
        run.clear()

    for group in sorted(members):
        run: list = []
        rows = 0  # the run's eligible rows
        for partition, cell in members[group]:
            if run and rows + cell.eligible > max_rows:
                close(run)
                rows = 0
            run.append((partition, cell))
            rows += cell.eligible
            if cell.eligible > max_rows:
                close(run)
                rows = 0
        if run:
            close(run)
    return tuple(packs)


def dealt_packs(cells: dict[int, tuple[Cell, ...]], chunk_rows: int) -> tuple[Pack, ...]:
    """The pieces a table's eligible rows are dealt to (``pieces="context"``, one group: no ``by``): each
    strip of partitions with eligible rows (:func:`datamask_dask.plan.context.strips`) dealt to as few
    pieces as keep each within ``chunk_rows``, every piece a pack of its strip's partitions, the quota
    shared by the pieces' rows (:func:`datamask_dask.plan.context.dealt_quotas`)."""
    members = [p for p in sorted(cells) if any(c.eligible for c in cells[p])]
    if not members:
        return ()
    eligible = [sum(c.eligible for c in cells[p]) for p in members]
    strips = []  # each strip's partitions, eligible rows and pieces
    for strip in context.strips(eligible, chunk_rows):
        rows = sum(eligible[i] for i in strip)
        strips.append((tuple(members[i] for i in strip), rows, context.piece_count(rows, chunk_rows)))
    piece_rows = np.concatenate([context.dealt_rows(rows, n) for _, rows, n in strips])
    quotas = context.dealt_quotas(piece_rows, sum(max(c.quota, 0) for cs in cells.values() for c in cs))
    first = cells[members[0]][0]
    pieces = [partitions for partitions, _, n in strips for _ in range(n)]
    return tuple(Pack(first.label, first.group, partitions, int(q), None, dealt=j)
                 for j, (partitions, q) in enumerate(zip(pieces, quotas, strict=True)))


def region_packs(cells: dict[int, tuple[Cell, ...]], samples: list, spec: SelectSpec,
                 dim: int | None, eligible: int) -> tuple[dict, tuple[Pack, ...]]:
    """The regions' and their areas' centroids (the plan's ``centroids``, ``areas`` and
    ``area_region``), from the partitions' sample rows, and one pack per region whose members are the
    partitions with eligible rows (``eligible`` in all), its quota not yet shared (:func:`share_regions`)."""
    members = tuple(p for p in sorted(cells) if any(c.eligible for c in cells[p]))
    rows = [s for s in samples if s is not None and len(s)]
    if not members or not rows:
        return {}, ()
    sample = np.concatenate(rows)
    grain = regions.grain(spec.options.metric)
    count = regions.region_count(eligible, spec.chunk_rows(dim), len(sample), grain.regions_per_chunk)
    centroids = regions.find_centroids(sample, count, spec.options.seed, regions.THREADS)
    areas, area_region = regions.find_areas(sample, centroids, eligible, spec.options.seed, grain.area_rows)
    label = cells[members[0]][0].label
    packs = tuple(Pack(label, 0, members, -1, None, areas=tuple(np.flatnonzero(area_region == r).tolist()))
                  for r in range(len(centroids)) if (area_region == r).any())
    return {"centroids": centroids, "areas": areas, "area_region": area_region}, packs


def share_regions(plan: Plan, summaries: list[AreaSummaries]) -> Plan:
    """``plan`` with the quota shared between the areas by what the plan pass found of them: Facility's
    by their marginal-gain curves (each region's pack's, :func:`datamask_dask.partition.select.pack_curve`;
    :func:`datamask_dask.plan.regions.share_quotas`), Pair_simi's by its objective over the areas'
    qualities and mean rows (each partition's, :func:`datamask_dask.partition.select.area_sums`, added
    up in partition order; :func:`datamask_dask.plan.regions.share_pairs`); and the areas packed:
    neighbours learned together up to a chunk's worth of rows
    (:func:`datamask_dask.plan.regions.pack_areas`)."""
    if plan.areas is None:
        raise RuntimeError("share_regions: the plan has no regions; please report this with the run record")
    pairs = plan.spec.options.metric == "pair_simi"
    found = _areas_found(summaries, len(plan.areas), pairs, plan.dim or 0)
    sizes = np.array([summary[0] for summary in found], dtype=np.int64)
    if pairs:
        sums = np.stack([summary[2] for summary in found])
        quotas = regions.share_pairs([summary[1] for summary in found], sums, plan.planned,
                                     plan.spec.options.lamb)
        planned = quotas[:, None] * sums / np.maximum(sizes, 1)[:, None]  # each area's picks' planned sum
    else:
        quotas = regions.share_quotas([summary[1] for summary in found], plan.planned)
    first = plan.packs[0]
    packs = []
    for members in regions.pack_areas(plan.areas, sizes, plan.spec.chunk_rows(plan.dim)):
        quota = int(quotas[members].sum())
        if quota:
            packs.append(dataclasses.replace(first, quota=quota, areas=tuple(int(a) for a in members)))
    others: tuple = ()
    if pairs:  # each pack learns its rows against the others' planned picks
        residual, bought = planned.sum(axis=0), math.sqrt(plan.spec.options.lamb)
        # The plan's residual sum is partly bought with quality, partly what the areas' means cannot
        # cancel but their rows can. A pack that saw all of the second part would cancel it, as would
        # every other, overshooting: each sees the others cancel their shares of it. The bought part
        # grows with lamb; its square root was chosen by measurement (docs/benchmarks.md).
        others = tuple((residual * (bought + (1 - bought) * pack.quota / plan.planned)
                        - planned[list(pack.areas)].sum(axis=0), plan.planned - pack.quota) for pack in packs)
    stages = telemetry.add_up([plan.stages, *(summary.stages for summary in summaries)])
    return dataclasses.replace(plan, packs=tuple(packs), others=others, stages=stages)


def _areas_found(summaries: list[AreaSummaries], areas: int, pairs: bool, dim: int) -> list[tuple]:
    """Each of ``areas`` areas' summary from the passes' (an area no row reached: none of its rows): a
    Facility area's from its region's pack alone; a Pair_simi area's counts, qualities (best first) and
    sums of ``dim`` values added up over the partitions in their order."""
    parts: list[list[tuple]] = [[] for _ in range(areas)]
    for summary in summaries:
        for area, found in summary.items():
            parts[area].append(found)
    out = []
    for area, held in enumerate(parts):
        if pairs:
            sums = np.zeros(dim)
            for part in held:  # in partition order: one sum on any engine
                sums = sums + part[2]
            quality = np.concatenate([np.zeros(0), *(part[1] for part in held)])
            out.append((sum(part[0] for part in held), -np.sort(-quality), sums))
        elif len(held) > 1:
            raise RuntimeError(f"area {area} has {len(held)} curves; please report this with the run record")
        else:
            out.append(held[0] if held else (0, np.zeros(0)))
    return out


def duplicate_links(summaries: list[PartitionSummary]) -> dict:
    """Per partition, its near-duplicates' positions, the ids of the rows they stand behind, and the
    cosine estimated from the two rows' SimHash signatures (``explain=True``).

    Joins each partition's shadowed rows (their parents as references ``partition << 32 |
    position``) with the ids of the parent rows that their own partitions listed.
    """
    out = {}
    for number, summary in enumerate(summaries):
        links = summary.links
        if links is None or not len(links["shadowed"]):
            continue
        ref = links["parent"]
        part, position = ref >> 32, ref & 0xFFFFFFFF
        ids = np.empty(ref.size, dtype=object)
        theirs = np.zeros((ref.size, links["signatures"].shape[1]), dtype=np.uint8)
        for q in np.unique(part).tolist():
            mine = part == q
            parents = summaries[q].links or {"parents": np.zeros(0, dtype=np.int64)}
            named = parents["parents"]
            at = np.searchsorted(named, position[mine])
            listed = named.size and (named[np.minimum(at, named.size - 1)] == position[mine]).all()
            if not listed:  # every wiring lists each parent in its partition: a broken search otherwise
                raise RuntimeError(f"explain: partition {q} does not list rows that near-duplicates of "
                                   f"partition {number} stand behind; please report this with the run record")
            ids[mine] = parents["parent_ids"][at]
            theirs[mine] = parents["parent_signatures"][at]
        bits = links["signatures"].shape[1] * 8
        hamming = np.bitwise_count(np.bitwise_xor(links["signatures"], theirs)).sum(axis=1)
        out[number] = {"position": links["shadowed"], "duplicate_of": _plain_array(ids),
                       "similarity": np.cos(np.pi * hamming / bits).astype(np.float32)}
    return out


def _plain_array(values: np.ndarray) -> np.ndarray:
    """Ids as a typed array where they are all numbers of one kind, else as objects."""
    try:
        typed = np.asarray(values.tolist())
    except (ValueError, TypeError):
        return values
    return typed if typed.dtype.kind in "iuf" else values


def _stack_weights(cells: list) -> tuple[np.ndarray, np.ndarray]:
    """One partition's (kept positions, weights) from its cells', sorted by position."""
    kept, weights = (np.concatenate(column) for column in zip(*cells, strict=True))
    order = np.argsort(kept, kind="stable")
    return kept[order], weights[order]


def _per_label(value, labels: list) -> dict:
    """Each group's ``ratio`` or ``budget_tokens``: a mapping's value (0 for a group it does not name),
    or the one value for every group."""
    if not isinstance(value, dict):
        return dict.fromkeys(labels, value)
    keyed = dict(zip(group_keys(value, labels), value.values(), strict=True))
    return {label: keyed.get(label, 0) for label in labels}


def group_keys(value: dict, labels: list) -> list:
    """The group each key of a per-group mapping names: a label equal to it or, as the command line
    gives every key as text, whose text it is; else the key itself (a group the table lacks)."""
    known = set(labels)
    as_text = {str(label): label for label in labels}
    return [key if key in known else as_text.get(str(key), key) for key in value]


def unknown_groups(plan: Plan) -> dict:
    """``{option: [keys]}``: the keys of a per-group ``ratio`` or ``budget_tokens`` that name no group of
    the planned table: they get no rows, which a run logs (a misspelt group looks the same)."""
    labels = list(dict.fromkeys(cell.label for cells in plan.cells.values() for cell in cells))
    out = {}
    for option, value in (("ratio", plan.spec.ratio), ("budget_tokens", plan.spec.budget)):
        if isinstance(value, dict):
            missing = [key for key, group in zip(value, group_keys(value, labels), strict=True)
                       if group not in labels]
            if missing:
                out[option] = missing
    return out


def plan_warnings(plan: Plan) -> list[str]:
    """What a run tells before it selects: the keys of a per-group option that name no group, and a
    ratio that takes no row of most groups or of the table (every door says the same)."""
    said = [f"{option} names group(s) {', '.join(map(repr, keys))} that no row's {plan.spec.by!r} holds: "
            "they get no rows" for option, keys in unknown_groups(plan).items()]
    starved = starved_groups(plan)
    return said + ([starved] if starved else [])


def warn_plan(plan: Plan, stacklevel: int = 1) -> None:
    """:func:`plan_warnings` as :class:`~datamask_dask.errors.DataMaskWarning`, from the frame doors
    (a run logs them); ``stacklevel`` as ``warnings.warn``'s, counted from the caller."""
    for said in plan_warnings(plan):
        warnings.warn(said, DataMaskWarning, stacklevel=stacklevel + 1)


def starved_groups(plan: Plan) -> str | None:
    """Where most ``by`` groups with eligible rows take no row under one table-wide ``ratio`` (a group
    takes ``round(ratio * its rows)``), which tells of a column too fine to group by, an id or a score,
    or where a table without groups takes none: the warning that says so; else None."""
    if plan.spec.ratio is None or isinstance(plan.spec.ratio, dict):
        return None
    eligible: dict = {}
    quota: dict = {}
    for cell in (cell for cells in plan.cells.values() for cell in cells):
        eligible[cell.group] = eligible.get(cell.group, 0) + cell.eligible
        quota[cell.group] = quota.get(cell.group, 0) + max(cell.quota, 0)
    groups = [group for group, rows in eligible.items() if rows]
    starved = sum(1 for group in groups if not quota[group])
    if plan.spec.by is None:
        return None if not starved else (
            f"ratio {plan.spec.ratio:g} of the table's {sum(eligible.values())} eligible row(s) is no row "
            "(the selection takes round(ratio x its rows)): nothing is selected; raise the ratio")
    if starved * 2 <= len(groups):
        return None
    return (f"by={plan.spec.by!r} cuts the table into {len(groups)} groups, and {starved} of them hold too "
            f"few rows to take one at ratio {plan.spec.ratio:g} (a group takes round(ratio x its rows)): "
            "they get none; group by a coarser column")


def _plan_group(label, sketches: list, n_rows: int, ratio, budget, spec: SelectSpec) -> np.ndarray:
    """(eligible, quota, budget) x cells of one group; ``n_rows`` counts shadowed rows too; ``ratio``
    and ``budget`` are the group's."""
    where = "" if spec.by is None else f" in group {label!r} of {spec.by!r}"
    if budget is not None:
        if budget == 0:
            return np.zeros((3, len(sketches)), dtype=np.int64)
        try:
            result = plan_tokens(sketches, budget, spec.prune, spec.oversample)
        except ValueError as exc:
            total = sum(float(sk.tokens.sum()) for sk in sketches)
            raise OptionError(
                f"budget_tokens={budget} cannot be met{where}: {exc} (the rows hold {total:.0f} "
                f"tokens in column {spec.token_column!r}; prune={spec.prune}); lower the budget"
            ) from exc
        return np.stack([result.eligible, result.quota, result.budget])
    if ratio is None:  # make_spec gives a ratio wherever it gives no budget
        raise OptionError("neither a ratio nor a token budget was given: give one")
    try:
        rows = plan_rows(sketches, int(round(ratio * n_rows)), spec.prune, spec.oversample)
    except ValueError as exc:
        raise OptionError(f"ratio={ratio} cannot be met{where}: {exc} after prune={spec.prune}; "
                          "lower the ratio or the prune share") from exc
    return np.stack([rows.eligible, rows.quota, np.full(len(sketches), -1)])


def duplicate_problems(ids, id_column: str) -> list[Problem]:
    """The duplicate ids found by :func:`id_graph`, as one problem (or none)."""
    if ids is None or not ids[0]:
        return []
    shown = ", ".join(f"{value!r} (partitions {parts})" for value, parts in ids[1])
    return [Problem(f"id column {id_column!r} has {ids[0]} duplicate value(s), e.g. {shown}; ids must be "
                    f"unique across the table: keep one row per id first (drop_duplicates("
                    f"subset=[{id_column!r}], on a Dask or Spark frame) or pass check_ids=False", id_column)]


def dimension_problems(dims: list, column: str) -> list[Problem]:
    """Partitions whose embedding dimension differs from the first non-empty partition's."""
    seen = [(p, d) for p, d in enumerate(dims) if d is not None]
    if not seen:
        return []
    reference = seen[0][1]
    return [Problem(f"partition {p}: embedding column {column!r} has {d} dimensions but {reference} "
                    "elsewhere in the table; every row must come from the same embedding model (mixed "
                    "dimensions across partitions)", column, p) for p, d in seen if d != reference][:SHOW]
