"""The regression gate: the asv suite (``benchmarks/suite``) on a base commit and on the working tree,
both in this Python environment, compared benchmark by benchmark. Exits 1 when

- a selection-quality or recall figure (unit ``points``) drops by more than ``--points`` (0.5), or a
  false-merge rate (``points (lower is better)``) rises by more;
- an exact count (unit ``rows``) changes;
- a time, a peak memory or another count grows by more than ``--factor`` (1.3x), and, where both sides
  ran several samples, their 99% confidence intervals do not overlap (noise on a shared machine);
- a benchmark that ran on the base fails on the working tree.

The base is checked out into a temporary git worktree; both sides run the working tree's suite, with
``PYTHONPATH`` pointing at the side's package, so they measure the code and nothing else.

    python benchmarks/regression_gate.py                        # base: main, quick profile
    python benchmarks/regression_gate.py --base HEAD~3 -b SelectionQuality -b NearDuplicates
    python benchmarks/regression_gate.py --full                 # asv's full sampling: noise-aware timings
    python benchmarks/regression_gate.py --record benchmarks/results/suite.json    # the working tree only

``--record`` runs the suite on the working tree alone and appends its figures, with the command, the
suites' data, the machine and the commit, to a results file (docs/benchmarks.md's suite section).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "benchmarks" / "asv.conf.json"


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def run_side(tree: Path, commit: str, results: Path, args, bench=None) -> None:
    """``asv run`` of this checkout's suite against the package in ``tree``, results into ``results``."""
    from asv.util import load_json

    config = load_json(str(CONFIG), js_comments=True)
    config.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks" / "suite"),
                  results_dir=str(results), env_dir=str(results / "env"), html_dir=str(results / "html"))
    path = results / "asv.conf.json"
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    paths = os.pathsep.join([str(tree), str(tree / "integrations")])
    # asv drops PYTHONPATH from the benchmarks' processes and passes ASV_PYTHONPATH instead
    env = {**os.environ, "PYTHONPATH": paths, "ASV_PYTHONPATH": paths}
    # one machine name for both sides, so their results sit side by side (~/.asv-machine.json)
    subprocess.run([sys.executable, "-m", "asv", "machine", "--yes", "--machine", "gate", "--config",
                    str(path)], cwd=ROOT / "benchmarks", env=env, check=True, capture_output=True)
    command = [sys.executable, "-m", "asv", "run", "--config", str(path), "--python=same",
               "--set-commit-hash", commit, "--machine", "gate", "--show-stderr",
               *(["--quick"] if not args.full else []),
               *itertools.chain.from_iterable(("-b", pattern) for pattern in (bench or args.bench))]
    print("$", " ".join(command), f"(ASV_PYTHONPATH={paths})", flush=True)
    subprocess.run(command, cwd=ROOT / "benchmarks", env=env, check=False)


def load(results: Path) -> dict:
    """{(benchmark, params): (value, ci_low, ci_high, unit, kind)} of one side's run."""
    meta = json.loads((results / "benchmarks.json").read_text())
    out = {}
    for path in (results / "gate").glob("*.json"):
        if path.name == "machine.json":
            continue
        record = json.loads(path.read_text())
        columns = record["result_columns"]
        for name, row in record["results"].items():
            row = dict(zip(columns, row, strict=False))
            params = list(itertools.product(*row.get("params") or [[]]))
            values = row["result"] if isinstance(row["result"], list) else [row["result"]]
            # one sample (--quick) has infinite confidence intervals: no spread is known
            low = [a if a is not None and math.isfinite(a) else None
                   for a in row.get("stats_ci_99_a") or [None] * len(values)]
            high = [b if b is not None and math.isfinite(b) else None
                    for b in row.get("stats_ci_99_b") or [None] * len(values)]
            for param, value, a, b in zip(params or [()], values, low, high, strict=False):
                out[name, param] = (value, a, b, meta[name].get("unit", ""), meta[name]["type"])
    return out


MISSING = (None, None, None, "", "")


def least(first: dict, again: dict) -> dict:
    """Each benchmark's least value over two runs (a failure counts only if both failed)."""
    merged = dict(first)
    for key, new in again.items():
        old = merged.get(key)
        if old is None or old[0] is None or (new[0] is not None and new[0] < old[0]):
            merged[key] = new
    return merged


