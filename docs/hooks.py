"""MkDocs hook: the command-line page is generated from the parser itself, so `datamask --help` and
the docs say the same; and the docstrings that the package completes when it is imported (their option
lists are made from the options' fields) are read from the imported objects (:class:`ImportedDocstrings`,
a Griffe extension of mkdocstrings)."""

from __future__ import annotations

import argparse
import importlib
import inspect

import griffe

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


class ImportedDocstrings(griffe.Extension):
    """The docstrings of ``PATHS`` as the imported objects have them, not as their source writes them."""

    PATHS = ("datamask_dask.dask_engine.operator.datamask_select",
             "datamask_dask.learn.options.DataMaskOptions")

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.path in self.PATHS:
            module, name = obj.path.rsplit(".", 1)
            text = inspect.getdoc(getattr(importlib.import_module(module), name))
            obj.docstring = griffe.Docstring(text, parent=obj)
