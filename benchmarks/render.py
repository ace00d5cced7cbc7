"""Write the generated sections of docs/benchmarks.md from the JSON results in benchmarks/results/.

Each section sits between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->`` and is rewritten
from ``benchmarks/results/NAME.json`` (a list of runs, each with its command, data, machine, commit
and results, as the benchmark scripts append them); a row a later run measured again shows the later
figure. Nothing in it is typed by hand.

    python benchmarks/render.py            # rewrite the sections
    python benchmarks/render.py --check    # exit 1 if a section differs from its results
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"


def _figure(value) -> str:
    return f"{value:,}" if isinstance(value, int | float) else str(value)


def _provenance(run: dict) -> list[str]:
    data = run.get("data", {})
    if isinstance(data, dict):  # {case: {key: number or text}}
        data = "; ".join(f"{case}: {', '.join(f'{k} {_figure(v)}' for k, v in shape.items())}"
                         for case, shape in data.items())
    note = [f"Note: {run['note'].rstrip('.')}.", ""] if run.get("note") else []
    return [f"Command: `{run['command']}`", "", f"Data: {data}. Machine: {run['machine']}. "
            f"Commit: `{run['commit']}`.", "", *note]


def _newest(runs: list[dict], key) -> list[dict]:
    """The runs with only the rows no later run measured again (a later run supersedes its rows)."""
    seen, kept = set(), []
    for run in reversed(runs):
        rows = [row for row in run["results"] if key(row) not in seen]
        seen.update(key(row) for row in rows)
        if rows:
            kept.append({**run, "results": rows})
    return kept[::-1]


def quality(runs: list[dict]) -> list[str]:
    lines = []
    for run in _newest(runs, lambda row: (row["case"], row["metric"], row["lamb"], row["settings"])):
        lines += _provenance(run)
        pieces = all("pieces" in row for row in run["results"])  # the pieces learned apart, where counted
        lines += [f"| case | metric | lamb | settings |{' pieces |' if pieces else ''} share of baseline's "
                  "gain | objective | random | baseline | quality top-k (share) | job s (learning) |",
                  f"|---|---|---:|---|{'---:|' if pieces else ''}---:|---:|---:|---|---|---:|"]
        for row in run["results"]:
            lines.append(f"| {row['case']} | {row['metric']} | {row['lamb']:g} | {row['settings']} | "
                         + (f"{row['pieces']} | " if pieces else "") +
                         f"**{row['share']:.1%}** | {row['objective']:.5f} | {row['random']:.5f} | "
                         f"{row['baseline']:.5f} ({row['baseline_name']}) | {row['topk']:.5f} "
                         f"({row['topk_share']:.1%}) | {row['job_seconds']:.1f} "
                         f"({row['learn_seconds']:.2f}) |")
        lines.append("")
    return lines


def lamb(runs: list[dict]) -> list[str]:
    lines = []
    for run in _newest(runs, lambda row: (row["case"], row["metric"], row["lamb"], row["lamb_scale"])):
        lines += _provenance(run)
        lines += ["| case | metric | lamb | quality: share of top-k's gain (paper / gain scale) | "
                  "diversity: share of greedy's gain (paper / gain scale) |", "|---|---|---:|---:|---:|"]
        rows: dict = {}
        for row in run["results"]:
            rows.setdefault((row["case"], row["metric"], row["lamb"]), {})[row["lamb_scale"]] = row
        for (case, metric, value), scales in rows.items():
            paper, gain = scales["paper"], scales["gain"]
            lines.append(f"| {case} | {metric} | {value:g} | {paper['quality_share']:.1%} / "
                         f"{gain['quality_share']:.1%} | {paper['diversity_share']:.1%} / "
                         f"{gain['diversity_share']:.1%} |")
        lines.append("")
    return lines


def tables(runs: list[dict]) -> list[str]:
    """Runs of a large-run script (``benchmarks/record.py``'s records): each run's provenance, then its
    tables; of runs with the same command, the last."""
    latest = {run["command"]: run for run in runs}
    lines = []
    for run in latest.values():
        if run.get("title"):
            lines += [f"#### {run['title']}", ""]
        lines += _provenance(run)
        for table in run["tables"]:
            if table.get("caption"):
                lines += [table["caption"], ""]
            lines += ["| " + " | ".join(table["columns"]) + " |", "|" + "---|" * len(table["columns"])]
            lines += ["| " + " | ".join(map(str, row)) + " |" for row in table["rows"]]
            lines.append("")
    return lines


def suite(runs: list[dict]) -> list[str]:
    """The asv suite's figures (``regression_gate.py --record``): one table per run, the last run of a
    command."""
    run = runs[-1]
    lines = _provenance(run)
    lines += ["| benchmark | parameters | value |", "|---|---|---:|"]
    for row in run["results"]:
        value = row["value"]
        if value is None:
            text = "failed"
        elif isinstance(value, float) and value != value:
            text = "skipped"
        elif row["unit"] == "seconds":
            text = f"{value:.3g} s"
        elif row["unit"] == "bytes":
            text = f"{value / 2**20:,.0f} MiB"
        elif float(value).is_integer():
            text = f"{int(value):,} {row['unit']}"
        else:
            text = f"{value:,.2f} {row['unit']}"
        params = ", ".join(str(param).strip("'") for param in row["params"])
        lines.append(f"| {row['benchmark']} | {params} | {text} |")
    return [*lines, ""]


# The page's first table: per section, the newest run of a script (its title starting so) whose table has
# the figure's columns and a row ``keep`` keeps (a test of the row, "last": its last row, or "newest":
# each case's newest row of any such run); a row's case is named by the ``case`` columns.
HEADLINES = (
    ("Speed on CPU", "pipeline", "", ("rows", "algorithm", "workers"), ("rows/s",), None),
    ("Against the I/O ceiling", "ceiling", "A job against the I/O ceiling", ("job",),
     ("share of ceiling: warm / fresh",), lambda row: not row["job"].startswith("before")),
    ("On a GPU", "gpu", "datamask select on GPU", ("rows", "algorithm", "workers"), ("rows/s",),
     lambda row: row["rows"] == "1,000,000" and "baseline" not in row["algorithm"]),
    ("On a GPU: the same machine's CPU cores", "gpu", "datamask select, end to end",
     ("rows", "algorithm", "workers"), ("rows/s",), None),
    ("On a GPU", "gpu", "The cuDF I/O ceiling", ("pass", "rows"), ("rows/s",), None),
    ("On a GPU", "gpu", "The -m gpu tests", ("tests",), ("passed", "failed"), None),
    ("Spark", "spark", "Spark local[2] vs Dask", ("code",), ("spark / dask", "same rows"), "last"),
    ("The table scope as the table grows", "table-scale", "", ("metric", "rows", "files"),
     ("job s", "peak RSS, largest worker", "largest task's own peak (its kind)"), "newest"),
    ("Job time of a setting beside the first of its run", "job-time", "Job time",
     ("case", "metric", "lamb", "settings"), ("least", "first setting's least / this one's"), "newest"),
    ("Near-duplicates across the table", "duplicates", "One-task near-duplicate search", ("rows",),
     ("search s (least / median)", "peak memory allocated by the search"), None),
    ("Near-duplicates on real text", "near-duplicates-text", "", ("cosine",), ("precision", "recall"),
     lambda row: row["checkout"] == "this"),
    ("Embedding precision beside sentence-transformers' pool", "embed-speed", "", ("method",),
     ("docs/s", "speed-up over the pool", "recall@10"), None),
    ("A selection task's memory", "task-memory", "", ("metric", "rows", "dim"),
     ("model MiB", "peak MiB", "fits 4 GiB thread"), None),
    ("Start-up of the command", "cli-start", "", ("command",), ("this checkout, median s",),
     lambda row: "--version" in row["command"] or "first line" in row["command"]),
)


def _machine(run: dict) -> str:
    return run["machine"].split(" (")[0]


def current(results: Path) -> list[str]:
    """One table of the current figure of each case: the newest quality rows of every case and setting
    (the lowest and highest share over its metrics and lambs), then each :data:`HEADLINES` figure; every
    row names its commit and machine, and its section below gives the command and data."""
    lines = ["| section | case | current figure | commit | machine |", "|---|---|---|---|---|"]
    if (results / "quality.json").exists():
        by_case: dict = {}
        for run in _newest(json.loads((results / "quality.json").read_text()),
                           lambda row: (row["case"], row["metric"], row["lamb"], row["settings"])):
            for row in run["results"]:
                if "pieces=" not in row["settings"]:  # not a comparison with another way of cutting the table
                    case = row["case"] + ("" if row["settings"] == "defaults" else f" ({row['settings']})")
                    by_case.setdefault(case, []).append((row, run))
        for case, rows in by_case.items():
            low = min(rows, key=lambda pair: pair[0]["share"])
            high = max(rows, key=lambda pair: pair[0]["share"])
            pieces = {row.get("pieces") for row, _ in rows} - {None}
            commits = ", ".join(dict.fromkeys(f"`{run['commit']}`" for _, run in rows))  # run order
            lines.append(
                f"| Selection quality | {case}{f', pieces: {max(pieces)}' if pieces else ''} | share of the "
                f"baseline's gain {low[0]['share']:.1%} ({low[0]['metric']}, lamb {low[0]['lamb']:g}) to "
                f"{high[0]['share']:.1%} ({high[0]['metric']}, lamb {high[0]['lamb']:g}), "
                f"{len(rows)} jobs | {commits} | {_machine(low[1])} |")
    for section, name, title, case, figure, keep in HEADLINES:
        path = results / f"{name}.json"
        if not path.exists():
            continue
        found = []
        for run in json.loads(path.read_text()):
            for table in run.get("tables", []):
                columns = table["columns"]
                if (run.get("title") or "").startswith(title) and set(case + figure) <= set(columns):
                    rows = [dict(zip(columns, map(str, cells), strict=True)) for cells in table["rows"]]
                    rows = rows[-1:] if keep == "last" else [
                        row for row in rows if not callable(keep) or keep(row)]
                    found += [(run, rows)] if rows else []
        if not found:
            continue
        picked = [(row, found[-1][0]) for row in found[-1][1]]
        if keep == "newest":  # each case's newest row, of every run that has the figure's columns
            newest: dict = {}
            for place, (run, rows) in reversed(list(enumerate(found))):
                for at, row in enumerate(rows):
                    newest.setdefault(tuple(row[column] for column in case), (place, at, row, run))
            picked = [(row, run) for _, _, row, run in sorted(newest.values(), key=lambda entry: entry[:2])]
        for row, run in picked:
            label = ", ".join(row[column] for column in case)
            value = "; ".join(f"{column} {row[column]}" for column in figure if row[column])
            lines.append(f"| {section} | {label} | {value} | `{run['commit']}` | {_machine(run)} |")
    return [*lines, ""]


SECTIONS = {"quality": quality, "tradeoff": quality, "lamb": lamb, "suite": suite,
            **{name: tables for name in ("pipeline", "gpu", "ceiling", "duplicates", "table-scale",
                                         "search-graph", "spark", "storage", "conformance", "text-speed",
                                         "embed-speed", "rounds", "workers", "cli-start",
                                         "near-duplicates-text", "plan-memory", "task-memory",
                                         "job-time")}}


def render(page: str) -> str:
    page = _fill(page, "current", "\n".join(current(RESULTS)))
    for name, build in SECTIONS.items():
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        page = _fill(page, name, "\n".join(build(json.loads(path.read_text()))))
    return page


def _fill(page: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end: {name} -->)", re.S)
    if not pattern.search(page):
        raise SystemExit(f"docs/benchmarks.md has no '<!-- generated: {name} -->' section")
    return pattern.sub(lambda match: match.group(1) + body + "\n" + match.group(2), page)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page is not what the results give")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    new = render(page)
    if args.check:
        if new != page:
            print("docs/benchmarks.md is out of date: run python benchmarks/render.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
