"""Results of the large-run scripts as JSON: each run appends one record (its command, data, machine,
commit, and its tables: ``columns`` and ``rows``) to a file in ``benchmarks/results/``, which
``render.py`` writes onto docs/benchmarks.md. The figures live only there."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    """The CPU model, its cores and the memory (and the GPU, where there is one)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    text = f"{model}, {os.cpu_count()} cores, {memory:.0f} GiB"
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        gpu = []
    return text + (f", {len(gpu)} x {gpu[0]}" if gpu else ", no GPU")


def commit(tree: Path = ROOT) -> str:
    """The checkout's short commit, ``+changes`` when the package differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True).stdout.strip()

    if os.environ.get("BENCH_COMMIT"):  # a copy of the tree sent elsewhere (a device machine): its commit
        return os.environ["BENCH_COMMIT"]
    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    dirty = git("status", "--porcelain", "--", "datamask_dask", "integrations")
    return head + ("+changes" if dirty else "")


def tree_environment(tree) -> dict:
    """The environment of a process that runs the package of the source tree ``tree`` (another
    checkout, side by side with this one): its package and its Spark integration first."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.path.join(str(tree), "integrations")])}


def command(script: str, argv=None) -> str:
    """The command line that reruns the script, quoted as a shell reads it."""
    return f"python benchmarks/{script} " + shlex.join(sys.argv[1:] if argv is None else argv)


def tables_of(markdown: str) -> tuple[str, list[dict]]:
    """The title (first heading) and the tables of a script's markdown output, each table with the
    paragraph before it that ends in a colon as its caption."""
    title, tables, paragraph, rows = "", [], [], []

    def close_table():
        if rows:
            caption = " ".join(paragraph)
            tables.append({**({"caption": caption} if caption.endswith(":") else {}), "columns": rows[0],
                           "rows": rows[1:]})
            rows.clear()
        paragraph.clear()

    fresh = True  # the next text line starts a paragraph
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(set(cell) <= set(":-") and cell for cell in cells):
                rows.append(cells)
            continue
        if rows:
            close_table()
        if line.startswith("#") and not title:
            title = line.lstrip("# ").strip()
        elif not line.strip():
            fresh = True
        elif not line.startswith(("Command:", "    ")):
            if fresh:
                paragraph.clear()
            paragraph.append(line.strip())
            fresh = False
    close_table()
    return title, tables


def append(path: str | os.PathLike, *, command: str, data: dict | str, markdown: str,
           note: str | None = None) -> dict:
    """Append one run to the JSON list at ``path``: the tables of the script's ``markdown`` output
    with its command, ``data`` ({name: {key: number}} or a sentence), machine and commit."""
    title, tables = tables_of(markdown)
    return append_run(path, {**({"title": title} if title else {}), "command": command, "data": data,
                             "machine": machine(), "commit": commit(), **({"note": note} if note else {}),
                             "tables": tables})


def append_run(path: str | os.PathLike, run: dict) -> dict:
    """Append one run's record to the JSON list at ``path`` (created with its folder if missing)."""
    path = Path(path)
    previous = json.loads(path.read_text()) if path.exists() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([*previous, run], indent=1) + "\n")
    return run
