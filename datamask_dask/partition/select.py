"""The select step of one partition: eligible rows, chunks, the learner, ``selected``.

Engine-agnostic: :func:`select_partition` takes a pandas or cuDF frame and the plan of
:mod:`datamask_dask.plan.reduce`; the Dask operator maps it over partitions, the Spark
integration calls it inside ``mapInArrow``. Rows the plan lists as shadowed (near-duplicates of a
better row, ``diversity_scope="table"``) are ineligible: never selected, score ``-inf``; the row
kept for each group stands for it (the plan's ``weights``), which the learner's Facility counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import telemetry
from ..errors import InputDataError, OptionError
from ..learn.engine import learn_mask
from ..plan.memory import MemoryPlan, check_memory, plan_memory
from ..plan.quotas import fit_budget, split_budget, split_quota
from ..plan.types import Cell, Plan
from . import adapters, explain
from .checks import check_vectors, group_codes, quality_values, token_values
from .spec import SelectSpec


@dataclass(kw_only=True)
class _Partition:
    """One partition's select task: its inputs, and the output columns its cells fill in."""

    frame: object
    number: int
    plan: Plan
    source: object  # the embedding rows (adapters.embedding_source)
    quality: np.ndarray
    tokens: np.ndarray | None
    device: str
    memory: MemoryPlan
    weights: np.ndarray | None  # how many rows each row stands for (near-duplicate groups), or None
    selected: np.ndarray
    scores: np.ndarray | None
    reasons: np.ndarray | None  # explain: each row's reason code (explain.REASONS), set as steps decide

    @property
    def spec(self) -> SelectSpec:
        return self.plan.spec


def select_partition(frame, plan: Plan, partition_info=None):
    """Add ``selected`` (and the score column) to one partition, following the plan."""
    spec = plan.spec
    number = partition_info["number"] if partition_info is not None else 0
    where = f"partition {number}"
    n = len(frame)
    planned = plan.rows[number] if number < len(plan.rows) else 0
    if n != planned:
        raise InputDataError(
            f"{where} has {n} rows now but had {planned} when quotas were planned: the input must give "
            "the same rows each time it is computed (persist() it, or fix the non-deterministic step "
            "before datamask_select)")
    selected = np.zeros(n, dtype=bool)
    scores = np.full(n, np.nan, dtype=np.float32) if spec.score_column else None
    # explain: rows of no cell (a group whose quota is 0 everywhere) had no quota
    reasons = np.full(n, explain.QUOTA_EXHAUSTED, dtype=np.int8) if spec.explain else None
    cells = plan.cells_of(number)
    if n and cells:
        adapters.require_columns(frame, spec.select_columns, where)
        source = adapters.embedding_source(frame[spec.embedding_column], where, plan.dim)
        quality = quality_values(frame, spec, where)
        tokens = token_values(frame, spec, where) if spec.budget is not None else None
        codes, labels = group_codes(frame, spec, where)
        device = _resolve_device(spec.device, frame, where)
        memory = plan_memory(spec.memory_budget, n, source.dim, spec.options, spec.max_chunk_rows)
        check_memory(spec.memory_limit, n, source.dim, memory.options, min(memory.max_chunk_rows, n), where)
        weights = None
        if number in plan.weights:
            kept, counts = plan.weights[number]
            weights = np.ones(n, dtype=np.float64)
            weights[kept] = counts
        part = _Partition(frame=frame, number=number, plan=plan, source=source, quality=quality,
                          tokens=tokens, device=device, memory=memory, weights=weights, selected=selected,
                          scores=scores, reasons=reasons)
        code_of = {label: code for code, label in enumerate(labels)}
        visible = np.ones(n, dtype=bool)
        shadowed = plan.shadowed.get(number)
        if shadowed is not None and len(shadowed):
            visible[shadowed] = False  # near-duplicates of a better row elsewhere: ineligible
            if scores is not None:
                scores[shadowed] = -np.inf
            if reasons is not None:
                reasons[shadowed] = explain.NEAR_DUPLICATE
        for cell in cells:
            rows = np.flatnonzero((codes == code_of[cell.label]) & visible)
            _select_cell(part, cell, rows, where if spec.by is None else f"{where}, group {cell.label!r}")
    columns = {spec.selected_column: selected}
    if spec.score_column:
        columns[spec.score_column] = scores
    if reasons is not None:
        reasons[selected] = explain.SELECTED
        columns.update(explain.explain_columns(frame, spec.id_column, reasons, plan.explain.get(number)))
    return frame.assign(**columns)


