"""Data safety: no run ever deletes or replaces the input or a path that datamask did not write."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import dask.dataframe as dd
import pytest
from conftest import FAST

from datamask_dask import read_parquet, write_parquet, write_selection
from datamask_dask.cli import main
from datamask_dask.io.output import RUN_RECORD, UnsafeOutputError, output_lock, read_record

FLAGS = ["--n_epochs", str(FAST["n_epochs"]), "--n_rollout", str(FAST["n_rollout"])]


def _snapshot(root: Path) -> dict:
    """Every file under ``root`` with the hash of its bytes."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def sandbox(tmp_path, corpus):
    """``sand/in`` (a parquet directory) and an unrelated file ``sand/precious.txt``."""
    sand = tmp_path / "sand"
    write_parquet(dd.from_pandas(corpus, npartitions=2, sort=False), sand / "in")
    (sand / "precious.txt").write_text("not yours")
    return sand


@pytest.mark.parametrize("output, relation", [(".", "contains the input"), ("in", "is the input"),
                                              ("in/sub", "lies inside the input")])
def test_output_overlapping_the_input_is_refused(sandbox, output, relation, capsys):
    before = _snapshot(sandbox)
    code = main(["select", "--input", str(sandbox / "in"), "--output", str(sandbox / output), "--overwrite",
                 *FLAGS])
    assert code == 1
    assert relation in capsys.readouterr().err
    assert _snapshot(sandbox) == before


def test_single_file_input_as_its_own_output_is_refused(tmp_path, corpus, capsys):
    source = tmp_path / "same.parquet"
    write_parquet(dd.from_pandas(corpus, npartitions=2, sort=False), source, single_file=True)
    before = source.read_bytes()
    assert main(["select", "--input", str(source), "--output", str(source), "--overwrite", *FLAGS]) == 1
    assert "is the input" in capsys.readouterr().err
    assert source.read_bytes() == before


def test_overwrite_refuses_a_directory_datamask_did_not_write(sandbox, capsys):
    user = sandbox / "existdir"
    user.mkdir()
    (user / "notes.md").write_text("mine")
    before = _snapshot(sandbox)
    assert main(["select", "--input", str(sandbox / "in"), "--output", str(user), "--overwrite", *FLAGS]) == 1
    err = capsys.readouterr().err
    assert "--overwrite refused" in err and "notes.md" in err and "without a datamask run record" in err
    assert _snapshot(sandbox) == before


def test_overwrite_refuses_an_output_with_a_file_the_run_did_not_write(sandbox, capsys):
    out = sandbox / "out"
    assert main(["select", "--input", str(sandbox / "in"), "--output", str(out), *FLAGS]) == 0
    (out / "added-later.txt").write_text("keep me")
    before = _snapshot(sandbox)
    assert main(["select", "--input", str(sandbox / "in"), "--output", str(out), "--overwrite", *FLAGS]) == 1
    assert "added-later.txt" in capsys.readouterr().err
    assert _snapshot(sandbox) == before


def test_overwrite_replaces_an_earlier_datamask_output(sandbox, capsys):
    out = sandbox / "out"
    assert main(["select", "--input", str(sandbox / "in"), "--output", str(out), *FLAGS]) == 0
    first = read_record(out)
    assert main(["select", "--input", str(sandbox / "in"), "--output", str(out), "--overwrite", *FLAGS]) == 0
    second = read_record(out)
    assert first["run_id"] != second["run_id"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*second["files"], RUN_RECORD])
    assert (sandbox / "precious.txt").read_text() == "not yours"


def test_overwrite_refuses_a_foreign_single_file(tmp_path, corpus, capsys):
    source = tmp_path / "in.parquet"
    write_parquet(dd.from_pandas(corpus, npartitions=2, sort=False), source, single_file=True)
    foreign = tmp_path / "report.parquet"
    foreign.write_bytes(b"not parquet at all")
    assert main(["select", "--input", str(source), "--output", str(foreign), "--overwrite", *FLAGS]) == 1
    assert "not parquet" in capsys.readouterr().err
    assert foreign.read_bytes() == b"not parquet at all"


@pytest.mark.slow
def test_run_record_is_kept_with_the_output(tmp_path, corpus, parquet_dir):
    out = tmp_path / "out"
    ddf = read_parquet(parquet_dir)
    report = write_selection(ddf, out, ratio=0.2, input_location=parquet_dir, **FAST)
    record = json.loads((out / RUN_RECORD).read_text())
    assert record["rows"] == report.rows == len(corpus)
    assert record["selected"] == report.selected == round(0.2 * len(corpus))
    assert [p["rows"] for p in record["partitions"]] == ddf.map_partitions(len).compute().tolist()
    assert record["settings"]["ratio"] == 0.2 and record["seed"] == 0
    assert record["input"]["location"] == str(parquet_dir)
    assert list(record["input"]["columns"]) == sorted(corpus.columns)  # the input's, not the output's
    assert {"torch", "dask", "pyarrow", "pandas", "datamask-dask"} <= set(record["versions"])
    assert {"read", "learn", "write"} <= set(report.stages) and report.stages["learn"] > 0
    single = tmp_path / "one.parquet"
    write_selection(dd.from_pandas(corpus, npartitions=2, sort=False), single, single_file=True, **FAST)
    assert read_record(single)["rows"] == len(corpus)


def test_a_second_run_on_the_same_output_refuses(tmp_path):
    target = tmp_path / "out"
    entered, release = threading.Event(), threading.Event()

    def hold():
        with output_lock(target):
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(10)
        with pytest.raises(UnsafeOutputError, match="another datamask run is writing"):
            with output_lock(target):
                pass
    finally:
        release.set()
        holder.join()
    with output_lock(target):  # free again once the first run ends, and no lock file is left
        pass
    assert list(tmp_path.iterdir()) == []
