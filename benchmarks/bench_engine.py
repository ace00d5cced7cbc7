"""Objective and wall time of the DATAMASK engine against the baselines, side by side in one process.

For each chunk size n, diversity metric and lamb, every method selects k = ratio * n rows of
``make_embeddings(n, dim, seed)``; each selection is scored with ``evaluate_selection`` on the
whole chunk (Facility's reference set is every row), so all rows of a block are comparable.
Every method and the evaluation run on ``--device`` (cpu or cuda). Wall time covers the
selection only (inputs already in memory; apricot's includes its similarity matrix), not the
evaluation.

    python benchmarks/bench_engine.py --sizes 20000 --out results.md
    python benchmarks/bench_engine.py --sizes 20000 200000 --algorithms Facility --lambs 0.5 \
        --engine-opt n_epochs=1000 --engine-opt n_rollout=128
    python benchmarks/bench_engine.py --device cuda --sizes 20000 200000 1000000

Methods: ``engine`` (``learn_mask`` with default options plus any ``--engine-opt``), ``engine,
whole reference`` (the same with ``refine_reference = n``; only where n exceeds the default
sample), ``published loop`` (``update="paper", refine=0, final="topk"`` with the reference tool's
``n_epochs=5000, n_rollout=128``; ``--paper-opt`` overrides them, e.g. to fit a CPU), ``random``,
``quality top-k``, ``lazy greedy`` (the share column's baseline:
``(f - f(random)) / (f(lazy greedy) - f(random))``), ``stochastic greedy`` (eps 0.1),
``DiSF batched greedy`` (DiSF only) and ``apricot`` (Facility only: apricot-select's
``FacilityLocationSelection(k, metric="cosine", optimizer="lazy")``; note apricot's "cosine"
similarity is the *squared* cosine and it ignores quality, so it optimises a different objective
than the one reported). apricot-select is an optional, benchmark-only dependency.

``--eval-reference m``: where n > m, Facility is evaluated on a fixed uniform sample of m rows of
the chunk (drawn with ``--seed``, the same rows for every method): the mean over the sample of a
row's best similarity to the selection is an unbiased estimate of the whole chunk's Facility term,
at m / n of the cost (the exact term costs n x k x d: 6.4e12 multiply-adds at n = 1M, d = 64).
The table's note says so on every such row. ``--refine-references m1 m2 ...`` adds the engine
with ``refine_reference = m`` (Facility's learning-time reference sample) for each m, on Facility.

Lazy greedy is skipped, with the reason printed, where it would not fit in time: exact DiSF greedy
costs O(k n d^2) (``--disf-greedy-max-n``), the others O(k n d) or less (``--greedy-max-n``).
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from datamask_dask import (
    DataMaskOptions,
    disf_batched_greedy,
    evaluate_selection,
    lazy_greedy,
    learn_mask,
    make_embeddings,
    quality_topk,
    random_selection,
    stochastic_greedy,
)

REFERENCE = "lazy greedy"
#: The published method with the reference tool's settings (E = 5000 steps, G = 128 rollouts).
PUBLISHED = {"update": "paper", "refine": 0, "final": "topk", "n_epochs": 5000, "n_rollout": 128}


@dataclass
class Row:
    n: int
    algorithm: str
    lamb: float
    method: str
    objective: float | None = None
    quality: float | None = None
    diversity: float | None = None
    seconds: float | None = None
    note: str = ""
    percent: float | None = None


def main(argv=None) -> int:
    args = _parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine_opts = dict(_parse_opt(o) for o in args.engine_opt)
    DataMaskOptions().replace(**engine_opts)  # fail on a bad option before any compute
    args.paper_opts = {**PUBLISHED, **dict(_parse_opt(o) for o in args.paper_opt)}
    DataMaskOptions().replace(**args.paper_opts)
    header = _machine_header(engine_opts, args)
    started = f"{time.strftime('%H:%M', time.gmtime())} UTC, load average {os.getloadavg()[0]:.2f}"
    print(header, flush=True)
    rows: list[Row] = []

    def write(block, done=False):
        # Rewritten after every row, so that a run cut off early still leaves its figures.
        if not args.out:
            return
        _add_percent(block)
        now = f"{time.strftime('%H:%M', time.gmtime())} UTC, load average {os.getloadavg()[0]:.2f}"
        state = "finished" if done else "running (the rows so far)"
        with open(args.out, "w") as fh:
            fh.write(f"{header}\nStarted {started}; {state} at {now}.\n\nCommand: `"
                     + " ".join(sys.argv) + "`\n\n" + _markdown(rows + block) + "\n")

    for n in args.sizes:
        t0 = time.perf_counter()
        quality, emb = make_embeddings(n, args.dim, seed=args.seed)
        k = max(1, round(args.ratio * n))
        print(f"\n# n={n} d={args.dim} k={k}: data made in {time.perf_counter() - t0:.1f} s", flush=True)
        for algorithm in args.algorithms:
            for lamb in args.lambs:
                block = _run_block(quality, emb, k, algorithm, lamb, engine_opts, args, write)
                _add_percent(block)
                rows.extend(block)
    print("\n" + _markdown(rows))
    if args.out:
        write([], done=True)
        print(f"\nwritten to {args.out}")
    return 0


def _run_block(quality, emb, k, algorithm, lamb, engine_opts, args, write) -> list[Row]:
    """Every selected method on one (algorithm, lamb); ``write(block)`` after each row."""
    n = emb.shape[0]
    common = {"algorithm": algorithm, "lamb": lamb, "seed": args.seed, "device": args.device}
    methods = []  # (name, selector or None, skip reason)
    methods.append(("engine", lambda: _engine(quality, emb, k, algorithm, lamb, engine_opts, args.device),
                    ""))
    if n > DataMaskOptions().replace(**engine_opts).refine_reference:
        methods.append(("engine, whole reference", lambda: _engine(
            quality, emb, k, algorithm, lamb, {**engine_opts, "refine_reference": n}, args.device), ""))
    methods.append(("published loop", lambda: _engine(quality, emb, k, algorithm, lamb,
                                                      {**engine_opts, **args.paper_opts}, args.device), ""))
    methods.append(("random", lambda: random_selection(quality, emb, k, **common), ""))
    methods.append(("quality top-k", lambda: quality_topk(quality, emb, k, **common), ""))
    limit = args.disf_greedy_max_n if algorithm.lower() == "disf" else args.greedy_max_n
    reason = ""
    if n > limit:
        cost = "O(k n d^2)" if algorithm.lower() == "disf" else "O(k n d)"
        flag = "--disf-greedy-max-n" if algorithm.lower() == "disf" else "--greedy-max-n"
        reason = f"skipped: exact greedy costs {cost} per run, n={n} > {flag}={limit}"
    methods.append((REFERENCE, lambda: lazy_greedy(quality, emb, k, max_memory_bytes=args.max_memory,
                                                   **common), reason))
    methods.append(("stochastic greedy", lambda: stochastic_greedy(
        quality, emb, k, eps=args.eps, max_memory_bytes=args.max_memory, **common), ""))
    if algorithm.lower() == "disf":
        methods.append(("DiSF batched greedy", lambda: disf_batched_greedy(
            quality, emb, k, batch_size=args.disf_batch_size, **common), ""))
    if algorithm.lower() == "facility":
        need = 2 * n * n * 8  # apricot's dense float64 similarity matrix, plus sklearn's copy
        reason = "" if n <= args.apricot_max_n else (
            f"skipped: apricot builds a dense n x n float64 matrix (~{need / 2**30:.0f} GiB), "
            f"n={n} > --apricot-max-n={args.apricot_max_n}")
        methods.append(("apricot", lambda: _apricot(emb, k), reason))

    for m in args.refine_references if algorithm.lower() == "facility" else []:
        methods.insert(1, (f"engine, refine_reference={m}", lambda m=m: _engine(
            quality, emb, k, algorithm, lamb, {**engine_opts, "refine_reference": m}, args.device), ""))
    sample = _eval_rows(n, algorithm, args)
    block = []
    for name, select, reason in methods:
        if args.methods and name not in args.methods:
            continue
        row = Row(n, algorithm, lamb, name)
        block.append(row)
        if reason:
            row.note = reason
            print(f"  {algorithm} lamb={lamb} {name}: {reason}", flush=True)
            continue
        _sync(args.device)
        t0 = time.perf_counter()
        try:
            sel = select()
        except _Unavailable as exc:
            row.note = str(exc)
            print(f"  {algorithm} lamb={lamb} {name}: {exc}", flush=True)
            continue
        _sync(args.device)
        row.seconds = time.perf_counter() - t0
        sel = np.asarray(sel)
        if len(np.unique(sel)) != k:
            raise AssertionError(f"{name} returned {len(np.unique(sel))} distinct rows, expected {k}")
        t1 = time.perf_counter()
        ev = _evaluate(quality, emb, sel, algorithm, lamb, args.device, sample)
        row.objective, row.quality, row.diversity = ev["objective"], ev["quality"], ev["diversity"]
        if sample is not None:
            row.note = f"Facility on a {sample.size}-row uniform sample of the chunk"
        print(f"  {algorithm} lamb={lamb} {name}: objective {row.objective:.5f} in {row.seconds:.1f} s "
              f"(evaluated in {time.perf_counter() - t1:.1f} s)", flush=True)
        write(block)
    return block


def _eval_rows(n, algorithm, args):
    """The fixed Facility evaluation sample of the chunk (sorted rows), or None for the exact term."""
    if algorithm.lower() != "facility" or not args.eval_reference or n <= args.eval_reference:
        return None
    return np.sort(np.random.default_rng(args.seed).choice(n, args.eval_reference, replace=False))


def _evaluate(quality, emb, sel, algorithm, lamb, device, sample):
    """``evaluate_selection``; Facility on the ``sample`` rows only when one is given."""
    return evaluate_selection(quality, emb, sel, algorithm=algorithm, lamb=lamb, device=device,
                              reference=sample)


def _engine(quality, emb, k, algorithm, lamb, opts, device):
    result = learn_mask(quality, emb, k, device=device, **{**opts, "algorithm": algorithm, "lamb": lamb})
    return np.flatnonzero(result.mask)


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


class _Unavailable(RuntimeError):
    """An optional benchmark dependency is missing."""


def _apricot(emb, k):
    try:
        from apricot import FacilityLocationSelection
    except ImportError as exc:  # optional, benchmark-only dependency
        raise _Unavailable(f"skipped: apricot-select is not importable ({exc}); "
                           "pip install apricot-select scikit-learn") from exc
    selector = FacilityLocationSelection(k, metric="cosine", optimizer="lazy", verbose=False)
    selector.fit(emb)
    return np.asarray(selector.ranking, dtype=np.int64)


def _add_percent(block: list[Row]) -> None:
    """Each row's share of lazy greedy's gain over random, in percent (the project's yardstick)."""
    ref = next((r.objective for r in block if r.method == REFERENCE and r.objective is not None), None)
    rnd = next((r.objective for r in block if r.method == "random" and r.objective is not None), None)
    for row in block:
        if ref is not None and rnd is not None and ref != rnd and row.objective is not None:
            row.percent = 100.0 * (row.objective - rnd) / (ref - rnd)


def _markdown(rows: list[Row]) -> str:
    head = ("| n | algorithm | lamb | method | objective | % of lazy greedy's gain over random | quality "
            "| diversity | wall s | note |\n|---:|---|---:|---|---:|---:|---:|---:|---:|---|")
    lines = [head]
    for r in rows:
        def fmt(v, spec):
            return "—" if v is None else format(v, spec)

        lines.append(f"| {r.n} | {r.algorithm} | {r.lamb:g} | {r.method} | {fmt(r.objective, '.5f')} "
                     f"| {fmt(r.percent, '.2f')} | {fmt(r.quality, '.4f')} | {fmt(r.diversity, '.4f')} "
                     f"| {fmt(r.seconds, '.1f')} | {r.note} |")
    return "\n".join(lines)


def _machine_header(engine_opts, args=None) -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    opts = DataMaskOptions().replace(**engine_opts).as_dict()
    for per_row in ("algorithm", "lamb"):
        opts.pop(per_row)
    device = args.device if args else "cpu"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    if str(device).startswith("cuda"):
        model += f"; GPU: {torch.cuda.get_device_name(torch.device(device))}"
    return (f"Engine at commit {commit}. CPU: {model}; {os.cpu_count()} logical cores; "
            f"torch {torch.__version__} with "
            f"{torch.get_num_threads()} threads; numpy {np.__version__}; Python {platform.python_version()}\n"
            f"Engine options (algorithm and lamb set per row): {opts}; device {device}\n"
            f"Published loop: the engine options with {getattr(args, 'paper_opts', PUBLISHED)}")


def _parse_opt(text: str):
    if "=" not in text:
        raise SystemExit(f"--engine-opt {text!r}: expected KEY=VALUE, e.g. n_epochs=300")
    key, value = text.split("=", 1)
    try:
        return key.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key.strip(), value  # a bare word such as update=paper


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000],
                   help="chunk sizes n (1,000,000 fits on a GPU; on 2 CPU cores use --dim 64 above 20k)")
    p.add_argument("--dim", type=int, default=768, help="embedding dimension d")
    p.add_argument("--ratio", type=float, default=0.1, help="share of rows selected, k = ratio * n")
    p.add_argument("--algorithms", nargs="+", default=["Pair_simi", "Facility", "DiSF"])
    p.add_argument("--lambs", type=float, nargs="+", default=[0.0, 0.5])
    p.add_argument("--methods", nargs="+", default=None,
                   help="run only these methods (names as in the table, e.g. 'engine' 'lazy greedy')")
    p.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="engine option (repeatable), e.g. --engine-opt n_epochs=1000")
    p.add_argument("--paper-opt", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override of the published loop's settings {PUBLISHED} (repeatable), "
                        "e.g. --paper-opt n_epochs=300 --paper-opt n_rollout=16 on a small CPU")
    p.add_argument("--eval-reference", type=int, default=0, metavar="M",
                   help="above M rows, evaluate Facility on a fixed uniform sample of M rows (0: exact)")
    p.add_argument("--refine-references", type=int, nargs="*", default=[], metavar="M",
                   help="also run the engine with refine_reference=M for each M (Facility only)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (every method and the evaluation)")
    p.add_argument("--greedy-max-n", type=int, default=200_000,
                   help="largest n for lazy greedy on Pair_simi / Facility")
    p.add_argument("--disf-greedy-max-n", type=int, default=5_000,
                   help="largest n for exact DiSF greedy, O(k n d^2): ~75 min at n=20000, d=768 on 2 cores")
    p.add_argument("--apricot-max-n", type=int, default=30_000, help="largest n for apricot (dense n x n)")
    p.add_argument("--max-memory", type=int, default=4 * 2**30,
                   help="bytes for the Facility similarity cache of the greedy baselines")
    p.add_argument("--eps", type=float, default=0.1, help="stochastic greedy's eps")
    p.add_argument("--disf-batch-size", type=int, default=1024, help="DiSF batched greedy's batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=None, help="also write the markdown table to this file")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
