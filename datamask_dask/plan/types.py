"""The plan: the contract the reduction hands every partition's select task, on Dask and on Spark.

It is small (a few numbers per partition and group, and the positions of the rows near-duplicates
set aside) and read-only: one copy travels to every task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import astuple, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from .context import Context, Picks
from .quotas import Sketch

if TYPE_CHECKING:  # the spec is the partition room's; the plan only carries it
    from ..partition.spec import SelectSpec


@dataclass(frozen=True)
class CellSummary:
    """One group's rows in one partition, as the reduction plans them (no row leaves the worker)."""

    sketch: Sketch  # quality sketch of the rows that remain (near-duplicates set aside)
    min: float  # the group's quality range in the partition
    max: float
    n: int  # rows in all
    # with near-duplicates set aside (table scope): the sketch of every row (the fallback when too
    # few rows remain for the quota), the set-aside rows' positions, and the positions of the kept
    # rows that stand for a group of copies with the group sizes
    sketch_all: Sketch | None = None
    shadowed: np.ndarray | None = None
    kept: np.ndarray | None = None
    weights: np.ndarray | None = None


@dataclass(frozen=True)
class PartitionSummary:
    """One partition's contribution to the plan, after its checks."""

    n: int  # rows
    cells: Mapping[object, CellSummary]  # group label -> its rows here
    dim: int | None  # the embedding dimension read (None: not read)
    digest: str = ""  # the content digest of the columns read
    stages: Mapping[str, float] = field(default_factory=dict)  # seconds of the plan pass's stages
    links: dict | None = None  # explain: near-duplicates' parents (checks.duplicate_links)
    sample: np.ndarray | None = None  # pieces="regions": evenly spaced unit rows, for the centroids
    moments: np.ndarray | None = None  # pieces="context": sums of the unit rows and their squares (2, d)


EMPTY_SUMMARY = PartitionSummary(n=0, cells={}, dim=None)


@dataclass(frozen=True)
class Cell:
    """One group's share of one partition: what its select task learns there."""

    label: object  # the group's label (None without ``by``)
    group: int  # the group's index in the table-wide order (it keys ``Plan.ranges``)
    eligible: int  # rows of the cell the table-wide quality pool leaves eligible
    quota: int  # rows to select
    budget: int | None  # tokens to select (a token budget), else None


@dataclass(frozen=True)
class Pack:
    """A group's cells in consecutive partitions whose eligible rows fit in one chunk together: they are
    learned as one partition of those rows (``partition.select.learn_pack``), their quotas summed.

    Or, with ``pieces="regions"``, areas of the table (:mod:`datamask_dask.plan.regions`) learned as
    one: its members are every partition with eligible rows, each giving its rows routed to these
    areas. While the quotas are shared each region (its areas) is a pack, quota -1; then
    :func:`~datamask_dask.plan.reduce.share_regions` shares the quota and packs neighbouring areas up
    to a chunk's worth of rows.

    Or, with ``pieces="context"``, one of the pieces the table's eligible rows are dealt to
    (:func:`datamask_dask.plan.context.deal`): its members are the partitions of its strip with
    eligible rows."""

    label: object
    group: int
    partitions: tuple[int, ...]  # ascending: two or more (a region's or a dealt piece's: one or more)
    quota: int
    budget: int | None
    areas: tuple[int, ...] = ()  # pieces="regions": the areas it learns
    dealt: int | None = None  # pieces="context": the piece it learns, its index among the plan's packs

    @property
    def routed(self) -> bool:
        """Whether each member routes its rows to it (regions, dealt pieces), rather than giving its cell."""
        return bool(self.areas) or self.dealt is not None

    @property
    def seed_place(self) -> int | None:
        """What tells its chunks' seeds from other packs' of the same first member: its first area, or the
        piece it learns (None: a pack of cells, the only one of its first member)."""
        return self.areas[0] if self.areas else self.dealt

    def name(self, grouped: bool) -> str:
        """How messages, progress and curves name the pack (``grouped``: the selection has ``by``)."""
        if self.dealt is not None:
            return f"piece {self.dealt}"
        if self.areas:
            more = len(self.areas) - 1
            return f"area {self.areas[0]}" + (f" and {more} more" if more else "")
        where = f"partitions {self.partitions[0]}-{self.partitions[-1]}"
        return f"{where}, group {self.label!r}" if grouped else where


