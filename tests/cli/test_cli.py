"""The ``datamask`` command, end to end on parquet files and directories."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import FAST

from datamask_dask.cli import main

FAST_FLAGS = ["--n_epochs", str(FAST["n_epochs"]), "--n_rollout", str(FAST["n_rollout"])]


def _embeddings(table) -> np.ndarray:
    column = table.column("feature_arr").combine_chunks()
    return np.asarray(column.flatten()).reshape(len(column), -1)


def test_select_file_to_file(tmp_path, corpus, capsys):
    source, target = tmp_path / "in.parquet", tmp_path / "out.parquet"
    corpus.to_parquet(source)  # written by pandas, with its dtype metadata
    assert main(["select", "--input", str(source), "--output", str(target), "--select_ratio", "0.1",
                 *FAST_FLAGS]) == 0
    assert "1600 rows, 160 selected" in capsys.readouterr().out
    table = pq.read_table(target)
    assert table.column_names == [*corpus.columns, "selected"]
    assert table.column("chunk_id").to_pylist() == corpus["chunk_id"].tolist()
    assert table.column("text").to_pylist() == corpus["text"].tolist()
    np.testing.assert_array_equal(table.column("quality_score").to_numpy(),
                                  corpus["quality_score"].to_numpy())
    source_table = pq.read_table(source)
    np.testing.assert_array_equal(_embeddings(table), _embeddings(source_table))
    assert table.schema.field("feature_arr").type == source_table.schema.field("feature_arr").type
    assert int(table.column("selected").to_numpy().sum()) == 160
    assert sorted(os.listdir(tmp_path)) == ["in.parquet", "out.parquet"]  # no staging left behind


@pytest.mark.slow
def test_select_directory_on_the_cluster(tmp_path, corpus, client, capsys):
    source, target = tmp_path / "in", tmp_path / "out"
    dd.from_pandas(corpus, npartitions=3, sort=False).to_parquet(source)  # written by dask
    config = tmp_path / "job.yaml"
    config.write_text("n_rollout: 1\nn_epochs: 20\n")  # n_rollout 1 is invalid: the flag must win
    args = ["select", "--input", str(source), "--output", str(target), "--config", str(config),
            "--n_rollout", "8", "--select-ratio", "0.05", "--scheduler", client.scheduler.address,
            "--id-column", "chunk_id", "--quality-column", "quality_score",
            "--embedding-column", "feature_arr", "--score-column", "score", "--seed", "4"]
    assert main(args) == 0
    assert "1600 rows, 80 selected" in capsys.readouterr().out
    assert sorted(p.name for p in target.iterdir()) == ["_datamask_run.json", "part.0.parquet",
                                                        "part.1.parquet", "part.2.parquet"]
    table = pq.read_table(target)
    assert table.column_names == [*corpus.columns, "selected", "score"]
    assert table.column("chunk_id").to_pylist() == corpus["chunk_id"].tolist()
    assert int(table.column("selected").to_numpy().sum()) == 80


def test_hive_partitioned_directory_with_groups(tmp_path, corpus, capsys):
    source, target = tmp_path / "in", tmp_path / "out"
    frame = corpus.assign(lang=np.where(np.arange(len(corpus)) % 4 == 0, "de", "en"))
    dd.from_pandas(frame, npartitions=2, sort=False).to_parquet(source, partition_on=["lang"])
    assert main(["select", "--input", str(source), "--output", str(target), "--by", "lang",
                 "--select_ratio", "0.1", *FAST_FLAGS]) == 0
    table = pq.read_table(target).to_pandas()
    assert len(table) == 1600 and sorted(table["chunk_id"]) == list(range(1600))
    assert table.groupby("lang")["selected"].sum().to_dict() == {"de": 40, "en": 120}


def test_a_ratio_or_a_token_budget_per_group_from_the_command_line(tmp_path, corpus):
    """``--by lang --ratio de=...,en=...``: each group's own share; ``--budget-tokens de=...,en=...``: each
    group's selected tokens within its own budget."""
    source, target = tmp_path / "in.parquet", tmp_path / "out"
    frame = corpus.assign(lang=np.where(np.arange(len(corpus)) % 4 == 0, "de", "en"),
                          n_tokens=np.arange(len(corpus)) % 50 + 10)
    frame.to_parquet(source)
    assert main(["select", "--input", str(source), "--output", str(target), "--by", "lang",
                 "--budget-tokens", "de=2000,en=5000", *FAST_FLAGS]) == 0
    table = pq.read_table(target).to_pandas()
    tokens = table[table["selected"]].groupby("lang")["n_tokens"].sum().to_dict()
    assert 0 < tokens["de"] <= 2000 and 0 < tokens["en"] <= 5000, tokens
    assert main(["select", "--input", str(source), "--output", str(target), "--overwrite", "--by", "lang",
                 "--ratio", "de=0.2,en=0.05", *FAST_FLAGS]) == 0
    table = pq.read_table(target).to_pandas()
    assert table.groupby("lang")["selected"].sum().to_dict() == {"de": 80, "en": 60}