def verdict(before: tuple, after: tuple, args) -> tuple[str, str]:
    """(OK/FAIL/skipped/new, the change in words) of one benchmark."""
    (old, _, old_high, unit, _), (new, new_low, _, _, _) = before, after
    if old is None or (isinstance(old, float) and math.isnan(old)):
        return "new", "" if new is None else f"{new:.4g}"
    if new is None:
        return "FAIL", "failed on the working tree"
    if isinstance(new, float) and math.isnan(new):
        return "skipped", ""
    change = new - old
    if unit.startswith("points"):
        worse = -change if unit == "points" else change
        return ("FAIL" if worse > args.points else "OK"), f"{old:.3f} -> {new:.3f} ({change:+.3f} points)"
    if unit == "rows":
        return ("FAIL" if new != old else "OK"), f"{old:g} -> {new:g}"
    ratio = new / old if old else math.inf if new else 1.0
    noisy = None not in (old_high, new_low) and new_low <= old_high  # the 99% intervals overlap
    failed = ratio > args.factor and not noisy
    note = ", within noise" if noisy else ""
    return ("FAIL" if failed else "OK"), f"{old:.4g} -> {new:.4g} {unit} ({ratio:.2f}x{note})"


def record_suite(args, argv) -> int:
    """The suite on the working tree, its figures appended to ``args.record`` (benchmarks/record.py)."""
    work = Path(tempfile.mkdtemp(prefix="datamask-suite-"))
    run_side(ROOT, git("rev-parse", "HEAD"), work / "head", args)
    save_record(args, argv, load(work / "head"))
    shutil.rmtree(work, ignore_errors=True)
    return 0


def save_record(args, argv, figures: dict) -> None:
    """Append ``figures`` (:func:`load`'s) with the command, the suites' data, machine and commit."""
    import record  # beside this script
    from suite.data import SHAPES

    results = [{"benchmark": name, "params": list(params), "value": value, "unit": unit}
               for (name, params), (value, _, _, unit, _) in sorted(figures.items(), key=str)]
    note = "" if args.full else "asv's quick profile: one sample of each timing"
    entry = {"command": record.command("regression_gate.py", argv), "data": SHAPES,
             "machine": record.machine(), "commit": record.commit(), "note": note, "results": results}
    path = Path(args.record)
    previous = json.loads(path.read_text()) if path.exists() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([*previous, entry], indent=1) + "\n")
    print(f"recorded {len(results)} figures in {path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="the commit to compare with (default: main; none with --record alone)")
    parser.add_argument("--factor", type=float, default=1.3, help="allowed growth of time and memory")
    parser.add_argument("--points", type=float, default=0.5, help="allowed drop of a quality share")
    parser.add_argument("-b", "--bench", action="append", default=[], help="asv's benchmark regex")
    parser.add_argument("--full", action="store_true", help="asv's full sampling instead of --quick")
    parser.add_argument("--keep", help="keep both sides' asv results in this folder")
    parser.add_argument("--confirm", type=int, default=2,
                        help="runs of a failing timing or memory benchmark again on both sides, alternating; "
                             "the least of each side's values counts (default 2)")
    parser.add_argument("--record", help="append the working tree's figures to this JSON file (alone: no "
                                          "comparison, only the working tree runs)")
    args = parser.parse_args(argv)
    if args.record and args.base is None:
        return record_suite(args, argv)
    args.base = args.base or "main"
    base = git("rev-parse", args.base)
    # the working tree as a commit object (uncommitted changes included), or HEAD when it is clean
    head = git("stash", "create") or git("rev-parse", "HEAD")
    work = Path(args.keep or tempfile.mkdtemp(prefix="datamask-gate-"))
    tree = work / "base-tree"
    if tree.exists():
        git("worktree", "remove", "--force", str(tree))
    git("worktree", "add", "--detach", str(tree), base)
    try:
        run_side(tree, base, work / "base", args)
        run_side(ROOT, head, work / "head", args)
        before, after = load(work / "base"), load(work / "head")
        for again in range(args.confirm):
            # noise on a shared machine: what fails on time, memory or a failure is measured again
            suspects = sorted({name for (name, params), now in after.items()
                               if (now[4] != "track" or now[0] is None)
                               and verdict(before.get((name, params), MISSING), now, args)[0] == "FAIL"})
            if not suspects:
                break
            pattern = "^(" + "|".join(re.escape(name) for name in suspects) + ")$"
            run_side(tree, base, work / f"base-{again}", args, bench=[pattern])
            run_side(ROOT, head, work / f"head-{again}", args, bench=[pattern])
            before = least(before, load(work / f"base-{again}"))
            after = least(after, load(work / f"head-{again}"))
    finally:
        git("worktree", "remove", "--force", str(tree))
    failed = 0
    print(f"\nregression gate: {args.base} ({base[:8]}) -> working tree ({head[:8]}); fails on a drop of "
          f"more than {args.points} points, a changed exact count, or growth beyond {args.factor}x")
    for key in sorted(after, key=str):
        name, params = key
        label = name + (f"({', '.join(map(str, params))})" if params else "")
        state, change = verdict(before.get(key, MISSING), after[key], args)
        failed += state == "FAIL"
        print(f"{state:>7}  {label:<72} {change}")
    if args.record:
        save_record(args, argv, after)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if failed:
        print(f"regression gate: {failed} regression(s)", file=sys.stderr)
        return 1
    print("regression gate: no regression")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
