"""Which way of learning a table in pieces keeps the selection as good as learning it whole (issue 52):
each way simulated on one process with the package's learner (``learn_mask``, CPU, the CLI's
options for the metric), scored with the yardstick over every row of the table.

The tables are the quality cases (``tables.CASES``); each file is a piece, its rows in file order. As the
CLI does by default, near-duplicates are set aside first (``diversity_scope="table"``: the package's
own search) and a kept row stands for its group; ``k = round(ratio * rows)``; every piece holds at
most the case's ``max_chunk_rows`` rows (a larger group is cut into contiguous chunks whose quotas
``split_quota`` sets, as ``partition.select`` does). The ways:

- ``pieces``: main's way. Each file learns its quota, the quotas by quality mass
  (``plan.quotas.split_quota`` on the eligible rows: the table-wide quality top ``oversample * k``).
- ``pieces, greedy quotas``: the same pieces, quotas in proportion to each file's share of lazy
  greedy's picks on a uniform sample of the table (greedy picks the best marginal gain across every
  file at each step, so the quotas equalise marginal gains); the learner still selects.
- ``2 rounds, c = C``: (a), as in RandGreeDi. Each file learns ``C x`` its quota as candidates, then
  one learner over the union of candidates picks ``k``, with the union's own quality range
  (``table range``: the table's) or, ``weighted``, each candidate standing for the table's rows
  nearest it (Facility's coverage then counts the whole table; the other metrics do not use weights).
- ``clusters``: (b), simplified. Spherical k-means of the table (``suite.data.topic_labels``) into as
  many clusters as files; each cluster is a piece, its quota by quality mass or by greedy's picks on
  the sample, as above.
- ``cells x C``: the same, with ``C`` times as many clusters as files (pieces closer to the table's own
  clusters), greedy's quotas.
- ``context``: (c). The pieces first learn apart; then each re-learns its quota against what the
  others' picks already give the table, in two phases (half the pieces, then the other half, so that
  no two neighbours re-learn against each other's old picks at once). Facility's rows start from
  their best similarity to the others' picks (a floor, exact here); Pair_simi's sum of unit vectors
  and count start from theirs. DiSF standardises every piece's features by the table's mean and std
  (its own would hide what sets the piece apart), and in the second phase adds the others' picks'
  second moment to its own, its rewards and gains scaled by the union's rows over the piece's, so
  that they weigh against the quality term as the union's objective does.
- ``table moments``: DiSF's first round of ``context`` alone (each piece apart, the table's mean and
  std), one pass.
- ``context, shares``: DiSF's ``context`` with quotas that follow the objective. After the first
  round, each piece's picks give its second moment per row; the quotas are then the shares that
  maximise the union's objective if each piece's picks kept that moment (``plan.regions.share_pairs``:
  DiSF's squared off-diagonal mass is Pair_simi's ``|w|^2`` over the moments' off-diagonal entries),
  and each piece re-learns its share against the others' moments at their shares.
- ``greedy per piece``: each file picks its quota by lazy greedy, not the learner: what splitting the
  table costs whatever learns the pieces.
- ``one piece``: the whole table learned at once (the ceiling).

Seconds are the learner's, summed over its runs, plus the way's own planning (k-means, greedy on the
sample, the candidates' weights); the near-duplicate search and the scoring are not counted.

    python benchmarks/bench_rounds.py --json benchmarks/results/rounds.json
    python benchmarks/bench_rounds.py --case 24k-d64-topics --metrics Pair_simi --lambs 0
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass

import numpy as np
import record  # noqa: E402
import torch
from suite.data import layout_order, topic_labels  # noqa: E402
from tables import CASES, dataset

from datamask_dask.config import resolve_options  # noqa: E402
from datamask_dask.dedup.search import find_groups  # noqa: E402
from datamask_dask.dedup.simhash import hyperplanes, signatures  # noqa: E402
from datamask_dask.learn.baselines import lazy_greedy  # noqa: E402
from datamask_dask.learn.engine import learn_mask  # noqa: E402
from datamask_dask.learn.knn import top_neighbours  # noqa: E402
from datamask_dask.learn.metrics.base import EVERY_ROW, mean_one, weighted_mean  # noqa: E402
from datamask_dask.learn.metrics.disf import TableMoments  # noqa: E402
from datamask_dask.learn.metrics.facility import Facility, FacilityState  # noqa: E402
from datamask_dask.learn.metrics.pair_simi import PairSimi, selection_sums  # noqa: E402
from datamask_dask.learn.yardstick import GREEDY_MAX_WORK, measure_all  # noqa: E402
from datamask_dask.partition.select import derive_seed  # noqa: E402
from datamask_dask.plan.quotas import allocate, split_quota  # noqa: E402
from datamask_dask.plan.regions import share_pairs  # noqa: E402

RATIO = 0.1
OVERSAMPLE = 2.0  # the CLI's default candidate pool of the quality-mass quotas
DUPLICATE_COSINE = 0.95  # the CLI's default near-duplicate threshold
GREEDY_SAMPLE_ROWS = 4000  # rows of the uniform sample whose greedy picks set the greedy quotas


@dataclass
class Table:
    """A case's rows (in id order, as the yardstick scores them) and what every way starts from."""

    quality: np.ndarray
    emb: np.ndarray  # unit rows
    eligible: np.ndarray  # rows not set aside as near-duplicates, in file order
    weights: np.ndarray  # rows of the table each row stands for (its near-duplicate group)
    file_of: np.ndarray  # each row's file
    files: int
    k: int
    max_rows: int  # rows a piece holds at most

    @property
    def quality_range(self) -> tuple[float, float]:
        return float(self.quality.min()), float(self.quality.max())


