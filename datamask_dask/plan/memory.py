"""Memory budget of a selection task: parse it, find its default, size chunks and batches from it.

A selection task holds one partition and learns it chunk by chunk. Its working memory beyond
the partition itself is modelled as (float32 values, ``d`` the embedding dimension):

- bookkeeping, ``ROW_BYTES`` per row of the partition (quality, ids, group codes, sort orders,
  masks, chunk numbers, in the plan pass and the select pass): it cannot be chunked, so the
  budget must cover it;
- the chunk being learned, ``rows * d * 4 * CHUNK_COPIES`` bytes: that many copies of its
  embeddings are alive at once (the rows gathered from Arrow, the float32 matrix, the learner's
  normalised and eligible copies, the refinement pool);
- one learning step over a batch of ``b`` rows: ``n_rollout * b`` Gumbel keys, and while the
  rewards and gains of ``rollout_chunk`` rollouts are evaluated at once,
  ``rollout_chunk * b * d * 4 * STEP_COPIES`` bytes for DiSF (its standardised batch, centring
  and products) and user metrics, ``PAIR_COPIES`` instead of ``STEP_COPIES`` for Pair_simi, and
  for Facility the neighbour lists of its reference rows (``m`` of them: the chunk, or a sample
  of it, which is then a copy) and the largest of the phases that follow one another: the
  search's lists and block of products (``knn.SEARCH_PRODUCTS``), ``rollout_chunk`` rollouts'
  gathered neighbour values, and an evaluation's block (``metrics.facility.EVAL_PRODUCTS``).
  ``b`` is the whole chunk when the refinement stage is on (it learns its whole candidate pool,
  up to the chunk, in every step), else ``max_batch``.

Embeddings are validated in blocks of at most a quarter of the budget. The factors are
conservative: ``tests/plan/test_memory.py`` measures the peak resident memory of a partition
larger than its budget on CPU.

Only a budget the user gives sizes chunks: chunk and batch sizes change the result, so what the
cluster happens to have must not. Without an explicit ``memory_budget`` the workers' memory is
a limit that is checked, never obeyed (:func:`check_memory`): ``WORKER_SHARE`` of the smallest
per-thread memory limit of the current distributed cluster's workers (``memory_limit /
nthreads``), or, where less, a thread's share of what a worker's process leaves below Dask's
pause threshold, or, when learning on a GPU, ``GPU_SHARE`` of its free memory (a GPU's learners take
turns: :func:`datamask_dask.threads.one_learner_per_gpu`); on the
local schedulers with no GPU there is no limit. The check counts, beside the chunk, what a worker holds
of the partition itself while it is learned (``PARTITION_COPIES`` of its embeddings: as read, and
routed to its packs). A partition whose chunk does not fit in it fails
in the plan pass, with the chunk size that would fit, instead of running its workers out of memory;
and where a worker's own process leaves less than ``TASK_ROOM`` below Dask's pause threshold, the
job stops before its first task (a paused worker would leave it waiting for ever).
"""

from __future__ import annotations

import bisect
import contextlib
import inspect
import sys
from dataclasses import dataclass

from ..errors import OptionError
from ..learn.options import DataMaskOptions
from ..options import parse_budget

ROW_BYTES = 128  # bookkeeping per partition row (about a dozen int64/float64/bool arrays)
CHUNK_COPIES = 6  # float32 copies of a chunk's embeddings alive at once while it is learned
STEP_COPIES = 6  # (rollout_chunk x batch x d) float32 temporaries of a DiSF (or unknown) evaluation
PAIR_COPIES = 2  # the same for Pair_simi, which only gathers the selected rows
GOOD_CHUNK = 8192  # rows of a chunk worth lowering rollout_chunk and reference sizes for
PARTITION_COPIES = 2  # float32 copies of a partition's embeddings a worker holds: as read, and routed
WORKER_SHARE = 0.75  # of a worker thread's memory for its task (partition and chunk): the rest is Dask's own
GPU_SHARE = 0.8  # of a GPU's free memory when learning on it (one learner at a time)
TASK_ROOM = 128 * 2**20  # the least room a worker must leave a task for any partition to be read and learned


