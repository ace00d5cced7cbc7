"""Every flag of ``datamask select`` on every engine, with an input and as the demo: it applies there, or the
command refuses it at once in one line naming it, before any library loads or anything is written."""

from __future__ import annotations

import argparse

import pytest
from conftest import FAST

from datamask_dask import write_parquet
from datamask_dask.cli import build_parser, given_flags, main, parse_command, refused_flags, subcommand
from datamask_dask.options import FIELDS

# What each way of running reads of the CLI's own flags (the options' flags, FIELDS, go to every job as
# options). Read from the code that runs them: cli._run_select / _run_table_select (Dask),
# _run_select_spark (Spark), _run_demo and _start_client (the demo).
SPARK_READS = {"config", "verbose", "overwrite", "resume", "spark_master", "mode", "output_columns",
               "incremental", "row_filter"}
DEMO_READS = {"config", "verbose", "scheduler", "n_workers", "threads_per_worker", "rows", "dim",
              "partitions"}
DASK_READS = {"config", "verbose", "overwrite", "resume", "scheduler", "n_workers", "threads_per_worker",
              "progress", "output_columns", "mode", "incremental", "row_filter", "text_column", "scorer",
              "model", "embed_batch_size", "max_tokens", "long_documents", "embed_precision"}
#: what else a flag needs to mean something, wherever it applies
NEEDS = {"threads_per_worker": ["--n-workers", "2"], "scorer": ["--text-column", "text"],
         "model": ["--text-column", "text"], "embed_batch_size": ["--text-column", "text"],
         "max_tokens": ["--text-column", "text"], "long_documents": ["--text-column", "text"],
         "embed_precision": ["--text-column", "text"]}
JOB = ["--input", "in", "--output", "out"]
WAYS = {"dask": JOB, "spark": ["--engine", "spark", *JOB], "demo": ["--demo"]}
READS = {"dask": DASK_READS, "spark": SPARK_READS, "demo": DEMO_READS}
RUN = {"help", "input", "output", "demo", "engine"}  # what picks the way itself


def _select_flags() -> list[argparse.Action]:
    actions = subcommand(build_parser(), "select")._actions
    return [a for a in actions if a.option_strings and a.dest not in RUN]


def _value(action: argparse.Action) -> list[str]:
    """The flag with a value other than its default."""
    if action.nargs == 0:
        return [action.option_strings[0]]
    if action.choices:
        return [action.option_strings[0], next(str(c) for c in action.choices if c != action.default)]
    special = {"quality_column": "quality_score", "budget_tokens": "100", "by": "lang", "ratio": "0.2"}
    return [action.option_strings[0], special.get(action.dest, "2")]


def _refusal(argv: list[str]) -> str | None:
    parser = build_parser()
    args = parse_command(parser, argv)
    return refused_flags(args, given_flags(parser, args))


@pytest.mark.parametrize("way", list(WAYS))
def test_every_flag_applies_or_is_refused_by_name(way):
    flags = _select_flags()
    assert len(flags) > 50  # every option's flag and the CLI's own
    for action in flags:
        refusal = _refusal(["select", *WAYS[way], *NEEDS.get(action.dest, []), *_value(action)])
        spelled = action.option_strings[0]
        if action.dest in FIELDS or action.dest in READS[way]:
            assert refusal is None, (way, spelled, refusal)
        else:
            assert refusal is not None and spelled in refusal, (way, spelled, refusal)


@pytest.mark.parametrize("argv, named", [
    (["--threads-per-worker", "2"], "--threads-per-worker needs --n-workers"),
    (["--model", "m"], "--model needs --text-column"),
    (["--n-workers", "2", "--scheduler", "tcp://x:1"], "--n-workers needs no --scheduler"),
    (["--mode", "append", "--overwrite"], "--mode needs no --overwrite"),
    (["--rows", "10"], "--rows needs --demo"),
])
def test_a_flag_without_what_it_needs_is_refused_by_name(argv, named):
    refusal = _refusal(["select", *JOB, *argv])
    assert refusal is not None and refusal.startswith(named)


def test_the_sample_corpus_s_size_applies_to_the_demo_and_the_sample_command():
    assert _refusal(["sample", "--rows", "10", "--dim", "4", "--partitions", "2", "--output", "x"]) is None
    assert _refusal(["demo", "--rows", "10"]) is None and _refusal(["select", "--rows", "10"]) is None


@pytest.mark.parametrize("way", list(WAYS))
def test_no_progress_bar_applies_everywhere(way):
    assert _refusal(["select", *WAYS[way], "--no-progress"]) is None


def test_the_demo_refuses_an_input_and_spark():
    assert _refusal(["select", "--demo", *JOB]).startswith("--input needs no --demo")
    assert _refusal(["select", "--engine", "spark"]).startswith("--engine needs an --input")
    assert _refusal(["demo", "--overwrite"]).startswith("--overwrite needs --output")


@pytest.mark.slow
def test_a_refused_flag_stops_the_job_before_it_starts_and_an_accepted_one_runs(tmp_path, corpus, capsys):
    source = tmp_path / "in"
    write_parquet(corpus, source)
    fast = ["--n_epochs", str(FAST["n_epochs"]), "--n_rollout", str(FAST["n_rollout"])]
    assert main(["select", "--engine", "spark", "--input", str(source), "--output", str(tmp_path / "spark"),
                 "--n-workers", "2", *fast]) == 1
    assert "--n-workers needs --engine dask" in capsys.readouterr().err
    assert not (tmp_path / "spark").exists()
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "out"), "--n-workers", "1",
                 "--threads-per-worker", "2", *fast]) == 0
    assert (tmp_path / "out").exists()
