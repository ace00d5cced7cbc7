"""The DATAMASK learner on one chunk: tensors in, an exact-size mask out. No dataframe, no I/O.

One logit per row; a mask is k draws without replacement from softmax(logits), i.e. the top-k of
logits + Gumbel noise (Plackett-Luce), so its size is exact by construction. Each step takes a
batch of the chunk (``partial``), samples ``n_rollout`` masks inside it, scores them with
``lamb * quality + (1 - lamb) * diversity`` and moves the batch's logits (see ``update``). A
refinement stage then learns the best ``refine * k`` rows (the whole chunk at ratio >= 0.1)
with every row in every step, and the final mask is the policy's best draw (``final``); the
published method is ``update="paper", refine=0, final="topk"``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import telemetry
from ..errors import InputDataError, OptionError
from ..threads import one_cpu_thread, one_learner_per_gpu
from .metrics import (
    EVERY_ROW,
    DiSF,
    MetricSettings,
    PairSimi,
    Represented,
    TableMoments,
    build_metrics,
    normalise_quality,
    weighted_diversity,
    weighted_diversity_both,
)
from .options import DataMaskOptions

MIN_BATCH = 256  # a step's batch never has fewer rows than this (or the whole chunk)
#: Rows held out of a learning reference sample to check the final mask against quality top-k:
#: enough that the two estimates' difference is ~1e-3 of the objective.
HOLDOUT_ROWS = 8192


@dataclass
class MaskResult:
    """Output of :func:`learn_mask`.

    Attributes
    ----------
    mask : numpy bool array (n,), exactly ``k`` True
    scores : numpy float32 array (n,), the learned logits (``-inf`` for pruned rows); with
        ``final="best"`` the mask is the best draw, which need not be the logits' top-k
    history : numpy float32 array, mean in-batch reward of the rollouts per step of the
        partial-batch stage (if it ran) followed by the refinement stage
    """

    mask: np.ndarray
    scores: np.ndarray
    history: np.ndarray


def learn_mask(quality, embeddings, k: int, options: DataMaskOptions | None = None, *,
               device: str | torch.device = "cpu", quality_range: tuple[float, float] | None = None,
               weights=None, others=None, moments: TableMoments | None = None, where: str = "chunk",
               **overrides) -> MaskResult:
    """Select exactly ``k`` rows of one chunk jointly for quality and diversity (DATAMASK).

    Parameters
    ----------
    quality : array-like or tensor (n,)
        Quality scores, finite; higher is better.
    embeddings : array-like or tensor (n, d)
        Embeddings, finite and non-zero; they are L2-normalised here.
    k : int
        Rows to select, 1 <= k <= rows left after pruning.
    options : DataMaskOptions, optional
        Learner settings; keyword ``overrides`` replace single options. The defaults are
        ``datamask_select``'s, except ``config.METRIC_DEFAULTS``, which the operator adds for the
        metric chosen: give them here to learn one chunk exactly as the operator does.
    device : str or torch.device
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; the loop runs there end to end.
    quality_range : (float, float), optional
        Min and max used to scale quality to [0, 1]; the chunk's own range by default. The Dask
        operator passes the whole table's range so every partition scores alike.
    weights : array-like (n,) of float >= 1, optional
        How many rows of the table each row stands for: a row kept for a group of near-copies
        (``diversity_scope="table"``) stands for the whole group. Metrics where coverage counts
        rows (Facility) weigh each represented row by it, so the objective over every row of the
        table is what is optimised; quality and the other metrics are unchanged. Default: 1 each.
    others : (array (d,), int), optional
        Where the chunk is one piece of a table learned apart: the sum of the unit rows the rest of the
        table is planned to select, and how many. Pair_simi then learns the table's pairwise
        similarity with them (the rest held fixed), not the chunk's own. Default: the chunk is the table.
    moments : TableMoments, optional
        Where a DiSF chunk is one piece of a table learned apart: the table's mean and std, and the
        second moment of what the rest of the table picks. DiSF then standardises by the table's
        moments and learns the union's correlations (the rest held fixed). Default: the chunk is the
        table, standardised by its picks' own moments.
    where : str
        How progress events name this run (``"partition 5, chunk 2"``).

    Returns
    -------
    MaskResult
    """
    opts = options or DataMaskOptions()
    if overrides:
        opts = opts.replace(**overrides)
    device = torch.device(device)
    with one_cpu_thread(device), one_learner_per_gpu(device):
        return _learn_mask(quality, embeddings, k, opts, device, quality_range, weights, others, moments,
                           where)


def _learn_mask(quality, embeddings, k: int, opts: DataMaskOptions, device: torch.device, quality_range,
                weights, others=None, moments: TableMoments | None = None,
                where: str = "chunk") -> MaskResult:
    q, emb = _as_inputs(quality, embeddings, device)
    n = q.shape[0]
    k = _check_quota(k, n, opts.prune)
    weights = row_weights(weights, n, device)
    if others is not None:  # per pick of the chunk: a batch of it scales them to its own picks
        others = (torch.as_tensor(np.asarray(others[0]) / k, dtype=torch.float32, device=device),
                  float(others[1]) / k)
    qn = normalise_quality(q, quality_range)

    # Quality pruning: the worst `prune` share never takes part (ties broken by position).
    n_keep = n - int(math.floor(opts.prune * n))
    eligible = None  # every row; else the sorted indices of the rows kept
    if n_keep < n:
        eligible = torch.sort(torch.argsort(q, descending=True, stable=True)[:n_keep]).values
    if opts.lamb == 1:
        # Pure quality: the mean-quality objective is maximised exactly by quality top-k.
        mask = torch.zeros(n, dtype=torch.bool, device=device)
        mask[torch.argsort(q, descending=True, stable=True)[:k]] = True
        scores = torch.where(mask, qn, qn - 2.0)  # the chosen rows rank first
        return MaskResult(mask.cpu().numpy(), scores.cpu().numpy().astype(np.float32),
                          np.zeros(0, dtype=np.float32))
    gen = torch.Generator(device=device).manual_seed(opts.seed)
    q_e, emb_e = (qn, emb) if eligible is None else (qn[eligible], emb[eligible])
    w_e = weights if weights is None or eligible is None else weights[eligible]
    if opts.lamb_scale == "gain" and 0 < opts.lamb < 1:
        opts = opts.replace(lamb=_gain_scaled_lamb(q_e, emb_e, k, opts, w_e), lamb_scale="paper")
    # "quality": initial probabilities follow quality
    logits = torch.zeros_like(q_e) if opts.init == "same" else torch.log(q_e.clamp(min=1e-3))
    pool_size = min(n_keep, math.ceil(opts.refine * k))
    if 2 * pool_size >= n_keep:
        # Refining the whole chunk costs at most twice refining the pool, and less than the
        # partial-batch stage that would choose the pool: refine everything, skip that stage.
        pool_size = n_keep
    history, best, reference_rows = torch.zeros(0), None, None
    first_stage = not (opts.refine and pool_size == n_keep)
    tick = telemetry.StepCounter(opts.n_epochs * first_stage + opts.refine_epochs * bool(opts.refine), where)
    if first_stage:
        history, best = _optimise(logits, q_e, emb_e, k, opts, gen, n_steps=opts.n_epochs,
                                  partial=opts.partial, lr=(opts.max_lr, opts.min_lr),
                                  max_batch=opts.max_batch, weights=w_e, tick=tick, others=others,
                                  moments=moments)
    if opts.refine and pool_size > k and best is None:  # best is set when one batch held every row
        # Refine: learn again, every step over the whole pool of the best candidates, with the
        # reference rows drawn from the whole chunk. Rows learned in different batches never met
        # in the first stage; here near-duplicates compete and only one keeps a high logit.
        whole = pool_size == n_keep
        pool = None if whole else torch.topk(logits, pool_size).indices
        # Refining everything works on the chunk's own tensors (views, no copies).
        pool_logits, q_pool, emb_pool = (logits, q_e, emb_e) if whole else (
            logits[pool], q_e[pool], emb_e[pool])
        if n_keep > opts.refine_reference:  # else every row is a reference row (None)
            reference_rows = torch.randperm(n_keep, generator=gen, device=gen.device)[:opts.refine_reference]

        def reference():  # built only if a metric uses it: the rows, their pool positions, their weights
            if reference_rows is None:  # every row: exact, each row represents itself as it should
                return emb_e, None, w_e
            sampled_weights = None if w_e is None else w_e[reference_rows]
            if whole:
                return emb_e[reference_rows], reference_rows, sampled_weights
            position = torch.full((n_keep,), -1, dtype=torch.long, device=device)
            position[pool] = torch.arange(pool_size, device=device)
            return emb_e[reference_rows], position[reference_rows], sampled_weights

        refined, best = _optimise(pool_logits, q_pool, emb_pool, k, opts, gen, n_steps=opts.refine_epochs,
                                  partial=1.0, max_batch=pool_size, lr=(opts.refine_lr, opts.refine_lr / 10),
                                  reference=reference, weights=w_e if whole else None, tick=tick,
                                  others=others, moments=moments)
        history = torch.cat([history.to(refined.device), refined])
        if not whole:
            best = None if best is None else pool[best]
            # Rows outside the pool stay below every pool row.
            logits[pool] = pool_logits - pool_logits.min() + logits.max() + 1.0
    tick.finish()  # the refinement may have been skipped
    if opts.final == "best" and best is not None:
        chosen = best
        if reference_rows is not None:
            chosen = _not_below_quality_topk(q if eligible is None else q[eligible], q_e, emb_e, chosen,
                                             reference_rows, opts, gen, w_e)
    elif opts.final == "sample":
        chosen = torch.topk(logits + _gumbel(logits.shape, gen, device), k).indices
    else:
        chosen = torch.topk(logits, k).indices
    mask = torch.zeros(n, dtype=torch.bool, device=device)
    mask[chosen if eligible is None else eligible[chosen]] = True
    scores = logits if eligible is None else torch.full((n,), -math.inf, device=device).index_put_(
        (eligible,), logits)
    return MaskResult(mask.cpu().numpy(), scores.cpu().numpy().astype(np.float32),
                      history.cpu().numpy().astype(np.float32))


def _optimise(logits, qn, emb, k, opts: DataMaskOptions, gen, *, n_steps, partial, lr, max_batch,
              tick, reference=None, weights=None, others=None, moments: TableMoments | None = None):
    """Run policy-gradient steps in place on ``logits``.

    ``reference`` (a callable, called at most once) gives the rows the selection should
    represent, for metrics that use them, their positions among ``emb`` when they are a sample
    (None when they are every row) and their weights (or None); ``weights`` are those of ``emb``'s
    rows (None: one each). Returns the mean in-batch reward per step and, when
    every row took part in every step, the best rollout drawn (row indices), else None. Nothing
    leaves the device inside the loop: the history and the best draw are tensors. ``tick`` (a
    :class:`datamask_dask.telemetry.StepCounter`) counts the steps for progress bars.
    """
    n = logits.shape[0]
    history = torch.zeros(n_steps, device=logits.device)
    if k == n:
        return history, None  # nothing to choose
    metrics = build_metrics(opts.metric_weights, _metric_settings(opts, logits.device))
    batch = min(n, max(math.ceil(partial * n), min(n, MIN_BATCH)), max_batch)
    k_batch = min(batch - 1, max(1, round(k * batch / n)))
    for metric, _ in metrics:
        if others is not None and isinstance(metric, PairSimi):  # the rest of the table's picks
            metric.others = (others[0] * k_batch, others[1] * k_batch)
        if moments is not None and isinstance(metric, DiSF):  # the table's moments and the rest's picks
            metric.table = moments.on(logits.device, k_batch / k)
    order = torch.empty(0, dtype=torch.long, device=logits.device)
    states, best, best_reward = None, None, torch.tensor(-math.inf, device=logits.device)
    sampled = False  # whether the metrics represent a fixed sample of the chunk (no polishing then)
    if batch == n:
        # Every row takes part in every step: precompute the metrics' state once.
        wanted = reference is not None and any(metric.uses_reference for metric, _ in metrics)
        rows_to_represent, positions, represented = reference() if wanted else (None, None, weights)
        sampled = positions is not None
        states = [_prepare(metric, emb, gen, rows_to_represent, positions, represented)
                  for metric, _ in metrics]
    ordered = opts.update == "plackett_luce"  # only its gradient needs the draw order
    for step in range(n_steps):
        if states is None:
            # Rows are visited in shuffled passes so each takes part equally often.
            if order.numel() < batch:
                order = torch.cat([order, torch.randperm(n, generator=gen, device=logits.device)])
            rows, order = order[:batch], order[batch:]
            theta, q_b, emb_b = logits[rows], qn[rows], emb[rows]
            w_b = None if weights is None else weights[rows]
            step_states = [_prepare(metric, emb_b, gen, None, None, w_b) for metric, _ in metrics]
        else:
            theta, q_b, emb_b, step_states = logits, qn, emb, states  # views, no copies
        step_lr = lr[0] + (lr[1] - lr[0]) * step / max(n_steps - 1, 1)
        keys = theta[None] + _gumbel((opts.n_rollout, batch), gen, logits.device)
        idx = keys.topk(k_batch, dim=1, sorted=ordered).indices  # (G, k_batch)
        rewards, direction = _step_direction(theta, q_b, emb_b, idx, metrics, step_states, opts)
        if states is None:
            logits[rows] += step_lr * direction
        else:
            logits += step_lr * direction
        history[step] = rewards.mean()
        tick()
        if states is not None:
            best_reward, best = _keep_best(rewards, idx, best_reward, best)
    if states is not None:  # the policy's mode is a candidate too
        top = logits.topk(k_batch).indices[None]
        top_reward = _step_direction(logits, qn, emb, top, metrics, states, opts)[0]
        best_reward, best = _keep_best(top_reward, top, best_reward, best)
        if opts.final == "best" and opts.polish and not sampled:
            best = _polish(qn, emb, best, best_reward, metrics, states, opts)
    return history, best


def _polish(qn, emb, chosen, reward, metrics, states, opts: DataMaskOptions):
    """Exact local search on the final mask: swap members for non-members while the reward rises.

    A policy of independent logits settles where single rows' credits balance, which can leave a few
    members worth less than some outsider. Each round takes the rows' exact marginal gains, pairs
    the members of smallest loss with the non-members of largest gain while the outsider's gain is
    larger, and swaps the first ``size`` pairs at once; the swap is kept only if the rollout reward
    (the objective the learner sees) rises, else ``size`` halves. At most ``opts.polish`` rounds;
    deterministic.
    """
    b, k = emb.shape[0], chosen.shape[0]
    if k in (0, b):
        return chosen
    member = torch.zeros(b, dtype=torch.bool, device=emb.device).scatter_(0, chosen, True)
    gain = _rewards_and_gains(qn, emb, chosen[None], member[None], metrics, states, opts.lamb, True)[1]
    size = None
    for _ in range(opts.polish):
        # Members by smallest loss, outsiders by largest gain; pairs worth swapping to first order.
        out_gain, out_rows = torch.where(member, gain, math.inf).topk(min(k, b - k), largest=False)
        in_gain, in_rows = torch.where(member, -math.inf, gain).topk(min(k, b - k))
        worth = int((in_gain > out_gain).sum())
        size = worth if size is None else min(size, worth)
        if size == 0:
            break
        trial = member.clone()
        trial[out_rows[:size]] = False
        trial[in_rows[:size]] = True
        idx = trial.nonzero().flatten()
        trial_reward = _rewards_and_gains(qn, emb, idx[None], trial[None], metrics, states, opts.lamb,
                                          False)[0][0]
        if trial_reward > reward:
            member, chosen, reward = trial, idx, trial_reward
            gain = _rewards_and_gains(qn, emb, idx[None], trial[None], metrics, states, opts.lamb, True)[1]
        else:
            size //= 2
    return chosen


def _not_below_quality_topk(q, qn, emb, chosen, reference_rows, opts: DataMaskOptions, gen, weights=None):
    """The learned mask, or quality top-k where the latter scores higher on rows held out of the
    learning reference sample.

    Learned against a fixed sample of the chunk, a metric's gains rest on the few sampled rows near
    each candidate; the learner fits that sample's noise, and its own reward (on the same sample)
    overrates the result. Rows drawn apart from the learning sample give an unbiased estimate
    for both masks (``HOLDOUT_ROWS`` of them). Both are measured in one product of those rows with the
    rows of either mask (they share most of them), a small part of the learner's time.
    """
    metrics = build_metrics(opts.metric_weights)  # only evaluated
    if not any(metric.uses_reference for metric, _ in metrics):
        return chosen  # nothing learned on the sample
    n, k = emb.shape[0], chosen.shape[0]
    outside = torch.ones(n, dtype=torch.bool, device=emb.device)
    outside[reference_rows] = False
    outside = outside.nonzero().flatten()
    if outside.numel() == 0:
        return chosen
    held = outside[torch.randperm(outside.numel(), generator=gen, device=gen.device)[:HOLDOUT_ROWS]]
    held_emb = emb[held]
    held_weights = None if weights is None else weights[held]
    topk = torch.argsort(q, descending=True, stable=True)[:k]

    # both masks on the same held-out rows, in one pass over them (they share most rows)
    diversity = weighted_diversity_both(metrics, emb, topk, chosen, reference=held_emb, weights=held_weights)
    top, learned = (opts.lamb * float(qn[rows].mean()) + (1 - opts.lamb) * value
                    for rows, value in zip((topk, chosen), diversity, strict=True))
    return topk if top > learned else chosen


#: Rows a diversity term is evaluated on when ``lamb_scale="gain"`` measures its spread.
SPREAD_ROWS = 4096


def _gain_scaled_lamb(qn, emb, k, opts: DataMaskOptions, weights=None) -> float:
    """The lamb that weighs each term by what it can gain over a random pick on this chunk.

    Quality's spread is quality top-k's mean over the chunk's mean (exact); diversity's is what a
    learn at ``lamb = 0`` (from equal logits) gains over two random draws, Facility's measured on a
    uniform sample of ``SPREAD_ROWS`` rows. ``lamb / spread_q : (1 - lamb) / spread_d`` is then the
    paper's weighting that gives each term's points of gain the weights lamb and 1 - lamb.
    """
    n = qn.shape[0]
    if k >= n:
        return opts.lamb
    spread_q = float(torch.topk(qn, k).values.mean() - qn.mean())
    probe = learn_mask(qn, emb, k, opts.replace(lamb=0.0, lamb_scale="paper", prune=0.0, init="same"),
                       device=emb.device, quality_range=(0.0, 1.0), weights=weights).mask
    gen = torch.Generator(device="cpu").manual_seed(opts.seed)
    reference = None if n <= SPREAD_ROWS else torch.randperm(n, generator=gen)[:SPREAD_ROWS].to(emb.device)
    metrics = build_metrics(opts.metric_weights)  # only evaluated
    rows = None if reference is None else emb[reference]
    row_weights = weights if weights is None or reference is None else weights[reference]

    def diversity(selected):
        return weighted_diversity(metrics, emb, selected, rows, row_weights)[0]

    drawn = [diversity(torch.randperm(n, generator=gen)[:k].to(emb.device)) for _ in range(2)]
    spread_d = diversity(torch.as_tensor(probe, device=emb.device).nonzero().flatten()) - sum(drawn) / 2
    if spread_q <= 0 or spread_d <= 0:
        return opts.lamb  # a term that cannot gain: the weighting does not matter
    quality, diversity_weight = opts.lamb / spread_q, (1 - opts.lamb) / spread_d
    return quality / (quality + diversity_weight)


def _prepare(metric, emb, gen, reference, positions, weights):
    """``metric.prepare``, told the rows to represent (their positions when they are a sample, and
    their weights) where it uses them."""
    represented = Represented(reference, positions, weights) if metric.uses_reference else EVERY_ROW
    return metric.prepare(emb, gen, represented)


def _metric_settings(opts: DataMaskOptions, device: torch.device) -> MetricSettings:
    return MetricSettings(_precision(opts.precision, device), opts.reference_size, opts.neighbours,
                          opts.exact_neighbours, opts.probes)


def row_weights(weights, n: int, device) -> torch.Tensor | None:
    """Checked row weights as a float32 tensor on ``device``, or None when absent or all 1."""
    if weights is None:
        return None
    values = weights if torch.is_tensor(weights) else torch.as_tensor(np.asarray(weights, dtype=np.float64))
    if values.shape != (n,):
        raise InputDataError(f"weights must hold one number per row ({n}), got shape {tuple(values.shape)}")
    if not bool((values.double() >= 1).all()) or not bool(torch.isfinite(values.double()).all()):
        raise InputDataError("weights must be finite numbers >= 1 (the rows each row stands for)")
    if bool((values == 1).all()):
        return None  # every row stands for itself: the unweighted objective, bit for bit
    return values.to(device=device, dtype=torch.float32)


def _keep_best(rewards, idx, best_reward, best):
    """The better of the best draw so far and this step's best, chosen on the device (no sync)."""
    j = rewards.argmax()
    if best is None:
        return rewards[j], idx[j]
    better = rewards[j] > best_reward
    return torch.where(better, rewards[j], best_reward), torch.where(better, idx[j], best)


