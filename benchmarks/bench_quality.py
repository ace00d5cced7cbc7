"""Selection quality of ``datamask select`` measured with the yardstick
(:mod:`datamask_dask.learn.yardstick`): the share of the best baseline's gain over random, with the
raw objective and quality top-k's share beside it; and, with ``--sweep``, what each lamb trades.

Each case writes one synthetic table (``datamask_dask.sample_data.make_embeddings``: Zipf-sized
clusters, 20% near-copies, quality skewed and correlated with the cluster) as parquet files and runs
the job as a user would, ``datamask select`` with the CLI defaults; ``--opt key=value`` changes a
setting of the cpu profile. The selection is scored over every row of the table.

The ``-spread`` and ``-topics`` cases hold the same rows, cut by ``max_chunk_rows`` into pieces learned
apart: in id order (rows of every cluster in every file) and sorted by topic (each file holds a few
clusters). The pieces the job learns apart are counted from its plan and shown beside each result;
``--try max_chunk_rows=24000`` learns the same table as one piece (the ceiling).

    python benchmarks/bench_quality.py --case 20k-d768 --json benchmarks/results/quality.json
    python benchmarks/bench_quality.py --case 20k-d768 --metrics Pair_simi --lambs 0 --try refine_epochs=5
    python benchmarks/bench_quality.py --case 20k-d768 --sweep --json benchmarks/results/lamb.json
    python benchmarks/bench_quality.py --case 24k-d64-spread 24k-d64-topics --try max_chunk_rows=24000

``--sweep`` runs lamb 0, 0.1, 0.25, 0.5, 0.75 and 1 with both ``--lamb-scale`` choices and reports
the share of quality top-k's quality gain over random and of the diversity optimum's (greedy at
lamb 0) diversity gain that each selection reaches.

``--timing N`` scores nothing: it runs each setting's job N times, the settings in turn, and reports
each job's seconds (its run record's phases: start-up left out) and how many times the first
setting's least is this setting's least.

    python benchmarks/bench_quality.py --case 1m-d64 --metrics Pair_simi --try pieces=partitions --timing 2

``--against CHECKOUT`` adds the first setting's job run by another commit's package (a git worktree),
from that commit's own profile, so that a change is timed side by side with main in one run:

    git worktree add /tmp/main 0f8bd65
    python benchmarks/bench_quality.py --case 1m-d64 --metrics Pair_simi --timing 2 --against /tmp/main
"""

from __future__ import annotations

import argparse
import atexit
import functools
import math
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import record
import yaml
from jobs import cli_selection
from tables import CASES, dataset

from datamask_dask.config import PROFILES
from datamask_dask.learn.yardstick import GREEDY_MAX_WORK, measure_all, term_shares

SWEEP = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)




def job_config(case: str, changes: list[str], profile: str, profiles: Path = PROFILES) -> Path | None:
    """The config of the case's jobs with ``changes`` (None: the CLI's own, the cpu profile), from the
    profiles in ``profiles`` (another checkout's, for ``--against``)."""
    changes = [*CASES[case].changes(), *changes]
    return profile_with(changes, profile, profiles) if changes or profile != "cpu" else None


def pieces(source: Path, config: Path | None, metric: str) -> int:
    """The pieces the job learns apart, from its plan: each pack (in regions: each pack of regions), and
    each chunk of an unpacked cell with a quota, as ``partition.select`` cuts them (rows set aside as
    near-duplicates not counted)."""
    from datamask_dask.config import resolve_options
    from datamask_dask.dask_engine.runs import DaskEngine
    from datamask_dask.io.parquet import read_parquet

    plan = DaskEngine(read_parquet(source), resolve_options(config, algorithm=metric)).plan(progress=False)
    chunk = plan.spec.chunk_rows(plan.dim)
    count = sum(1 for pack in plan.packs if pack.quota)
    if plan.routed:  # every eligible row is learned in its region's pack, or its dealt piece
        return count
    for number, cells in plan.cells.items():
        visible = plan.rows[number] - len(plan.shadowed.get(number, ()))
        count += sum(math.ceil(min(cell.eligible, visible) / chunk) for cell in cells
                     if cell.quota and plan.pack_of(number, cell.group) is None)
    return count


