"""What every sub-command shares of the command line: the parsers of its values (``argparse``
``type=``) and the spelling of the package's keywords as its flags, in messages."""

from __future__ import annotations

import argparse
import re

from .errors import REPLACE_OUTPUT, WRITE_INTO_TABLE, WRITING_DOORS
from .options import FIELDS

_REFERENCE_FLAGS = ("n_epochs", "max_lr", "min_lr", "n_rollout")
# Keywords of the text functions (embed, score_quality) whose flags the text commands share.
_TEXT_KEYWORDS = ("text_column", "output_column", "model", "scorer")
# Python keyword spellings in the package's messages -> the CLI flags a user of the CLI types.
_FLAG_SPELLINGS = {REPLACE_OUTPUT: "--overwrite", WRITE_INTO_TABLE: "--mode append or --mode overwrite",
                   WRITING_DOORS: "an output is replaced with --overwrite, and appended to (Delta, Iceberg) "
                                  "with --mode append",
                   "check_ids=False": "--no-check-ids", "resume=False (--no-resume)": "--no-resume",
                   "overwrite=True": "--overwrite",
                   "mode='append'": "--mode append", "mode='overwrite'": "--mode overwrite"}


def at_least(least: int):
    """The parse of a count (processes, threads, rows...): a whole number >= ``least``."""
    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"a whole number >= {least}, not {text!r}")
        return int(text)

    return parse


def flag_name(key: str) -> str:
    """An option's flag, without its dashes: the reference tool's learner flags keep their underscores
    (--n_rollout); ours use hyphens."""
    return key if key in _REFERENCE_FLAGS else key.replace("_", "-")


def as_cli_message(message: str) -> str:
    """``message`` with the package's keyword spellings (``id_column=``) as CLI flags (``--id-column``)."""
    for python, cli in _FLAG_SPELLINGS.items():
        message = message.replace(python, cli)

    def flag(match: re.Match) -> str:
        key = match.group(1)
        if key not in FIELDS and key not in _TEXT_KEYWORDS:
            return match.group(0)
        name = flag_name(key)
        return f"--{name}" if match.group("bare") is not None else f"--{name}="

    # "option id_column=x" -> "--id-column=x", "with id_column=, ..." -> "with --id-column, ..."
    return re.sub(r"(?<![\w.-])(?:option )?([a-z_]+)=(?P<bare>(?=[,;.\s)]|$))?", flag, message)