def _step_direction(theta, qn, emb, idx, metrics, states, opts: DataMaskOptions):
    """Reward of each rollout and the update direction of the batch's logits."""
    g, b = idx.shape[0], emb.shape[0]
    rewards = torch.empty(g, device=emb.device)
    gains = torch.zeros(b, device=emb.device)
    credit = opts.update == "credit"
    for start in range(0, g, opts.rollout_chunk):
        part = idx[start:start + opts.rollout_chunk]
        member = torch.zeros((part.shape[0], b), dtype=torch.bool, device=emb.device)
        member.scatter_(1, part, True)
        reward, gain = _rewards_and_gains(qn, emb, part, member, metrics, states, opts.lamb, credit)
        rewards[start:start + part.shape[0]] = reward
        if credit:
            gains += gain
    if credit:
        return rewards, _standardise(gains)
    advantage = _standardise(rewards)
    if opts.update == "paper":
        member = torch.zeros((g, b), device=emb.device).scatter_(1, idx, 1.0)
        return rewards, (advantage @ member) / member.sum(0).clamp(min=1)
    return rewards, _plackett_luce_direction(theta, idx, advantage)


def _rewards_and_gains(qn, emb, part, member, metrics, states, lamb, with_gains):
    """Joint reward of each rollout ``part`` (G, k) and, ``with_gains``, each row's marginal gain
    summed over the rollouts (b,): f(U) - f(U - j) for members, f(U + j) - f(U) for the others."""
    q_sel = qn[part].mean(1)
    reward, gain = lamb * q_sel, None
    if with_gains:
        k = part.shape[1]
        q_gain = (qn[None] - q_sel[:, None]) / torch.where(member, k - 1, k + 1).clamp(min=1)
        gain = lamb * q_gain.sum(0)
    for (metric, weight), state in zip(metrics, states, strict=True):
        share = (1 - lamb) * weight
        if with_gains:
            metric_reward, metric_gain = metric.rewards_and_gains(emb, part, state, member)
            # a (1, b) estimate already stands for every rollout
            rollouts = part.shape[0]
            summed = metric_gain.sum(0) if metric_gain.shape[0] == rollouts else metric_gain[0] * rollouts
            gain = gain + share * summed
        else:
            metric_reward = metric.rewards(emb, part, state)
        reward = reward + share * metric_reward
    return reward, gain