def resolve_budget(value, *, device: str = "auto", meta=None, scheduler=None) -> int | None:
    """The memory limit of each selection task, in bytes (None: no limit).

    An explicit ``value`` (the ``memory_budget`` option) is returned as given: the user's budget,
    which sizes chunks. Without one, the limit the workers' memory sets, which only checks them
    (:func:`check_memory`): that of the workers of ``scheduler`` where it is a distributed
    ``Client`` (by default the current default Client, if any), else the free memory of the GPU
    that ``device`` (or, with ``"auto"``, cuDF partitions in ``meta``) learns on.
    """
    budget = parse_budget(value)
    if budget is not None:
        return budget or None
    cudf = meta is not None and type(meta).__module__.split(".", 1)[0] == "cudf"
    on_gpu = device.startswith("cuda") or (device == "auto" and cudf)
    client = _client(scheduler)
    if client is not None:
        return _cluster_budget(client, on_gpu)
    free = _free_gpu_memory() if on_gpu else 0
    return int(GPU_SHARE * free) if free else None


def _client(scheduler):
    """The distributed Client whose workers run the tasks, by the rule the run's computations follow
    (:func:`datamask_dask.progress.client_of`); inside a task, with no ``scheduler``, None: the local
    defaults, never a wait on the scheduler."""
    from ..progress import client_of  # (it imports dask: the plan's sizing alone does not)

    if scheduler is None and "distributed" in sys.modules:
        from distributed import get_worker

        with contextlib.suppress(ValueError):
            get_worker()
            return None
    return client_of(scheduler)


def memory_room(client=None) -> int | None:
    """The memory a run's tasks share: the sum of the memory limits of ``client``'s workers (the
    distributed Client the run computes on), or, with none (the local schedulers), the machine's
    available memory; None where a worker has no limit."""
    if client is None:
        import psutil

        return int(psutil.virtual_memory().available)
    limits = [w.get("memory_limit") for w in _workers(client).values()]
    return sum(limits) if limits and all(limits) else None


def _workers(client) -> dict:
    """The scheduler's information on each of ``client``'s workers, by address."""
    takes_n_workers = "n_workers" in inspect.signature(client.scheduler_info).parameters
    info = client.scheduler_info(n_workers=-1) if takes_n_workers else client.scheduler_info()
    return info.get("workers", {})


def _cluster_budget(client, on_gpu: bool) -> int | None:
    workers = _workers(client)
    if on_gpu:
        free = client.run(_free_gpu_memory)
        shares = [free[address] * GPU_SHARE for address in workers if free.get(address)]
        return int(min(shares)) if shares else None
    limits = {address: w["memory_limit"] for address, w in workers.items() if w.get("memory_limit")}
    if not limits:
        return None
    least = _least_held(client.run(_process_memory))
    _check_room(limits, least)
    pause = _pause_fraction()
    # a task's share of the worker, and never more than its thread's share of what the process leaves
    # below the pause: past it the worker would pause (or be killed) instead of the job failing
    return int(min(min(limit * WORKER_SHARE, pause * limit - least.get(address, 0))
                   / max(1, workers[address].get("nthreads", 1)) for address, limit in limits.items()))


# The least resident memory seen of each worker process, by (address, pid): memory a finished job
# freed may stay resident, yet free for the next task, so a job rerun on the same workers (with the
# max_chunk_rows a refusal named) is checked against the room the first run found.
_LEAST_HELD: dict[tuple[str, int], int] = {}


def _least_held(held: dict) -> dict:
    """``{address: (pid, resident bytes)}`` as ``{address: the least resident bytes seen of its process}``."""
    least = {}
    for address, (pid, rss) in held.items():
        key = (address, pid)
        _LEAST_HELD[key] = least[address] = min(rss, _LEAST_HELD.get(key, rss))
    return least


def _check_room(limits: dict, held: dict) -> None:
    """Raise ``OptionError`` where a worker's process, before any task, already holds nearly all that its
    memory limit allows below Dask's pause threshold: there a task would pause the worker, and the job
    would wait for ever, or kill it, worker after worker."""
    from dask.utils import format_bytes

    pause = _pause_fraction()
    for address, limit in limits.items():
        used = held.get(address, 0)
        if pause * limit - used < TASK_ROOM:
            raise OptionError(
                f"the workers' memory is too small for any selection task: worker {address} has a "
                f"memory_limit of {format_bytes(limit)}, its process holds {format_bytes(used)} before a "
                f"task starts, and Dask pauses a worker at {pause:.0%} of its limit. Give the workers more "
                f"memory (at least {format_bytes(int((used + TASK_ROOM) / pause) + 1)} each); "
                "memory_budget= and max_chunk_rows= cannot help while a worker has no room for a task")


def _pause_fraction() -> float:
    """The share of its memory limit at which Dask pauses a worker (or, without a pause, stops it)."""
    import dask

    fractions = [dask.config.get(f"distributed.worker.memory.{name}", default=False)
                 for name in ("pause", "terminate")]
    return min((float(f) for f in fractions if f), default=1.0)


