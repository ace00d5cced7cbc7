"""MkDocs hook: the command-line page is generated from the parser itself, so `datamask --help` and
the docs say the same."""

from __future__ import annotations

import argparse

MARKER = "<!-- cli-reference -->"


def _help(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
    return parser.format_help()


def cli_reference() -> str:
    from datamask_dask.cli import build_parser

    parser = build_parser()
    parts = ["```text", _help(parser).rstrip(), "```"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parts += [f"\n## datamask {name}\n", "```text", _help(sub).rstrip(), "```"]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