def _plackett_luce_direction(theta, idx, advantage):
    """Exact score-function gradient of the ordered Gumbel-top-k (Plackett-Luce) sample.

    d log P(sigma) / d theta_j = 1[j picked] - p_j * sum_{t <= pos(j)} 1 / Z_t, with Z_t the
    softmax mass not yet drawn at pick t (pos(j) = k for rows never drawn). It is scaled by the
    inverse inclusion rate b / k so ``max_lr`` means the same as for the other updates.
    """
    g, k = idx.shape
    b = theta.shape[0]
    p = torch.exp(theta - theta.max())
    picked = p[idx]  # (G, k)
    remaining = p.sum() - torch.cumsum(picked, 1) + picked  # Z_t before pick t
    cum_inv = torch.cumsum(1.0 / remaining.clamp(min=1e-30), 1)  # (G, k)
    grad = -p[None] * cum_inv[:, -1:]  # every row, as if never picked
    grad.scatter_(1, idx, 1.0 - picked * cum_inv)
    return (advantage @ grad) / g * (b / k)


@functools.cache
def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def _precision(precision: str, device: torch.device) -> str:
    """Similarity precision: "auto" takes bfloat16 where it is fast (CUDA, AMX / AVX512-BF16)."""
    if precision != "auto":
        return precision
    return "bfloat16" if device.type == "cuda" or _cpu_has_bf16() else "float32"