def test_groups_named_on_the_command_line_are_the_columns_values_of_any_type(tmp_path, corpus, capsys):
    """The command line gives every group as text: ``--by year --ratio 2024=...`` names the whole number
    2024, where it selected nothing of it; a group no row holds gets nothing, and the run says so."""
    source, target = tmp_path / "in.parquet", tmp_path / "out"
    corpus.assign(year=np.where(np.arange(len(corpus)) % 4 == 0, 2024, 2025)).to_parquet(source)
    assert main(["select", "--input", str(source), "--output", str(target), "--by", "year",
                 "--ratio", "2024=0.2,2025=0.1", *FAST_FLAGS]) == 0
    table = pq.read_table(target).to_pandas()
    assert table.groupby("year")["selected"].sum().to_dict() == {2024: 80, 2025: 120}
    capsys.readouterr()
    assert main(["select", "--input", str(source), "--output", str(target), "--overwrite", "--by", "year",
                 "--ratio", "2024=0.2,2026=0.1", *FAST_FLAGS]) == 0
    err = capsys.readouterr().err
    assert "ratio names group(s) '2026' that no row's 'year' holds: they get no rows" in err
    table = pq.read_table(target).to_pandas()
    assert table.groupby("year")["selected"].sum().to_dict() == {2024: 80, 2025: 0}


def test_a_by_column_too_fine_to_take_rows_from_is_told(tmp_path, corpus, capsys):
    """A group takes round(ratio x its rows): grouped by a column of nearly one row a value (an id, a
    score), most groups take none, and the run says why its selection is short."""
    source, target = tmp_path / "in.parquet", tmp_path / "out"
    corpus.assign(page=np.arange(len(corpus)) // 2).to_parquet(source)  # 800 groups of 2 rows
    assert main(["select", "--input", str(source), "--output", str(target), "--by", "page", "--ratio", "0.1",
                 *FAST_FLAGS]) == 0
    err = capsys.readouterr().err
    told = ("by='page' cuts the table into 800 groups, and 800 of them hold too few rows to take one at "
            "ratio 0.1 (a group takes round(ratio x its rows)): they get none; group by a coarser column")
    assert told in err
    assert not pq.read_table(target).to_pandas()["selected"].any()
    assert main(["validate", "--input", str(source), "--by", "page", "--ratio", "0.1"]) == 0  # before a run
    assert told in capsys.readouterr().out
    assert main(["select", "--input", str(source), "--output", str(target), "--overwrite", "--by", "page",
                 "--ratio", "0.5", *FAST_FLAGS]) == 0  # round(0.5 x 2) = 1 a group: nothing to tell
    assert "coarser column" not in capsys.readouterr().err
    assert pq.read_table(target).to_pandas()["selected"].sum() == 800


def test_a_ratio_that_takes_no_row_of_a_small_table_is_told(tmp_path, corpus, capsys):
    """ratio x rows rounds to no row on a table of a few rows: the run and validate say so, not only
    the count of 0 selected."""
    source, target = tmp_path / "in.parquet", tmp_path / "out"
    corpus.iloc[:4].to_parquet(source)
    assert main(["select", "--input", str(source), "--output", str(target), *FAST_FLAGS]) == 0
    told = "ratio 0.1 of the table's 4 eligible row(s) is no row"
    assert told in capsys.readouterr().err
    assert main(["validate", "--input", str(source)]) == 0
    assert told in capsys.readouterr().out
    assert main(["select", "--input", str(source), "--output", str(target), "--overwrite", "--ratio", "0.25",
                 *FAST_FLAGS]) == 0
    assert "is no row" not in capsys.readouterr().err
    assert pq.read_table(target).to_pandas()["selected"].sum() == 1


def test_config_file_value_is_used_without_the_flag(tmp_path, corpus, capsys):
    source = tmp_path / "in.parquet"
    corpus.iloc[:200].to_parquet(source)
    config = tmp_path / "job.yaml"
    config.write_text("n_rollout: 1\n")
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "out.parquet"),
                 "--config", str(config)]) == 1
    assert "n_rollout" in capsys.readouterr().err
    assert not (tmp_path / "out.parquet").exists()


