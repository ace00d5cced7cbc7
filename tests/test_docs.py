"""The documentation's code blocks run as written.

Every fenced ```python and ```bash block of ``docs/`` runs, page by page in the order of the
site's navigation, in one directory (the getting-started page makes the sample corpus the later
pages use). A block that cannot run here opens with ``# not run: <why>`` (it needs a bucket, a
Spark session, a GPU...), and says so on the page.

Our own runner rather than mktestdocs or Sybil: the pages interleave bash and python blocks that
build on each other in one directory, which mktestdocs runs one language at a time and Sybil only
through an evaluator like this one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.M | re.S)


def _pages() -> list[Path]:
    """The pages in navigation order."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8").replace("!!python", ""))

    def walk(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from walk(value) if isinstance(value, list) else [DOCS / value]

    return list(walk(config["nav"]))


def _blocks() -> list[tuple[Path, str, str]]:
    return [(page, kind, code) for page in _pages() for kind, code in BLOCK.findall(page.read_text("utf-8"))]


def test_every_page_of_the_navigation_exists_and_every_page_is_in_it():
    pages = _pages()
    assert all(page.exists() for page in pages)
    assert {p for p in DOCS.rglob("*.md")} == set(pages)


def test_blocks_that_do_not_run_say_why():
    for page, _, code in _blocks():
        first = code.splitlines()[0] if code.strip() else ""
        if first.startswith("# not run"):
            assert re.match(r"# not run: \S", first), f"{page.name}: say why the block does not run: {first}"


def test_every_runnable_code_block_of_the_docs_runs(tmp_path):
    runnable = [(page, kind, code) for page, kind, code in _blocks() if not code.startswith("# not run")]
    assert len(runnable) >= 4
    bin_dir = Path(sys.executable).parent  # the `datamask` console script of this environment
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "DATAMASK_PROGRESS": "0"}
    for page, kind, code in runnable:
        script = tmp_path / ("block.py" if kind == "python" else "block.sh")
        script.write_text(code if kind == "python" else "set -euo pipefail\n" + code)
        command = [sys.executable, str(script)] if kind == "python" else ["bash", str(script)]
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        where = page.relative_to(ROOT)
        assert run.returncode == 0, f"{where}: {kind} block failed:\n{code}\n{run.stderr[-3000:]}"
        for expected in re.findall(r"print\(.*\)\s+# (\d+)", code):  # printed numbers the page shows
            assert expected.split()[0] in run.stdout, f"{page.name}: expected {expected!r} in:\n{run.stdout}"


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "mkdocs").exists() and
                    not Path(sys.executable).with_name("mkdocs").exists(),
                    reason="mkdocs is not installed (the docs extra)")
def test_the_command_line_page_is_the_parser_help():
    sys.path.insert(0, str(DOCS))
    try:
        from hooks import cli_reference
    finally:
        sys.path.remove(str(DOCS))
    from datamask_dask.cli import build_parser

    reference = cli_reference()
    for line in build_parser().format_help().splitlines():
        assert line.strip() in reference


def test_the_benchmarks_page_is_what_its_results_give():
    """The generated sections of docs/benchmarks.md come from benchmarks/results/*.json, not by hand."""
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    for name in ("quality", "tradeoff", "lamb"):
        section = page.split(f"<!-- generated: {name} -->")[1].split(f"<!-- end: {name} -->")[0]
        assert "Command: `python benchmarks/bench_quality.py" in section and "Commit: `" in section, name