def _standardise(x):
    std = x.std() if x.numel() > 1 else x.new_tensor(0.0)
    return (x - x.mean()) / (std + 1e-8)


def _gumbel(shape, gen, device):
    u = torch.rand(shape, generator=gen, device=device).clamp_(1e-20, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


def _as_inputs(quality, embeddings, device):
    """Check and convert the chunk to float32 tensors on ``device`` (embeddings L2-normalised)."""
    q, emb = _numeric_tensor(quality, "quality"), _numeric_tensor(embeddings, "embeddings")
    if q.ndim != 1:
        raise InputDataError(f"quality must be a 1-d numeric array, got shape {tuple(q.shape)}")
    if emb.ndim != 2 or emb.shape[0] != q.shape[0] or emb.shape[1] < 2:
        raise InputDataError(
            f"embeddings must be a 2-d array (n rows x d >= 2 dims) with one row per quality score "
            f"({q.shape[0]}), got shape {tuple(emb.shape)}")
    if q.shape[0] == 0:
        raise InputDataError("the chunk is empty: there is nothing to select from")
    q = q.to(device=device, dtype=torch.float32)
    emb = emb.to(device=device, dtype=torch.float32)
    bad = (~torch.isfinite(q)).nonzero().flatten()
    if bad.numel():
        raise InputDataError(f"quality has {bad.numel()} NaN or infinite value(s) at rows "
                             f"{bad[:5].tolist()}: fill or drop them before selecting")
    norms = emb.norm(dim=1, keepdim=True)
    # A row's norm is finite exactly when all its values are (barring overflow, > 1e19): one pass.
    bad = (~torch.isfinite(norms[:, 0])).nonzero().flatten()
    if bad.numel():
        raise InputDataError(f"embeddings have NaN or infinite values in {bad.numel()} row(s), first "
                             f"{bad[:5].tolist()}: re-embed or drop those rows")
    bad = (norms[:, 0] == 0).nonzero().flatten()
    if bad.numel():
        raise InputDataError(f"embeddings are all-zero in {bad.numel()} row(s), first {bad[:5].tolist()}: "
                             "a zero vector has no direction; re-embed or drop those rows")
    if bool(((norms - 1).abs() < 1e-5).all()):  # already unit rows (the Dask operator's): no copy
        return q, emb
    return q, emb / norms


def _numeric_tensor(values, name):
    if not torch.is_tensor(values):
        values = np.asarray(values)
        if values.dtype.kind not in "iuf":
            raise InputDataError(f"{name} must be a 1-d numeric array, got dtype {values.dtype}: "
                                 "cast the column to float")
    elif values.dtype.is_complex or values.dtype == torch.bool:
        raise InputDataError(f"{name} must be numeric (float), got dtype {values.dtype}")
    return torch.as_tensor(values)


def _check_quota(k, n, prune: float | None = None) -> int:
    """``k`` as an int, checked against the ``n`` rows less the ``prune`` share (None: no pruning)."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise OptionError(f"quota k={k!r} must be an integer")
    n_keep = n - int(math.floor((prune or 0) * n))
    if not 1 <= k <= n_keep:
        pruned = "" if prune is None else (
            f" left after pruning {prune:.0%} of {n}; lower the ratio or the prune share")
        raise OptionError(
            f"quota k={k} is out of range: it must be between 1 and the {n_keep} row(s){pruned}")
    return int(k)