def _process_memory() -> tuple[int, int]:
    """A worker process's id and resident memory, with the libraries a selection task imports loaded:
    a fresh worker holds a fraction of what it holds once its first task has imported them."""
    import os

    import numba  # noqa: F401
    import psutil
    import pyarrow.parquet  # noqa: F401
    import torch  # noqa: F401

    return os.getpid(), int(psutil.Process().memory_info().rss)


def _free_gpu_memory() -> int:
    import torch

    return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class MemoryPlan:
    """Chunk and learner sizes that keep one partition's selection within a budget."""

    max_chunk_rows: int
    options: DataMaskOptions


def plan_memory(budget: int | None, n_rows: int, dim: int, options: DataMaskOptions,
                max_chunk_rows: int, device: str = "cpu") -> MemoryPlan:
    """Size chunks and learner batches for a partition of ``n_rows`` rows of ``dim``-d embeddings,
    learned on ``device``.

    ``budget``: bytes of working memory allowed beyond the partition itself (None: no bound, the
    values given are returned unchanged). The largest chunk up to ``max_chunk_rows`` that fits is
    kept as long as it holds at least ``GOOD_CHUNK`` rows (or ``max_chunk_rows``); below that,
    ``rollout_chunk`` is lowered first (it changes only speed), then Facility's reference sizes
    (``reference_size``, ``refine_reference``); none is ever raised. Raises ``OptionError`` where
    not even a chunk of 2 rows fits.
    """
    if not budget:
        return MemoryPlan(int(max_chunk_rows), options)
    dim = max(int(dim), 1)
    metrics = metric_kinds(options)
    work = budget - n_rows * ROW_BYTES
    rollouts = min(options.rollout_chunk, options.n_rollout)  # the learner never evaluates more at once
    reference, refine_reference = options.reference_size, options.refine_reference
    wanted = min(int(max_chunk_rows), GOOD_CHUNK)
    while True:
        rows = _largest_chunk(work, int(max_chunk_rows), dim, options, rollouts, reference, refine_reference,
                              metrics, device)
        if rows >= wanted:
            break
        if rollouts > 1:
            rollouts = max(1, rollouts // 2)
        elif "facility" in metrics and max(reference, refine_reference) > options.neighbours:
            reference = max(options.neighbours, reference // 2)
            refine_reference = max(options.neighbours, refine_reference // 2)
        elif rows >= 2:
            break  # as small as the learner's settings go: take the chunk that fits
        else:
            raise _too_small(budget, n_rows, dim)
    changes = {name: value for name, value in (("rollout_chunk", rollouts), ("reference_size", reference),
                                                ("refine_reference", refine_reference))
               if value != getattr(options, name)}
    return MemoryPlan(rows, options.replace(**changes) if changes else options)


def check_memory(limit: int | None, n_rows: int, dim: int, options: DataMaskOptions, chunk_rows: int,
                 where: str = "a partition", device: str = "cpu", packed: bool = False) -> None:
    """Raise ``OptionError`` when ``n_rows`` rows (``PARTITION_COPIES`` of their embeddings, held while
    they are learned) and a chunk of ``chunk_rows`` of them, learned with ``options``, do not fit in
    the workers' ``limit``, naming ``max_chunk_rows`` (the largest chunk that fits; where none does,
    smaller partitions) and ``memory_budget``: the limit never changes the chunks, so the job stops
    before learning. ``packed``: the rows are a pack's, gathered up to a chunk, so that a smaller
    ``max_chunk_rows`` makes them fewer too."""
    if not limit:
        return
    need = task_bytes(n_rows, dim, options, chunk_rows, device)
    if need <= limit:
        return
    fits = bisect.bisect_left(range(1, chunk_rows + 1), True, key=lambda rows: task_bytes(
        rows if packed else n_rows, dim, options, rows, device) > limit)
    remedy = (f"set max_chunk_rows={fits} (a different chunking selects different rows)" if fits >= 2 else
              "split the input into smaller partitions (ddf.repartition(npartitions=...))")
    raise OptionError(
        f"{where}: the workers' memory is too small for this selection: {n_rows} rows learned in chunks "
        f"of {chunk_rows} rows of {max(int(dim), 1)}-d embeddings need about {need} bytes per task, and the "
        f"workers leave each task {limit} bytes. Give the workers more memory (or fewer threads each), "
        f"{remedy}, or set memory_budget= to let a budget of your choice size the chunks")


def task_bytes(n_rows: int, dim: int, options: DataMaskOptions, chunk_rows: int, device: str = "cpu") -> int:
    """Modelled peak bytes of a task learning ``n_rows`` rows of ``dim``-d embeddings in chunks of
    ``chunk_rows`` with ``options`` on ``device``: the rows it holds, and the chunk learned."""
    dim = max(int(dim), 1)
    return _held_bytes(n_rows, dim) + chunk_bytes(
        chunk_rows, dim, options, min(options.rollout_chunk, options.n_rollout), options.reference_size,
        options.refine_reference, metric_kinds(options), device)


def _held_bytes(n_rows: int, dim: int) -> int:
    """What a worker holds of a partition's rows while they are learned, whatever the chunks."""
    return n_rows * (ROW_BYTES + PARTITION_COPIES * 4 * dim)


def chunk_bytes(rows: int, dim: int, options: DataMaskOptions, rollouts: int, reference: int,
                refine_reference: int, metrics: tuple, device: str = "cpu") -> int:
    """Modelled peak bytes of learning one chunk of ``rows`` rows on ``device`` (see the module notes).

    A step's batch is at most ``max_batch`` rows, but the refinement stage takes its whole
    candidate pool (up to ``refine x k`` rows, i.e. up to the chunk) in every step: with
    ``refine`` on, the batch is modelled as the whole chunk. ``metrics`` holds the kinds of the
    diversity metrics (:func:`metric_kinds`); they run one after the other, so the largest counts.
    """
    from ..learn.engine import HOLDOUT_ROWS
    from ..learn.knn import SEARCH_PRODUCTS  # (torch: imported when a chunk is sized, not with the package)
    from ..learn.metrics.facility import EVAL_PRODUCTS

    batch = rows if options.refine else min(rows, options.max_batch)
    need = rows * (CHUNK_COPIES * 4 * dim + 64) + options.n_rollout * batch * 24
    step = 0
    for kind in metrics:
        if kind == "facility":
            t = options.neighbours
            m = min(rows, max(reference, refine_reference if options.refine else 0))
            graph = m * t * 12 + (m * 4 * dim if m < rows else 0)  # the graph; a sampled reference copied
            # then the largest of its phases: the search (its lists twice while they are reordered, a block of
            # products, the graph converted from them), the steps (each rollout's gathered values), and an
            # evaluation (a sampled reference is checked on rows apart from it, copied, each meeting 2k rows)
            search = m * options.probes * t * 16 + min(SEARCH_PRODUCTS, m * rows) * 4 + m * t * 12
            if device == "cpu" and m == rows:  # facility_cpu's compiled step: no (rollouts, m, t) temporaries
                steps = rollouts * (m * 4 + batch * 16) + m * 12
            else:
                steps = rollouts * (m * t * 16 + batch * 16)
            held = min(rows, HOLDOUT_ROWS)
            evaluation = held * 4 * dim + min(EVAL_PRODUCTS, held * rows) * 4 \
                if m < rows or options.lamb_scale == "gain" else 0
            cost = graph + max(search, steps, evaluation)
        else:  # Pair_simi gathers the selected rows (at most the batch); DiSF and unknown metrics more
            copies = PAIR_COPIES if kind == "pair" else STEP_COPIES
            cost = rollouts * batch * (copies * 4 * dim + 64)
        step = max(step, cost)
    return need + step


def metric_kinds(options: DataMaskOptions) -> tuple:
    """``"pair"``, ``"facility"`` or ``"other"`` for each diversity metric of the options."""
    from ..learn.metrics import Facility, PairSimi, build_metrics

    return tuple("facility" if isinstance(metric, Facility) else "pair" if type(metric) is PairSimi
                 else "other" for metric, _ in build_metrics(options.metric_weights))


def _largest_chunk(work: int, limit: int, *args) -> int:
    """Largest chunk (<= ``limit`` rows) whose :func:`chunk_bytes` (``args`` after the rows) fit in
    ``work``; 0 if none. The model grows with the rows: bisect."""
    return bisect.bisect_left(range(1, limit + 1), True, key=lambda rows: chunk_bytes(rows, *args) > work)


def _too_small(budget: int, n_rows: int, dim: int) -> OptionError:
    floor = n_rows * ROW_BYTES + 64 * (CHUNK_COPIES + STEP_COPIES) * 4 * dim
    return OptionError(
        f"memory_budget={budget} bytes is too small for a partition of {n_rows} rows with {dim}-d "
        f"embeddings (it needs at least about {floor} bytes, {ROW_BYTES} per row for bookkeeping): raise "
        "memory_budget, or split the input into smaller partitions (ddf.repartition(npartitions=...))")