def profile_with(changes: list[str], profile: str = "cpu", profiles: Path = PROFILES) -> Path:
    """A copy of a profile with ``key=value`` changes, which win over its per-metric sections."""
    settings = yaml.safe_load((profiles / f"{profile}.yaml").read_text())
    for item in changes:
        key, _, text = item.partition("=")
        settings[key] = yaml.safe_load(text)
        for section in settings.get("algorithms", {}).values():
            section.pop(key, None)
    handle, name = tempfile.mkstemp(suffix=".yaml", dir=scratch())
    os.close(handle)
    path = Path(name)
    path.write_text(yaml.safe_dump(settings))
    return path


@functools.cache
def scratch() -> Path:
    """This run's folder of job profiles, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def config_flags(config: Path | None) -> list[str]:
    return [] if config is None else ["--config", str(config)]


def yardstick_rows(args) -> list[dict]:
    print("| case | metric | lamb | settings | pieces | share of baseline's gain | objective | random | "
          "baseline | top-k share | job s |\n|---|---|---:|---|---:|---:|---:|---:|---|---:|---|")
    results = []
    for case in args.case:
        source, quality, emb = dataset(case)
        configs = {name: job_config(case, changes, args.profile) for name, changes in args.settings.items()}
        for metric in args.metrics:
            counts = {name: pieces(source, config, metric) for name, config in configs.items()}
            for lamb in args.lambs:
                runs = [cli_selection(source, [*config_flags(config), "--algorithm", metric, "--lamb",
                                               str(lamb)]) for config in configs.values()]
                scores = measure_all(quality, emb, [selected for selected, _ in runs], algorithm=metric,
                                     lamb=lamb, greedy_max_work=args.greedy_max_work)
                for name, (_, seconds), score in zip(args.settings, runs, scores, strict=True):
                    results.append({"case": case, "metric": metric, "lamb": lamb, "settings": name,
                                    "pieces": counts[name], **seconds, **score.as_dict()})
                    print(f"| {case} | {metric} | {lamb} | {name} | {counts[name]} | {score.share:.2%} | "
                          f"{score.objective:.5f} | {score.random:.5f} | {score.baseline:.5f} "
                          f"({score.baseline_name}) | {score.topk_share:.2%} | {seconds['job_seconds']:.1f} "
                          f"({seconds['learn_seconds']:.2f} learning) |", flush=True)
    return results


def timing_lines(args) -> str:
    """``--timing``: each setting's job seconds, the settings run in turn, as a markdown table."""
    lines = [f"# Job time of each setting ({args.timing} runs each, the settings in turn)", "",
             "`datamask select` with the CLI defaults and each setting's changes; job seconds: the run "
             "record's phases (plan, select and write, summary), start-up left out.", "",
             "| case | metric | lamb | settings | job s, each run | least | "
             "first setting's least / this one's |",
             "|---|---|---:|---|---|---:|---:|"]
    first_changes = next(iter(args.settings.values()))
    for case in args.case:
        source, _, _ = dataset(case)
        jobs = {name: (job_config(case, changes, args.profile), None)
                for name, changes in args.settings.items()}
        if args.against:  # the first setting run by the other checkout's package, from its own profile
            other = args.against / PROFILES.relative_to(PROFILES.parents[1])
            jobs[f"{next(iter(jobs))} at {record.commit(args.against)}"] = (
                job_config(case, first_changes, args.profile, other), args.against)
        for metric in args.metrics:
            for lamb in args.lambs:
                seconds: dict[str, list[float]] = {name: [] for name in jobs}
                for _ in range(args.timing):
                    for name, (config, checkout) in jobs.items():
                        flags = [*config_flags(config), "--algorithm", metric, "--lamb", str(lamb)]
                        seconds[name].append(cli_selection(source, flags, checkout)[1]["job_seconds"])
                first = min(next(iter(seconds.values())))
                for name, runs in seconds.items():
                    each = ", ".join(f"{x:.1f}" for x in runs)
                    lines.append(f"| {case} | {metric} | {lamb:g} | {name} | {each} | {min(runs):.1f} | "
                                 f"{first / min(runs):.2f}x |")
                print(lines[-len(seconds):], flush=True)
    return "\n".join(lines) + "\n"


