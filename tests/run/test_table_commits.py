"""Distributed table writes: tasks write the data files, the driver commits their names once.

A run that fails in its select pass, after some tasks have written files, leaves the output table
as it was (its files belong to no version); an interrupted run resumes from the files its tasks
wrote; a commit that is retried is not applied twice.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from conftest import require_lakehouse

deltalake = require_lakehouse()
from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402

import datamask_dask  # noqa: E402
from datamask_dask.errors import InputDataError  # noqa: E402
from datamask_dask.io.delta import DeltaSink  # noqa: E402
from datamask_dask.io.storage import resolve  # noqa: E402
from datamask_dask.run.tables import select_table  # noqa: E402

OPTIONS = {"n_epochs": 20, "n_rollout": 8}
# The plan pass reads no embedding: a bad vector is found in the select pass, after other
# partitions have written their files.
LATE_CHECK = {"validate": "light", "diversity_scope": "partition", "scheduler": "sync"}


def _corpus(rows: int, seed: int) -> pa.Table:
    frame = datamask_dask.make_corpus(rows, 16, seed=seed)
    table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
    return table.set_column(2, "feature_arr", table.column("feature_arr").cast(pa.list_(pa.float32())))


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """Two parquet directories of 3 files (3 partitions, in file-name order): good, and the same with a
    NaN in an embedding of the file the scheduler selects last (so the others are written first)."""
    import pyarrow.parquet as pq

    from datamask_dask.dask_engine import runs

    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    parts = [_corpus(400, number).set_column(0, "chunk_id", pa.array(np.arange(400) + 400 * number))
             for number in range(3)]
    for number, part in enumerate(parts):
        pq.write_table(part, good / f"part.{number}.parquet")
    order, select = [], runs._select_part
    monkeypatch.setattr(runs, "_select_part", lambda frame, plan, number, *args: order.append(number) or
                        select(frame, plan, number, *args))
    select_table(str(good), str(tmp_path / "order"), 0.1, **OPTIONS, **LATE_CHECK)
    monkeypatch.undo()
    for number, part in enumerate(parts):
        if number == order[-1]:
            vectors = part.column("feature_arr").to_pylist()
            vectors[5][3] = float("nan")
            part = part.set_column(2, "feature_arr", pa.array(vectors, pa.list_(pa.float32())))
        pq.write_table(part, bad / f"part.{number}.parquet")
    return good, bad


def _files(path) -> set:
    return {p.name for p in path.rglob("*.parquet")}


def test_a_delta_run_failing_after_some_files_were_written_leaves_the_table(sources, tmp_path):
    good, bad = sources
    out = tmp_path / "out"
    select_table(str(good), f"delta://{out}", 0.1, **OPTIONS, **LATE_CHECK)
    version, files = deltalake.DeltaTable(out).version(), set(deltalake.DeltaTable(out).file_uris())
    with pytest.raises(InputDataError, match="NaN"):
        select_table(str(bad), f"delta://{out}", 0.2, mode="overwrite", **OPTIONS, **LATE_CHECK)
    assert len(_files(out)) > len(files)  # the failed run had written files (kept for a resume)...
    assert deltalake.DeltaTable(out).version() == version  # ...that belong to no version
    assert set(deltalake.DeltaTable(out).file_uris()) == files
    assert deltalake.DeltaTable(out).to_pyarrow_table().num_rows == 1200

    new = tmp_path / "new"  # a failed first run leaves no table
    with pytest.raises(InputDataError, match="NaN"):
        select_table(str(bad), f"delta://{new}", 0.1, **OPTIONS, **LATE_CHECK)
    assert not new.exists()


def test_each_delta_task_writes_its_own_file_and_one_commit_adds_them(sources, tmp_path):
    good, _ = sources
    out = tmp_path / "out"
    report = select_table(str(good), f"delta://{out}", 0.1, **OPTIONS)
    table = deltalake.DeltaTable(out)
    assert table.version() == 0 and report.rows == 1200 and report.selected == 120
    assert sorted(_files(out)) == [f"part-{n:05d}-{report.run_id}.parquet" for n in range(3)]
    assert int(np.count_nonzero(table.to_pyarrow_table().column("selected").to_numpy())) == 120


def test_a_retried_delta_commit_is_applied_once(tmp_path):
    out = tmp_path / "retried"
    from datamask_dask.run.work import WorkArea

    work = WorkArea(resolve(tmp_path / ".retried.datamask-work"), "r1")
    sink = DeltaSink(out, mode="error")
    table = _corpus(50, 0)
    written = [sink.writer(work)(table, 0)]
    sink.commit(work, {}, written, table.schema, {"run_id": "r1"})
    again = DeltaSink(out, mode="append")  # the same run commits again (a retry)
    again.commit(work, {}, written, table.schema, {"run_id": "r1"})
    assert deltalake.DeltaTable(out).version() == 0
    assert deltalake.DeltaTable(out).to_pyarrow_table().num_rows == 50


def test_an_iceberg_run_failing_after_some_files_were_written_leaves_the_table(sources, tmp_path):
    good, bad = sources
    (tmp_path / "wh").mkdir()
    properties = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": f"file://{tmp_path}/wh"}
    catalog = SqlCatalog("local", uri=properties["uri"], warehouse=properties["warehouse"])
    select_table(str(good), "iceberg://local/out.sel", 0.1, catalog_properties=properties, **OPTIONS,
                 **LATE_CHECK)
    table = catalog.load_table("out.sel")
    snapshot, rows = table.current_snapshot().snapshot_id, table.scan().to_arrow().num_rows
    with pytest.raises(InputDataError, match="NaN"):
        select_table(str(bad), "iceberg://local/out.sel", 0.2, mode="overwrite",
                     catalog_properties=properties, **OPTIONS, **LATE_CHECK)
    table = catalog.load_table("out.sel")
    assert table.current_snapshot().snapshot_id == snapshot and table.scan().to_arrow().num_rows == rows
    with pytest.raises(InputDataError, match="NaN"):
        select_table(str(bad), "iceberg://local/out.new", 0.1, catalog_properties=properties,
                     **OPTIONS, **LATE_CHECK)
    assert not catalog.table_exists("out.new")


@pytest.mark.slow
def test_a_killed_delta_run_resumes_from_the_files_its_tasks_wrote(sources, tmp_path, capsys):
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from datamask_dask.cli import main

    good, _ = sources
    flags = ["--select_ratio", "0.1", "--n_epochs", "20", "--n_rollout", "8",
             "--diversity-scope", "partition"]
    assert main(["select", "--input", str(good), "--output", f"delta://{tmp_path / 'reference'}",
                 *flags]) == 0
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(good),
                                "--output", f"delta://{out}", *flags], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.datamask-work/part-*.json")) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    finished = list(tmp_path.glob(".out.datamask-work/part-*.json"))
    assert finished and not (out / "_delta_log").exists(), process.stderr.read().decode()

    assert main(["select", "--input", str(good), "--output", f"delta://{out}", *flags]) == 0
    record = json.loads(deltalake.DeltaTable(out).history(1)[0]["datamask.run"])
    assert len(record["reused"]) >= len(finished)  # those partitions were not computed again
    assert not list(tmp_path.glob(".out.datamask-*"))  # markers and staging gone once committed

    def chosen(path):
        table = deltalake.DeltaTable(path).to_pyarrow_table()
        return set(table.filter(table.column("selected")).column("chunk_id").to_pylist())

    assert chosen(out) == chosen(tmp_path / "reference") and len(chosen(out)) == 120
