"""Parsers of command-line values that every sub-command shares (``argparse`` ``type=``)."""

from __future__ import annotations

import argparse


def at_least(least: int):
    """The parse of a count (processes, threads, rows...): a whole number >= ``least``."""
    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"a whole number >= {least}, not {text!r}")
        return int(text)

    return parse
