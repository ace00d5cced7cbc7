"""How long the ``datamask`` command takes to answer when it only parses: ``--version``, ``--help``,
``select --help`` and an option it refuses (``--select_ratio 0``).

Each command runs ``--repeats`` times as a fresh ``python -m datamask_dask.cli`` process (what the
console script runs); the wall-clock median is reported. ``--before PATH`` runs the same commands
with another checkout of the package (``git worktree add``) beside this one, interleaved, so load
from other work falls on both alike.

    python benchmarks/bench_cli_start.py --before ../main-checkout
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record

HERE = Path(__file__).resolve().parent

COMMANDS = {
    "--version": ["--version"],
    "--help": ["--help"],
    "select --help": ["select", "--help"],
    "option error": ["select", "--input", "x", "--output", "y", "--select_ratio", "0"],
}


def run_once(tree: str, argv: list[str], cwd: str) -> tuple[float, int]:
    """Wall-clock seconds and exit status of one ``datamask`` process on the package in ``tree``."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, os.path.join(tree, "integrations")])}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "datamask_dask.cli", *argv], cwd=cwd, env=environment,
                          capture_output=True, timeout=300)
    return time.perf_counter() - start, done.returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", help="another checkout of the package, run beside this one")
    args = parser.parse_args(argv)
    trees = {"this checkout": str(HERE.parent)}
    if args.before:
        trees = {"before": str(Path(args.before).resolve()), **trees}
    seconds: dict = {(name, label): [] for name in COMMANDS for label in trees}
    status: dict = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-cli-start-") as cwd:  # x and y do not exist there
        for _ in range(args.repeats):
            for name, command in COMMANDS.items():
                for label, tree in trees.items():
                    took, code = run_once(tree, command, cwd)
                    seconds[name, label].append(took)
                    status[name, label] = code
    given = shlex.join(sys.argv[1:] if argv is None else argv)
    commits = ", ".join(f"{label} {record.commit(Path(tree))} ({tree})" for label, tree in trees.items())
    lines = ["# Start-up of the datamask command", "",
             f"Command: `python benchmarks/bench_cli_start.py {given}`", "",
             f"Machine: {record.machine()}, shared with other work; load at start {load:.2f}. "
             f"Python {sys.version.split()[0]}. Commits: {commits}.", "",
             f"Median wall-clock seconds of {args.repeats} fresh processes "
             "(`python -m datamask_dask.cli ...`), the checkouts interleaved:", "",
             "| command | " + " | ".join(f"{label}, median s | {label}, exit" for label in trees) + " |",
             "|---|" + "---:|---:|" * len(trees)]
    for name, command in COMMANDS.items():
        cells = [f"{statistics.median(seconds[name, label]):.2f} | {status[name, label]}" for label in trees]
        lines.append(f"| `datamask {shlex.join(command)}` | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