@dataclass(frozen=True)
class Plan:
    """Exact quotas (or token budgets) per partition and group, and what every task needs beside them."""

    spec: SelectSpec
    cells: Mapping[int, tuple[Cell, ...]]  # partition -> its cells (partitions with no rows: none)
    rows: tuple[int, ...]  # rows per partition when planned (a task checks its partition still has them)
    dim: int | None  # the embedding dimension (None: no embedding was read)
    ranges: Mapping[int, tuple[float, float]]  # group -> table-wide quality (min, max)
    # partition -> sorted positions of its rows set aside as near-duplicates of a better row
    shadowed: Mapping[int, np.ndarray] = field(default_factory=dict)
    # partition -> (positions of its kept rows that stand for a group of copies, the group sizes)
    weights: Mapping[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    digests: tuple[str, ...] = ()  # each partition's content digest, as the plan pass read it
    stages: Mapping[str, float] = field(default_factory=dict)  # seconds of the plan pass's stages
    # explain=True: partition -> its near-duplicates' positions, the ids of the rows they stand
    # behind and the estimated cosine (reduce.duplicate_links)
    explain: Mapping[int, dict] = field(default_factory=dict)
    packs: tuple[Pack, ...] = ()  # cells learned together (reduce.pack_cells), or the regions
    centroids: np.ndarray | None = None  # pieces="regions": each region's unit centroid (float32)
    areas: np.ndarray | None = None  # and each area's (plan.regions.find_areas), for the quotas' curves
    area_region: np.ndarray | None = None  # each area's region
    # Pair_simi in regions, per pack: the sum of the unit rows the other packs are planned to select,
    # and how many (reduce.share_regions), which its learner learns the table's similarity with
    others: tuple[tuple[np.ndarray, int], ...] = ()
    # pieces="context" (DiSF): the table's moments, its first round's picks and the share of pieces learned in
    # context (plan.context)
    context: Context | None = None

    def cells_of(self, partition: int) -> tuple[Cell, ...]:
        return self.cells.get(partition, ())

    def pack_of(self, partition: int, group: int) -> int | None:
        """The index of the pack that learns this partition's cell of ``group``, or None (regions:
        :meth:`packs_of`)."""
        return self._packed.get((partition, group))

    def packs_of(self, partition: int) -> tuple[int, ...]:
        """The indices of the packs this partition is a member of."""
        return self._members.get(partition, ())

    @cached_property
    def _members(self) -> dict:
        out: dict[int, list[int]] = {}
        for index, pack in enumerate(self.packs):
            for partition in pack.partitions:
                out.setdefault(partition, []).append(index)
        return {partition: tuple(indices) for partition, indices in out.items()}

    @property
    def pending(self) -> bool:
        """Whether a pass over the rows must run before the select pass: the regions' quotas are still
        to be shared (``plan.reduce.share_regions``), or a round of the context to be learned
        (:meth:`with_round`)."""
        regions = any(pack.quota < 0 for pack in self.packs)
        return regions or (self.context is not None and self.context.pending)

    def with_round(self, picks: Picks) -> Plan:
        """This plan with its context's next round (:meth:`~datamask_dask.plan.context.Context.then`)."""
        if self.context is None:
            raise RuntimeError("Plan.with_round: the plan has no context; please report this with the run "
                               "record")
        found, stage = self.context.then(picks, self.spec.options.lamb)
        stages = {**self.stages, stage: self.stages.get(stage, 0.0) + picks.seconds}
        return dataclasses.replace(self, context=found, stages=stages)

    @property
    def pieces(self) -> dict:
        """How the table was cut for the learner, for the run record: ``"regions"`` (and how many),
        ``"context"`` (and the share of pieces learned in it), or ``"partitions"`` (each partition's
        chunks, small consecutive partitions packed together; a table one chunk holds is one)."""
        if self.centroids is not None:
            return {"cut": "regions", "regions": int(self.centroids.shape[0])}
        if self.context is not None:
            return {"cut": "context", "pieces": len(self.packs), "share in context": self.context.share}
        return {"cut": "partitions"}

    @property
    def regional(self) -> bool:
        """Whether the table is learned in regions (every eligible row in its region's pack)."""
        return self.centroids is not None

    @property
    def routed(self) -> bool:
        """Whether every eligible row is routed to a pack: its region's, or the piece it is dealt to."""
        return self.regional or self.context is not None

    def dealt(self, partition: int) -> tuple[int, tuple[int, ...]]:
        """Where the dealing of the partition's eligible rows starts (the eligible rows of its strip's
        partitions before it), and the pieces of its strip, by pack index."""
        return self._dealt[partition]

    @cached_property
    def _dealt(self) -> dict:
        out = {}
        for strip in dict.fromkeys(pack.partitions for pack in self.packs):  # a strip's pieces share members
            dealt = 0
            for partition in strip:
                out[partition] = dealt, self.packs_of(partition)
                dealt += sum(cell.eligible for cell in self.cells[partition])
        return out

    @cached_property
    def _packed(self) -> dict:
        return {(p, pack.group): index for index, pack in enumerate(self.packs) if not pack.routed
                for p in pack.partitions}

    def pack_of_area(self) -> np.ndarray:
        """Each area's pack index (-1: an area no pack learns, its quota 0)."""
        return self._area_packs

    @cached_property
    def _area_packs(self) -> np.ndarray:
        out = np.full(0 if self.areas is None else len(self.areas), -1, dtype=np.int64)
        for index, pack in enumerate(self.packs):
            out[list(pack.areas)] = index
        return out

    def seed_number(self, partition: int) -> int:
        """The partition's place among the partitions with rows: what its learners' seeds derive from, so
        that empty partitions (Spark's file splits, a filter's leftovers) never change the rows selected."""
        return self._seed_numbers[partition]

    @cached_property
    def _seed_numbers(self) -> dict:
        return {p: rank for rank, p in enumerate(p for p, n in enumerate(self.rows) if n)}

    @property
    def planned(self) -> int:
        """Rows the plan selects (with token budgets: the quotas the budgets were split by)."""
        return sum(max(cell.quota, 0) for cells in self.cells.values() for cell in cells)

    @property
    def eligible(self) -> int:
        """Rows the plan may select: every cell's eligible rows."""
        return sum(cell.eligible for cells in self.cells.values() for cell in cells)

    def identity(self) -> dict:
        """What decides the rows selected, as plain data: quotas, quality ranges and dimension."""
        out = {"cells": {p: [list(astuple(c)) for c in cells] for p, cells in self.cells.items()},
               "ranges": dict(self.ranges), "dim": self.dim}
        if self.regional:  # the regions' quotas come from their curves, not from the cells
            out["areas"] = [[list(pack.areas), pack.quota] for pack in self.packs]
        if self.context is not None:  # and what the pieces learn against
            out["context"] = self.context.identity()
        return out