def test_bad_input_fails_cleanly_without_output(tmp_path, corpus, capsys):
    frame = corpus.copy()
    frame.loc[5, "quality_score"] = np.nan
    source, target = tmp_path / "bad.parquet", tmp_path / "out.parquet"
    frame.to_parquet(source)
    assert main(["select", "--input", str(source), "--output", str(target), *FAST_FLAGS]) == 1
    err = capsys.readouterr().err
    assert "partition 0: quality column 'quality_score' has 1 NaN" in err and "ids [5]" in err
    assert sorted(os.listdir(tmp_path)) == ["bad.parquet"]


def test_existing_output_needs_overwrite(tmp_path, corpus, capsys):
    source, target = tmp_path / "in.parquet", tmp_path / "out.parquet"
    corpus.iloc[:300].to_parquet(source)
    args = ["select", "--input", str(source), "--output", str(target), *FAST_FLAGS]
    assert main(args) == 0
    first = target.read_bytes()
    assert main(args) == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err and target.read_bytes() == first
    assert main([*args, "--overwrite"]) == 0  # an output of an earlier run is replaced
    assert pq.read_table(target).num_rows == 300
    target.write_text("keep me")  # ... and nothing else is
    assert main([*args, "--overwrite"]) == 1
    assert "not parquet" in capsys.readouterr().err and target.read_text() == "keep me"


def test_select_without_input_runs_the_demo(capsys):
    assert main(["select", "--rows", "400", "--partitions", "2", *FAST_FLAGS]) == 0
    out = capsys.readouterr().out
    assert "selected 40 of 400 rows" in out and "random" in out


def test_usage_errors():
    with pytest.raises(SystemExit):
        main(["select", "--output", "x.parquet"])
    with pytest.raises(SystemExit):
        main(["select", "--n_epochs", "many"])


@pytest.mark.slow
def test_console_script_demo(tmp_path):
    script = shutil.which("datamask", path=str(Path(sys.executable).parent))
    assert script, "the datamask entry point is not installed in this environment"
    run = subprocess.run([script, "demo", "--rows", "600", "--partitions", "3", *FAST_FLAGS, "--output",
                          str(tmp_path / "demo")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "selected 60 of 600 rows" in run.stdout and "objective" in run.stdout
    assert pq.read_table(tmp_path / "demo").num_rows == 600
    report = subprocess.run([script, "report", str(tmp_path / "demo")], capture_output=True, text=True,
                            timeout=300)  # a selection's output, with its run record
    assert report.returncode == 0 and (tmp_path / "demo-report" / "index.html").exists(), report.stderr


def test_sample_says_the_files_it_wrote(tmp_path, capsys):
    target = tmp_path / "corpus"
    assert main(["sample", "--rows", "5", "--dim", "4", "--partitions", "20", "--output", str(target)]) == 0
    assert "5 files ->" in capsys.readouterr().out  # no more files than rows
    assert len(list(target.glob("*.parquet"))) == 5