@dataclass
class Selection:
    rows: np.ndarray
    seconds: float


def prepare(case: str) -> Table:
    """The case's table as ``dataset`` writes it, its files and near-duplicate groups."""
    shape = CASES[case]
    _, quality, emb = dataset(case)
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    order = layout_order(emb, shape.layout, shape.clusters)
    order = np.arange(len(quality)) if order is None else order
    file_of = np.empty(len(quality), dtype=np.int64)
    for number, rows in enumerate(np.array_split(order, shape.files)):
        file_of[rows] = number
    part = {"quality": quality.astype(np.float64), "codes": np.zeros(len(quality), dtype=np.int64),
            "labels": [None], "signatures": signatures(emb, hyperplanes(emb.shape[1]))}
    (groups,) = find_groups([part], DUPLICATE_COSINE)
    weights = np.ones(len(quality))
    weights[groups.kept] = groups.weights
    visible = np.ones(len(quality), dtype=bool)
    visible[groups.shadowed] = False
    max_rows = shape.max_chunk_rows or -(-shape.rows // shape.files)
    return Table(quality, emb, order[visible[order]], weights, file_of, shape.files,
                 round(RATIO * len(quality)), max_rows)


def options_for(metric: str, lamb: float):
    """The learner's options as the CLI forms them for ``metric`` (prune is the plan's, table-wide)."""
    return resolve_options(None, algorithm=metric, lamb=lamb, device="cpu").learner.replace(prune=0.0)


def learn(table: Table, rows: np.ndarray, k: int, options, seed_number: int, quality_range=None,
          weights=None, moments: TableMoments | None = None) -> Selection:
    """``k`` of ``rows`` chosen by the learner (all of them where ``k`` reaches their count)."""
    if k <= 0:
        return Selection(rows[:0], 0.0)
    if k >= rows.size:
        return Selection(rows, 0.0)
    started = time.perf_counter()
    result = learn_mask(table.quality[rows], table.emb[rows], k, options, quality_range=quality_range,
                        weights=table.weights[rows] if weights is None else weights, moments=moments,
                        seed=derive_seed(options.seed, seed_number, 0, 0))
    return Selection(rows[result.mask], time.perf_counter() - started)


def learn_apart(table: Table, options, group_of: np.ndarray, quotas: np.ndarray) -> Selection:
    """Each group of the eligible rows learns its quota, blind to the others, in contiguous chunks of at
    most ``table.max_rows`` rows whose quotas ``split_quota`` sets (as ``partition.select`` does)."""
    picked, seconds, seed_number = [], 0.0, 0
    for group, quota in enumerate(quotas):
        rows = table.eligible[group_of == group]
        if not rows.size:
            continue
        n_chunks = -(-rows.size // table.max_rows)
        chunk_of_row = np.arange(rows.size) * n_chunks // rows.size
        chunk_quotas = split_quota(table.quality[rows], chunk_of_row, n_chunks, int(quota), OVERSAMPLE)
        for chunk, chunk_quota in enumerate(chunk_quotas):
            selection = learn(table, rows[chunk_of_row == chunk], int(chunk_quota), options, seed_number,
                              table.quality_range)
            picked.append(selection.rows)
            seconds += selection.seconds
            seed_number += 1
    return Selection(np.concatenate(picked), seconds)


def quality_mass_quotas(table: Table, group_of: np.ndarray, groups: int, k: int) -> np.ndarray:
    """Quotas as ``plan.quotas`` sets them: each group's part of the table-wide quality top
    ``oversample * k`` eligible rows."""
    return split_quota(table.quality[table.eligible], group_of, groups, k, OVERSAMPLE)


def greedy_quotas(table: Table, group_of: np.ndarray, groups: int, metric: str, lamb: float) -> np.ndarray:
    """Quotas in proportion to each group's share of lazy greedy's picks on a uniform sample of the
    eligible rows, at the sample's share of ``k``."""
    sample = np.sort(np.random.default_rng(0).choice(table.eligible.size,
                                                     min(GREEDY_SAMPLE_ROWS, table.eligible.size),
                                                     replace=False))
    rows = table.eligible[sample]
    picks = lazy_greedy(table.quality[rows], table.emb[rows], max(1, round(table.k * rows.size /
                                                                         table.eligible.size)),
                        algorithm=metric, lamb=lamb, quality_range=table.quality_range,
                        weights=table.weights[rows])
    sizes = np.bincount(group_of, minlength=groups)
    return allocate(table.k, np.bincount(group_of[sample[picks]], minlength=groups), sizes)


def pieces(table: Table, options, metric: str, lamb: float) -> Selection:
    file_of = table.file_of[table.eligible]
    return learn_apart(table, options, file_of, quality_mass_quotas(table, file_of, table.files, table.k))


def pieces_greedy_quotas(table: Table, options, metric: str, lamb: float) -> Selection:
    started = time.perf_counter()
    file_of = table.file_of[table.eligible]
    quotas = greedy_quotas(table, file_of, table.files, metric, lamb)
    planning = time.perf_counter() - started
    selection = learn_apart(table, options, file_of, quotas)
    return Selection(selection.rows, selection.seconds + planning)


def two_rounds(table: Table, options, metric: str, lamb: float, candidates: int = 2,
               table_range: bool = False, weighted: bool = False) -> Selection:
    """Each file learns ``candidates x`` its quota; one learner over the union then picks ``k``."""
    file_of = table.file_of[table.eligible]
    quotas = quality_mass_quotas(table, file_of, table.files, table.k)
    sizes = np.bincount(file_of, minlength=table.files)
    first = learn_apart(table, options, file_of, np.minimum(candidates * quotas, sizes))
    started = time.perf_counter()
    union = table.eligible[np.isin(table.eligible, first.rows)]  # in file order
    weights = nearest_weights(table, union) if weighted else None
    planning = time.perf_counter() - started
    second = learn(table, union, table.k, options, table.files, table.quality_range if table_range else None,
                   weights)
    return Selection(second.rows, first.seconds + planning + second.seconds)


def nearest_weights(table: Table, candidates: np.ndarray, block: int = 4096) -> np.ndarray:
    """Rows of the table each candidate stands for: the eligible rows (with their groups) whose
    nearest candidate it is."""
    weights = np.zeros(candidates.size)
    for start in range(0, table.eligible.size, block):
        rows = table.eligible[start:start + block]
        nearest = np.argmax(table.emb[rows] @ table.emb[candidates].T, axis=1)
        weights += np.bincount(nearest, weights=table.weights[rows], minlength=candidates.size)
    return weights


def clusters(table: Table, options, metric: str, lamb: float, rule: str = "quality",
             per_file: int = 1) -> Selection:
    """Pieces cut by spherical k-means (``per_file`` clusters a file), quotas by ``rule``."""
    started = time.perf_counter()
    count = table.files * per_file
    cluster_of = topic_labels(table.emb[table.eligible], count)
    quotas = (quality_mass_quotas(table, cluster_of, count, table.k) if rule == "quality"
              else greedy_quotas(table, cluster_of, count, metric, lamb))
    planning = time.perf_counter() - started
    selection = learn_apart(table, options, cluster_of, quotas)
    return Selection(selection.rows, selection.seconds + planning)


class OutsideFacility(Facility):
    """Facility of the piece's picks together with rows picked outside it: each represented row's floor
    is at least its best similarity to them."""

    def __init__(self, outside: torch.Tensor, options):
        super().__init__(options.reference_size, options.neighbours, "float32", options.exact_neighbours,
                         options.probes)
        self.outside = outside

    def covered(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.cat([(rows[s:s + 4096] @ self.outside.T).amax(1) for s in range(0, rows.shape[0], 4096)]
                         ).clamp(min=0)

    def prepare(self, emb, generator, represented=EVERY_ROW):
        # Facility.prepare with each row's floor lifted to its coverage by the outside rows
        reference, weights = represented.rows, represented.weights
        if reference is None:
            rows = torch.randperm(emb.shape[0], generator=generator, device=generator.device)
            reference = emb[rows[:self.reference_size]]
            weights = None if weights is None else weights[rows[:self.reference_size]]
        values, neighbours = top_neighbours(reference, emb, self.neighbours, dtype=emb.dtype,
                                            generator=generator, exact_max=self.exact_max, probes=self.probes)
        floor = values[:, -1].clamp(min=0) if represented.positions is None else values.new_zeros(len(values))
        floor = torch.maximum(floor, self.covered(reference))
        values = values.sub_(floor[:, None])
        if represented.positions is not None:
            values.masked_fill_(neighbours == represented.positions[:, None], 0.0)
        share = None if weights is None else mean_one(weights.to(values.dtype))
        return FacilityState(values.clamp_(min=0), neighbours, represented.positions is not None, share,
                             weighted_mean(floor, share))

    def evaluate(self, emb, selected, represented=EVERY_ROW):
        rows = emb if represented.rows is None else represented.rows
        best = torch.maximum((rows @ emb[selected].T).amax(1).clamp(min=0), self.covered(rows))
        weights = represented.weights
        return float(best.mean() if weights is None else (best * weights).sum() / weights.sum())

    def evaluate_both(self, emb, first, second, represented=EVERY_ROW):
        return self.evaluate(emb, first, represented), self.evaluate(emb, second, represented)


class OutsidePairSimi(PairSimi):
    """Pair_simi of the piece's picks together with ``count`` rows picked outside it, whose unit vectors
    sum to ``total``."""

    def __init__(self, total: torch.Tensor, count: int):
        super().__init__("float32")
        self.total, self.count = total, count

    def rewards(self, emb, idx, state):
        k = idx.shape[1] + self.count
        w = selection_sums(emb, idx) + self.total
        return 1.0 - (w.pow(2).sum(1) - k) / max(k * (k - 1), 1)

    def rewards_and_gains(self, emb, idx, state, member):
        k = idx.shape[1] + self.count
        w = selection_sums(emb, idx) + self.total
        pair_sum = ((w * w).sum(1) - k)[:, None]
        dots = w @ emb.T
        mean_with = pair_sum / max(k * (k - 1), 1)
        mean_without = (pair_sum - 2 * (dots - 1)) / max((k - 1) * (k - 2), 1)
        mean_plus = (pair_sum + 2 * dots) / ((k + 1) * k)
        return 1.0 - mean_with[:, 0], torch.where(member, mean_without - mean_with, mean_with - mean_plus)


def first_round(table: Table, options, metric: str) -> tuple[dict, float, torch.Tensor, torch.Tensor]:
    """Each file learns its quality-mass quota apart (DiSF standardised by the table's moments): the
    picks by file, their seconds, and the table's mean and std."""
    file_of = table.file_of[table.eligible]
    quotas = quality_mass_quotas(table, file_of, table.files, table.k)
    rows = torch.as_tensor(table.emb[table.eligible])
    mean, std = rows.mean(0), rows.std(0)
    moments = TableMoments(mean.numpy(), std.numpy()) if metric == "DiSF" else None
    picked, seconds = {}, 0.0
    for file, quota in enumerate(quotas):
        selection = learn(table, table.eligible[file_of == file], int(quota), options, file,
                          table.quality_range, moments=moments)
        picked[file], seconds = selection.rows, seconds + selection.seconds
    return picked, seconds, mean, std


def table_moments(table: Table, options, metric: str, lamb: float) -> Selection:
    """DiSF: the first round of :func:`context` alone."""
    if metric != "DiSF":
        return pieces(table, options, metric, lamb)
    picked, seconds, _, _ = first_round(table, options, metric)
    return Selection(np.concatenate(list(picked.values())), seconds)


def context(table: Table, options, metric: str, lamb: float, phases: int = 2) -> Selection:
    """The pieces learn apart, then each re-learns its quota against the others' picks (``phases``
    groups of pieces in turn)."""
    file_of = table.file_of[table.eligible]
    quotas = quality_mass_quotas(table, file_of, table.files, table.k)
    picked, seconds, mean, std = first_round(table, options, metric)
    for phase in range(phases):
        for file in range(phase, table.files, phases):
            others = torch.as_tensor(table.emb[np.concatenate([picked[f] for f in picked if f != file])])
            moments, learned = None, options
            if metric == "Facility":
                learned = options.replace(algorithm=OutsideFacility(others, options))
            elif metric == "Pair_simi":
                learned = options.replace(algorithm=OutsidePairSimi(others.sum(0), others.shape[0]))
            else:
                standard = (others - mean) / std
                moments = TableMoments(mean.numpy(), std.numpy(), (standard.T @ standard).double().numpy(),
                                       others.shape[0])
            selection = learn(table, table.eligible[file_of == file], int(quotas[file]), learned,
                              table.files + file, table.quality_range, moments=moments)
            picked[file], seconds = selection.rows, seconds + selection.seconds
    return Selection(np.concatenate(list(picked.values())), seconds)


def context_shares(table: Table, options, metric: str, lamb: float) -> Selection:
    """DiSF: the pieces learn apart on the table's moments, share the quota by their picks' moments, and
    re-learn their shares against the others'."""
    if metric != "DiSF":
        return context(table, options, metric, lamb)
    file_of = table.file_of[table.eligible]
    picked, seconds, mean, std = first_round(table, options, metric)
    moments = []
    for rows in picked.values():
        standard = (torch.as_tensor(table.emb[rows]) - mean) / std
        moments.append((standard.T @ standard).double().numpy() / max(1, rows.size))
    started = time.perf_counter()
    low, high = table.quality_range
    quality = [np.sort((table.quality[table.eligible[file_of == f]] - low) / (high - low))[::-1]
               for f in range(table.files)]
    sizes = np.array([q.size for q in quality])
    d = mean.shape[0]
    # scaled so that share_pairs' 1 / (k (k - 1)) gives DiSF's 1 / (k^2 d (d - 1))
    off = ~np.eye(d, dtype=bool)
    sums = np.stack([m[off] for m in moments]) * np.sqrt((table.k - 1) / (table.k * d * (d - 1)))
    shares = share_pairs(quality, sums * sizes[:, None], table.k, lamb)
    seconds += time.perf_counter() - started
    chosen = []
    for file, share in enumerate(shares):
        outside = sum(moments[f] * float(shares[f]) for f in range(table.files) if f != file)
        selection = learn(table, table.eligible[file_of == file], int(share), options, table.files + file,
                          table.quality_range, moments=TableMoments(mean.numpy(), std.numpy(), outside,
                                                                    table.k - int(share)))
        chosen.append(selection.rows)
        seconds += selection.seconds
    return Selection(np.concatenate(chosen), seconds)


def greedy_per_piece(table: Table, options, metric: str, lamb: float) -> Selection:
    """Each file's quota picked by lazy greedy on the file alone."""
    file_of = table.file_of[table.eligible]
    picked, started = [], time.perf_counter()
    for file, quota in enumerate(quality_mass_quotas(table, file_of, table.files, table.k)):
        rows = table.eligible[file_of == file]
        picked.append(rows[lazy_greedy(table.quality[rows], table.emb[rows], int(quota), algorithm=metric,
                                       lamb=lamb, quality_range=table.quality_range,
                                       weights=table.weights[rows])])
    return Selection(np.concatenate(picked), time.perf_counter() - started)


def one_piece(table: Table, options, metric: str, lamb: float) -> Selection:
    return learn(table, table.eligible, table.k, options, 0, table.quality_range)


def ways(candidates: list[int]) -> dict:
    """Each way's name and function (table, options, metric, lamb) -> Selection."""
    named = {"pieces": pieces, "pieces, greedy quotas": pieces_greedy_quotas}
    for count in candidates:
        named[f"2 rounds, c = {count}"] = lambda *a, count=count: two_rounds(*a, candidates=count)
    named["2 rounds, c = 2, table range"] = lambda *a: two_rounds(*a, table_range=True)
    named["2 rounds, c = 2, weighted"] = lambda *a: two_rounds(*a, weighted=True)
    named["clusters"] = clusters
    named["clusters, greedy quotas"] = lambda *a: clusters(*a, rule="greedy")
    named["cells x 4, greedy quotas"] = lambda *a: clusters(*a, rule="greedy", per_file=4)
    named["context"] = context
    named["table moments"] = table_moments
    named["context, shares"] = context_shares
    named["greedy per piece"] = greedy_per_piece
    named["one piece"] = one_piece
    return named


def compare(table: Table, metric: str, lamb: float, chosen: dict,
            greedy_max_work: float = GREEDY_MAX_WORK) -> dict:
    """Each way's selection and its yardstick, the references computed once for them all."""
    options = options_for(metric, lamb)
    selections = {name: way(table, options, metric, lamb) for name, way in chosen.items()}
    masks = []
    for name, selection in selections.items():
        mask = np.zeros(len(table.quality), dtype=bool)
        mask[selection.rows] = True
        if mask.sum() != table.k or selection.rows.size != table.k:
            raise SystemExit(f"{metric} {lamb} {name}: {selection.rows.size} rows, not {table.k}")
        masks.append(mask)
    scores = measure_all(table.quality, table.emb, masks, algorithm=metric, lamb=lamb,
                         greedy_max_work=greedy_max_work)
    return {name: (selection, score) for (name, selection), score in zip(selections.items(), scores,
                                                                         strict=True)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=sorted(CASES), nargs="+",
                        default=["24k-d64-spread", "24k-d64-topics"])
    parser.add_argument("--metrics", nargs="+", default=["Facility", "Pair_simi", "DiSF"])
    parser.add_argument("--lambs", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--candidates", type=int, nargs="+", default=[2, 3],
                        help="candidates each piece proposes in the first round, as multiples of its quota")
    parser.add_argument("--ways", nargs="+", help="only these ways (names as in the table)")
    parser.add_argument("--greedy-max-work", type=float, default=GREEDY_MAX_WORK)
    parser.add_argument("--json", help="append the results to this JSON file (benchmarks/record.py)")
    args = parser.parse_args(argv)
    chosen = {name: way for name, way in ways(args.candidates).items() if not args.ways or name in args.ways}
    header = ["case", "metric", "lamb", *chosen, "quality top-k"]
    lines = ["# Learning a table in pieces, in two rounds or by cluster, against learning it whole", "",
             "Share of the baseline's gain over random (objective) and seconds of the way's work, each way "
             "simulated on one process:", "",
             "| " + " | ".join(header) + " |", "|---|---|---:|" + "---:|" * (len(chosen) + 1)]
    print("\n".join(lines), flush=True)
    started = time.perf_counter()
    for case in args.case:
        table = prepare(case)
        for metric in args.metrics:
            for lamb in args.lambs:
                results = compare(table, metric, lamb, chosen, args.greedy_max_work)
                cells = [f"{score.share:.1%} ({score.objective:.5f}) {selection.seconds:.1f} s"
                         for selection, score in results.values()]
                lines.append(f"| {case} | {metric} | {lamb:g} | " + " | ".join(cells)
                             + f" | {next(iter(results.values()))[1].topk_share:.1%} |")
                print(lines[-1], flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s in all", flush=True)
    if args.json:
        data = {case: {key: value for key, value in asdict(CASES[case]).items()
                       if value is not None} for case in args.case}
        record.append(args.json, command=record.command("bench_rounds.py", argv), data=data,
                      markdown="\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