def _select_cell(part: _Partition, cell: Cell, rows: np.ndarray, context: str) -> None:
    """Select inside one group of one partition: eligible rows, chunks, learner, budget."""
    quality, tokens, scores, reasons = part.quality, part.tokens, part.scores, part.reasons
    order = np.argsort(-quality[rows], kind="stable")
    eligible = np.sort(rows[order[:cell.eligible]])
    if scores is not None:
        scores[rows] = -np.inf
        scores[eligible] = np.nan
    if reasons is not None:
        reasons[rows] = explain.QUALITY_PRUNED
        reasons[eligible] = explain.QUOTA_EXHAUSTED
    if eligible.size == 0 or (cell.quota == 0 if cell.budget is None else cell.budget == 0):
        return
    n_chunks = math.ceil(eligible.size / part.memory.max_chunk_rows)
    chunk_of_row = np.arange(eligible.size) * n_chunks // eligible.size  # contiguous, near-equal
    if cell.budget is None:
        quotas = split_quota(quality[eligible], chunk_of_row, n_chunks, cell.quota, part.spec.oversample)
        budgets = None
    else:
        budgets, quotas = split_budget(quality[eligible], tokens[eligible], chunk_of_row, n_chunks,
                                       cell.budget, part.spec.oversample)
    for chunk_number in range(n_chunks):
        chunk = eligible[chunk_of_row == chunk_number]
        k = int(quotas[chunk_number])
        mask = np.zeros(chunk.size, dtype=bool)
        preference = quality[chunk]
        where = context if n_chunks == 1 else f"{context}, chunk {chunk_number}"
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
            mask = fit_budget(mask, tokens[chunk], preference, budgets[chunk_number])
        part.selected[chunk[mask]] = True
    if cell.budget is not None and n_chunks > 1:
        # Chunks round their budgets down separately: spend what is left on the best rows that fit.
        part.selected[eligible] = fit_budget(part.selected[eligible], tokens[eligible], quality[eligible],
                                             cell.budget)


def derive_seed(seed: int, partition: int, group: int, chunk: int) -> int:
    """Seed of one learner run, from (seed, partition, group, chunk) only: where it runs never matters."""
    sequence = np.random.SeedSequence([int(seed) % 2**64, partition, group, chunk])
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


def _learn(part: _Partition, cell: Cell, chunk: np.ndarray, k: int, chunk_number: int, where: str):
    spec, options = part.spec, part.memory.options
    with telemetry.timed("extract"):
        embeddings = part.source.rows(chunk)  # our own copy
    if spec.validate != "full":  # "full" checked every row in the plan pass
        norms = check_vectors(embeddings, chunk, part.frame, spec, where)
        if isinstance(embeddings, np.ndarray):
            embeddings /= norms[:, None]  # in place: the learner finds unit rows and copies nothing
    try:
        with telemetry.timed("learn"), telemetry.learning(where):
            result = learn_mask(part.quality[chunk], embeddings, k, options, device=part.device,
                                quality_range=part.plan.ranges[cell.group],
                                weights=None if part.weights is None else part.weights[chunk],
                                seed=derive_seed(options.seed, part.number, cell.group, chunk_number))
        telemetry.note_curve(where, result.history)  # for the run summary's learning curves
        return result
    except InputDataError as exc:
        raise InputDataError(f"{where}: {exc}") from exc


def _resolve_device(device: str, frame, where: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if adapters.is_cudf(frame) and torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise OptionError(f"{where}: device={device!r} but torch on this worker sees no CUDA device; use "
                          "device='auto' or 'cpu'")
    return device
