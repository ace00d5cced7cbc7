"""``datamask report OUTPUT [--out DIR]``: the report of a finished selection (see :mod:`.build`).

Glue for :mod:`datamask_dask.cli`: ``add_report_parser(commands)`` adds the sub-command to the
``datamask`` parser's sub-parsers, and ``run_report(args)`` runs it (exit status). Standalone:
``report_command(argv)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..arguments import at_least
from ..options import TEXT_COLUMN


def default_out_dir(output: str | Path) -> str:
    """``OUTPUT-report`` next to the output, on its filesystem (never inside it: an output holds only
    its run's files); for an Iceberg table, which has no path of its own, in the working directory."""
    from ..io.tables import parse_table_uri

    return f"{parse_table_uri(output).location.rstrip('/')}-report"


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``report`` to an ``argparse`` sub-parsers object; returns its parser."""
    parser = subparsers.add_parser(
        "report", help="write an HTML report (with PNG figures) of a finished selection",
        description="Write an HTML page and PNG figures about a datamask output: learning curves, "
        "quality of all vs selected rows, a 2-D PCA projection of the embeddings, quotas per partition "
        "and group, the objective against quality top-k and random. The page is one self-contained "
        "file and opens without network access.")
    parser.add_argument("output", help="output directory or file of `datamask select`, or its Delta / "
                        "Iceberg table URI")
    parser.add_argument("--out", "--output", dest="report_dir", metavar="REPORT_DIR",
                        help="report directory (default: OUTPUT-report next to it)")
    parser.add_argument("--sample-rows", "--sample_rows", dest="sample_rows", type=at_least(1), default=5000,
                        help="rows of the output read for the quality and projection figures")
    parser.add_argument("--seed", type=at_least(0), default=0, dest="report_seed", help="seed of that sample")
    parser.add_argument("--no-embed", dest="embed", action="store_false",
                        help="link the PNG files from the page instead of inlining them")
    _add_text_column(parser, "column whose snippets the audit of an explained output shows")
    return parser


def _add_text_column(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--text-column", "--text_column", dest="text_column", default=TEXT_COLUMN,
                        help=f"{what}, where the output has it (default: {TEXT_COLUMN})")


def run_report(args: argparse.Namespace) -> int:
    """Build the report the parsed ``args`` ask for; print where it is. Returns the exit status."""
    from .build import build_report

    out_dir = args.report_dir or default_out_dir(args.output)
    try:
        page = build_report(args.output, out_dir, sample_rows=args.sample_rows, seed=args.report_seed,
                            embed=args.embed, text_column=args.text_column)
    except (OSError, ValueError, ImportError) as exc:
        print(f"datamask report: error: {exc}", file=sys.stderr)
        return 1
    print(f"datamask report: {page}")
    return 0


def add_explain_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``explain`` to an ``argparse`` sub-parsers object; returns its parser."""
    parser = subparsers.add_parser(
        "explain", help="why one row of an explained output was selected, or not",
        description="Tell one row's story from an output written with `datamask select --explain`: its "
        "reason and quality, its near-duplicate group (members, quality, estimated cosine, the kept row), "
        "its partition's quota and its rank there, and text snippets where a text column exists. It reads "
        "the output and its run record; it does not rerun the selection.")
    parser.add_argument("output", help="output directory or file of `datamask select --explain`, or its "
                        "Delta / Iceberg table URI")
    parser.add_argument("--id", dest="row_id", required=True, help="the row's id (the run's id column)")
    _add_text_column(parser, "column whose snippets are shown")
    parser.add_argument("--neighbours", type=at_least(0), default=3,
                        help="show this many nearest selected rows by embedding (reads the selected rows' "
                        "embeddings; 0: none)")
    parser.add_argument("--json", dest="as_json", action="store_true", help="print the story as JSON")
    return parser


def run_explain(args: argparse.Namespace) -> int:
    """Print the story of ``args.row_id`` in ``args.output``. Returns the exit status."""
    import json

    from .audit import format_story, row_story

    try:
        story = row_story(args.output, args.row_id, text_column=args.text_column, neighbours=args.neighbours)
    except (OSError, ValueError) as exc:
        print(f"datamask explain: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(story, indent=2, default=str) if args.as_json else format_story(story))
    return 0


def report_command(argv: list[str] | None = None) -> int:
    """``datamask report`` on its own: parse ``argv`` and run it."""
    parser = argparse.ArgumentParser(prog="datamask")
    add_report_parser(parser.add_subparsers())
    return run_report(parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(report_command())
