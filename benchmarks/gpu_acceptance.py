"""The GPU acceptance run's own steps (``scripts/gpu-acceptance.sh`` runs them with the jobs).

    python benchmarks/gpu_acceptance.py data --rows 1000000 --dim 768 --quality-case 1m-d64
    python benchmarks/gpu_acceptance.py ceiling --rows 1000000 --dim 768
    python benchmarks/gpu_acceptance.py selections --case 1m-d64 --out selections.npz
    python benchmarks/gpu_acceptance.py score selections.npz
    python benchmarks/gpu_acceptance.py compare .benchmark-cache/pipeline-gpu-out this baseline

- ``data``: the pipeline benchmark's table (``tables.ensure_dataset``), its files drawn in
  parallel processes, and the quality benchmark's case table (``dataset``).
- ``ceiling``: the cuDF I/O ceiling over the same files: ``cudf.read_parquet``, a boolean column,
  ``to_parquet``, one file after another on one GPU (what a selection job cannot beat); then the
  reads alone, and the writes through a Python file handle (fsynced) instead of a path.
- ``selections``: ``datamask select`` with the gpu profile and ``--device cuda`` on the quality
  case's table, per metric and lamb; the rows selected (bit-packed) and the job's learning seconds
  go into ``--out``. The gpu profile learns the whole table as one chunk (``max_chunk_rows``).
- ``score``: the yardstick on those selections (:func:`~datamask_dask.learn.yardstick.measure_all`),
  on any machine: the share of the best baseline's gain over random, beside the CPU figures of
  ``results/quality.json``.
- ``compare``: the rows selected by each ``bench_gpu.py --keep-output`` job run with ``--label this``
  against the same job run with ``--label baseline`` (another checkout's code): they must be the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import record
from jobs import cli_selection
from tables import CASES, dataset, ensure_dataset

HERE = Path(__file__).resolve().parent

CACHE = HERE.parent / ".benchmark-cache"


def data(args) -> int:
    started = time.perf_counter()
    folder = ensure_dataset(Path(args.cache), args.rows, args.dim, args.rows_per_partition,
                                     args.clusters, processes=os.cpu_count() or 1)
    print(f"pipeline table {folder} in {time.perf_counter() - started:.1f} s", flush=True)
    if args.quality_case:
        source, _, _ = dataset(args.quality_case)
        print(f"quality table {source} at {time.perf_counter() - started:.1f} s", flush=True)
    return 0


def ceiling(args) -> int:
    import cudf

    source = ensure_dataset(Path(args.cache), args.rows, args.dim, args.rows_per_partition,
                                     args.clusters)
    files = sorted(source.glob("*.parquet"))
    scratch = Path(args.cache) / "ceiling-out"
    scratch.mkdir(parents=True, exist_ok=True)

    def copy(path: Path, write: str = "path") -> int:
        frame = cudf.read_parquet(path)
        if write == "none":
            return len(frame)
        frame["selected"] = cudf.Series(np.arange(len(frame)) % 10 == 0)
        if write == "path":
            frame.to_parquet(scratch / path.name)
        else:  # through a Python file handle, fsynced: how the package wrote cuDF parts before
            with open(scratch / path.name, "wb") as handle:
                frame.to_parquet(handle)
                handle.flush()
                os.fsync(handle.fileno())
        return len(frame)

    copy(files[0])  # the CUDA context and cuDF's kernels, not timed
    lines = ["| pass | files | rows | seconds | rows/s |", "|---|---:|---:|---:|---:|"]
    passes = [("1", "path"), ("2", "path"), ("read only", "none"),
              ("written through a Python handle", "handle")]
    for name, write in passes:
        started = time.perf_counter()
        rows = sum(copy(path, write) for path in files)
        seconds = time.perf_counter() - started
        lines.append(f"| {name} | {len(files)} | {rows:,} | {seconds:.2f} | {rows / seconds:,.0f} |")
        print(lines[-1], flush=True)
    text = "\n".join(["# The cuDF I/O ceiling", "",
                      "cuDF read + boolean column + write, one file after another:", "", *lines])
    print(text)
    shape = {"rows": args.rows, "dim": args.dim, "rows a file": args.rows_per_partition}
    _record(args, text, {"tables": shape})
    return 0


def _record(args, markdown: str, data) -> None:
    if args.json:
        record.append(args.json, command=record.command(Path(sys.argv[0]).name), data=data, markdown=markdown)


def selections(args) -> int:
    from datamask_dask import get_client

    source, _, _ = dataset(args.case)
    out = Path(args.out)
    masks, runs = {}, []
    lines = ["| metric | lamb | selected | job s (wall) | learn s |", "|---|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    # one worker for every job: each CLI run joins it instead of starting a cluster of its own
    client = get_client("cuda" if args.device == "cuda" else "cpu", n_workers=1, set_as_default=False,
                        dashboard_address=":0")
    try:
        for lamb in args.lambs:  # every metric at the first lamb before any at the next
            for metric in args.metrics:
                flags = ["--config", "gpu", "--device", args.device, "--scheduler", client.scheduler.address,
                         "--algorithm", metric, "--lamb", str(lamb)]
                try:
                    selected, seconds = cli_selection(source, flags)
                except SystemExit as failure:  # keep the other runs: a failure is reported, the next goes on
                    print(f"| {metric} | {lamb} | failed | | |\n{failure}", flush=True)
                    continue
                masks[f"{metric}|{lamb}"] = np.packbits(selected)
                runs.append({"metric": metric, "lamb": lamb, "rows": len(selected), **seconds})
                np.savez(out, runs=json.dumps({"case": args.case, "runs": runs}), **masks)
                lines.append(f"| {metric} | {lamb} | {int(selected.sum()):,} | {seconds['job_seconds']:.1f} "
                             f"({seconds['wall_seconds']:.1f}) | {seconds['learn_seconds']:.2f} |")
                print(lines[-1], flush=True)
    finally:
        client.shutdown()
    _record(args, "\n".join([f"# The {args.case} table learned as one chunk on the GPU", "", *lines]),
            f"the {args.case} table of bench_quality.py (make_embeddings)")
    return 0


def score(args) -> int:
    from datamask_dask.learn.yardstick import measure_all

    saved = np.load(args.selections)
    meta = json.loads(str(saved["runs"]))
    _, quality, emb = dataset(meta["case"])
    print("| case | metric | lamb | share of baseline's gain | objective | random | baseline | top-k share | "
          "learn s |\n|---|---|---:|---:|---:|---:|---|---:|---:|", flush=True)
    rows = []
    for run in meta["runs"]:
        selected = np.unpackbits(saved[f"{run['metric']}|{run['lamb']}"], count=run["rows"]).astype(bool)
        (result,) = measure_all(quality, emb, [selected], algorithm=run["metric"], lamb=run["lamb"],
                                greedy_max_work=args.greedy_max_work)
        rows.append({**run, "case": meta["case"], **result.as_dict()})
        print(f"| {meta['case']} | {run['metric']} | {run['lamb']} | {result.share:.2%} | "
              f"{result.objective:.5f} | {result.random:.5f} | {result.baseline:.5f} "
              f"({result.baseline_name}) | {result.topk_share:.2%} | {run['learn_seconds']:.2f} |",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def compare(args) -> int:
    """The ``selected`` column of each job's output run on this code (``*-{this}``) against the same job
    run on the baseline's (``*-{baseline}``), by id: the selection must not change."""
    import pyarrow.dataset as ds

    folder = Path(args.folder)
    lines = ["| job | rows | selected (this) | selected (baseline) | same rows selected |",
             "|---|---:|---:|---:|---|"]
    same_everywhere = True
    for this in sorted(folder.glob(f"*-{args.this}")):
        other = this.with_name(this.name[: -len(args.this)] + args.baseline)
        if not other.is_dir():
            continue
        picked = {}
        for name, path in (("this", this), ("baseline", other)):
            table = ds.dataset(path, format="parquet").to_table(columns=["chunk_id", "selected"])
            picked[name] = (table.num_rows, np.sort(table.filter(table.column("selected"))
                                                    .column("chunk_id").to_numpy()))
        same = np.array_equal(picked["this"][1], picked["baseline"][1])
        same_everywhere &= same
        job = this.name[: -len(args.this) - 1]
        lines.append(f"| {job} | {picked['this'][0]:,} | {picked['this'][1].size:,} "
                     f"| {picked['baseline'][1].size:,} | {'yes' if same else 'no'} |")
        print(lines[-1], flush=True)
    print("\n".join(["# The same selection on this code and the baseline's", "", *lines]))
    return 0 if same_everywhere and len(lines) > 2 else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)
    for name in ("data", "ceiling"):
        step = steps.add_parser(name)
        step.add_argument("--rows", type=int, default=1_000_000)
        step.add_argument("--dim", type=int, default=768)
        step.add_argument("--rows-per-partition", type=int, default=100_000)
        step.add_argument("--clusters", type=int, default=2000)
        step.add_argument("--cache", default=str(CACHE))
        if name == "data":
            step.add_argument("--quality-case", choices=sorted(CASES))
        else:
            step.add_argument("--json", help="append the table to this JSON file (record.py)")
    step = steps.add_parser("selections")
    step.add_argument("--case", default="1m-d64", choices=sorted(CASES))
    step.add_argument("--metrics", nargs="+", default=["Pair_simi", "Facility", "DiSF"])
    step.add_argument("--lambs", type=float, nargs="+", default=[0.0, 0.5])
    step.add_argument("--device", default="cuda", help="cpu checks the step on a machine without a GPU")
    step.add_argument("--out", required=True)
    step.add_argument("--json", help="append the table to this JSON file (record.py)")
    step = steps.add_parser("score")
    step.add_argument("selections")
    step.add_argument("--greedy-max-work", type=float, default=1e11)
    step.add_argument("--json")
    step = steps.add_parser("compare")
    step.add_argument("folder", help="the outputs of bench_gpu.py --keep-output (pipeline-gpu-out)")
    step.add_argument("this", help="the --label of this code's runs")
    step.add_argument("baseline", help="the --label of the baseline's runs")
    args = parser.parse_args(argv)
    steps = {"data": data, "ceiling": ceiling, "selections": selections, "score": score, "compare": compare}
    return steps[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