def sweep_rows(args) -> list[dict]:
    changes = next(iter(args.settings.values()))
    print("| case | metric | lamb | lamb scale | quality: share of top-k's gain | "
          "diversity: share of greedy's gain |\n|---|---|---:|---|---:|---:|")
    results = []
    for case in args.case:
        source, quality, emb = dataset(case)
        flags = config_flags(job_config(case, changes, args.profile))
        for metric in args.metrics:
            runs = [(lamb, scale) for lamb in SWEEP for scale in ("paper", "gain")]
            masks = [cli_selection(source, [*flags, "--algorithm", metric, "--lamb", str(lamb),
                                            "--lamb-scale", scale])[0] for lamb, scale in runs]
            for (lamb, scale), shares in zip(runs, term_shares(quality, emb, masks, algorithm=metric),
                                             strict=True):
                results.append({"case": case, "metric": metric, "lamb": lamb, "lamb_scale": scale,
                                "quality_share": shares.quality, "diversity_share": shares.diversity})
                print(f"| {case} | {metric} | {lamb} | {scale} | {shares.quality:.1%} | "
                      f"{shares.diversity:.1%} |", flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=sorted(CASES), nargs="+", default=["20k-d768"])
    parser.add_argument("--metrics", nargs="+", default=["Pair_simi", "Facility", "DiSF"])
    parser.add_argument("--lambs", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--sweep", action="store_true", help="lamb 0 to 1 with both lamb scales")
    parser.add_argument("--greedy-max-work", type=float, default=GREEDY_MAX_WORK,
                        help="lazy greedy's cost above which the baseline is lazy greedy on the k-NN graph "
                             "(Facility) or stochastic greedy")
    parser.add_argument("--profile", default="cpu", help="the profile the settings start from (default: cpu)")
    parser.add_argument("--opt", action="append", default=[],
                        help="key=value: a cpu profile setting changed (repeatable)")
    parser.add_argument("--try", dest="tries", action="append", default=[], metavar="'KEY=VALUE ...'",
                        help="also run with these settings changed, side by side (repeatable)")
    parser.add_argument("--timing", type=int, metavar="N",
                        help="score nothing: time each setting's job N times, in turn")
    parser.add_argument("--against", type=Path, metavar="CHECKOUT",
                        help="with --timing: also time the first setting's job run by the package of this "
                             "source tree (a git worktree of another commit, such as main's)")
    parser.add_argument("--json", help="append the results to this JSON file")
    args = parser.parse_args(argv)
    if args.against and not (args.timing and (args.against / "datamask_dask").is_dir()):
        parser.error(f"--against {args.against}: needs --timing and a source tree holding datamask_dask/")
    named = [f"{args.profile} profile"] if args.profile != "cpu" else []
    name = " ".join([*named, *args.opt]) or "defaults"
    args.settings = {name: args.opt}  # each case's own changes come first (job_config)
    for changes in args.tries:
        args.settings[changes] = [*args.opt, *changes.split()]
    data = {case: {key: value for key, value in asdict(CASES[case]).items() if value is not None}
            for case in args.case}
    if args.timing:
        text = timing_lines(args)
        print(text)
        if args.json:
            record.append(args.json, command=record.command("bench_quality.py", argv), data=data,
                          markdown=text)
        return 0
    results = sweep_rows(args) if args.sweep else yardstick_rows(args)
    if args.json:
        record.append_run(args.json, {
            "command": record.command("bench_quality.py", argv),
            "data": data, "machine": record.machine(), "commit": record.commit(), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
