"""Delta Lake and Iceberg tables in and out, on real tables (deltalake; pyiceberg's SQL catalog on
SQLite with a local warehouse): round trips read back with each format's own library, time
travel, projection and row filters, selection-only output, a failure in the middle of a write,
the run record in the commit metadata, incremental runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import numpy as np
import pyarrow as pa
import pytest
from conftest import require_lakehouse

deltalake = require_lakehouse()

from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402

import datamask_dask  # noqa: E402
from datamask_dask.errors import OptionError  # noqa: E402
from datamask_dask.io import parquet  # noqa: E402
from datamask_dask.io.delta import delta_pieces, read_delta, write_delta  # noqa: E402
from datamask_dask.io.iceberg import iceberg_pieces, read_iceberg, write_iceberg  # noqa: E402
from datamask_dask.io.output import UnsafeOutputError, read_record  # noqa: E402
from datamask_dask.io.storage import resolve  # noqa: E402
from datamask_dask.io.tables import parse_table_uri, read_table  # noqa: E402
from datamask_dask.run.tables import select_table  # noqa: E402

OPTIONS = {"n_epochs": 20, "n_rollout": 8}
RATIO = 0.1
SELECTION = "selection"  # the selection-only output: id, selected, run_id
N, FIRST = 1600, 1200  # rows in the corpus; rows of the first commit (the rest are appended)


@pytest.fixture(scope="module")
def corpus() -> pa.Table:
    frame = datamask_dask.make_corpus(N, 16, seed=3)
    table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
    return table.set_column(2, "feature_arr", table.column("feature_arr").cast(pa.list_(pa.float32())))


@pytest.fixture
def delta_source(tmp_path, corpus):
    path = tmp_path / "source_delta"
    deltalake.write_deltalake(path, corpus.slice(0, FIRST))  # version 0
    time.sleep(0.02)  # commit timestamps are in milliseconds: the two versions get different ones
    deltalake.write_deltalake(path, corpus.slice(FIRST), mode="append")  # version 1
    return path


@pytest.fixture
def catalog_properties(tmp_path):
    (tmp_path / "wh").mkdir()
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": f"file://{tmp_path}/wh"}


@pytest.fixture
def catalog(tmp_path, catalog_properties):
    return SqlCatalog("local", uri=catalog_properties["uri"], warehouse=catalog_properties["warehouse"])


@pytest.fixture
def iceberg_source(catalog, corpus):
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.source", schema=corpus.schema)
    table.append(corpus.slice(0, FIRST))
    first = table.current_snapshot().snapshot_id
    table.append(corpus.slice(FIRST))
    return first


def _ids(table: pa.Table) -> np.ndarray:
    return np.sort(table.column("chunk_id").to_numpy())


def _delta_run_record(path) -> dict:
    return json.loads(deltalake.DeltaTable(path).history(1)[0]["datamask.run"])


# --------------------------------------------------------------------------- Delta


def test_delta_read_partitions_projection_and_time_travel(delta_source):
    frame = read_delta(delta_source)
    assert frame.npartitions == 2  # one per data file
    assert len(frame) == N and list(frame.columns) == ["chunk_id", "quality_score", "feature_arr", "text"]
    old = read_table(f"delta://{delta_source}?version=0", columns=["chunk_id"])
    assert old.version == 0 and list(old.frame.columns) == ["chunk_id"]
    assert sorted(old.frame.compute()["chunk_id"].tolist()) == list(range(FIRST))
    assert read_table(f"delta://{delta_source}").version == 1
    stamp = deltalake.DeltaTable(delta_source).history()[-1]["timestamp"]  # version 0's commit, in ms
    import datetime

    when = datetime.datetime.fromtimestamp(stamp / 1000, tz=datetime.UTC)
    assert len(read_delta(delta_source, timestamp=when)) == FIRST
    # as ISO 8601 text, a zone's offset or none (UTC); a time before the table or no time at all refused
    naive = (when + datetime.timedelta(hours=2)).replace(tzinfo=None).isoformat()
    assert read_table(f"delta://{delta_source}?timestamp={when.isoformat().replace('+00:00', 'Z')}",
                      columns=["chunk_id"]).version == 0
    assert read_table(f"delta://{delta_source}?timestamp={naive}", columns=["chunk_id"]).version == 1
    with pytest.raises(OptionError, match=rf"^the Delta table {delta_source} has no version as of 2020-01"):
        read_table(f"delta://{delta_source}?timestamp=2020-01-01")
    with pytest.raises(OptionError, match="^the timestamp 'yesterday' is not an ISO 8601 time"):
        read_delta(delta_source, timestamp="yesterday")


def test_delta_pieces_take_their_rows_from_the_log(delta_source, tmp_path):
    """Each data file's rows come from the log's statistics (a run wires its near-duplicate search for
    them), matched to the files whose partition folders hold URL-encoded values."""
    table = pa.table({"chunk_id": np.arange(12), "lang": ["en us", "50%", "de"] * 4, "n": np.arange(12)})
    deltalake.write_deltalake(tmp_path / "parts", table, partition_by=["lang"])
    deltalake.write_deltalake(tmp_path / "parts", table.slice(0, 5), mode="append", partition_by=["lang"])
    for path in (delta_source, tmp_path / "parts"):
        pieces = delta_pieces(path, columns=["chunk_id"])
        assert pieces.rows == [pieces.read(i).num_rows for i in range(len(pieces))]
    assert sum(delta_pieces(tmp_path / "parts").rows) == 17


@pytest.mark.slow
def test_delta_round_trip_full_table(delta_source, tmp_path):
    out = tmp_path / "out_delta"
    report = select_table(f"delta://{delta_source}", f"delta://{out}", RATIO, **OPTIONS)
    assert (report.rows, report.selected) == (N, round(RATIO * N))
    table = deltalake.DeltaTable(out).to_pyarrow_table()
    assert table.num_rows == N and np.array_equal(_ids(table), np.arange(N))
    assert int(table.column("selected").to_numpy().sum()) == round(RATIO * N)
    assert set(table.column_names) == {"chunk_id", "quality_score", "feature_arr", "text", "selected"}
    record = _delta_run_record(out)
    assert record["run_id"] == report.run_id and record["input"]["version"] == 1
    assert (record["rows"], record["selected"]) == (N, round(RATIO * N))
    assert record["settings"]["n_epochs"] == 20 and record["seed"] == 0 and record["versions"]["deltalake"]
    _check_summary(record)
    pytest.importorskip("matplotlib", reason="the report needs matplotlib (pip install matplotlib)")
    from datamask_dask.report.cli import report_command

    assert report_command([f"delta://{out}", "--out", str(tmp_path / "report"), "--sample-rows", "300"]) == 0
    figures = {p.name for p in (tmp_path / "report").glob("*.png")}
    assert {"curves.png", "quality.png", "projection.png", "objective.png", "quotas.png"} <= figures
    assert report.run_id in (tmp_path / "report" / "index.html").read_text()


def test_write_selection_writes_a_frame_into_delta_and_iceberg_tables(tmp_path, corpus, catalog,
                                                                      catalog_properties):
    """The Python door of a Dask frame takes a table URI as the command line does: the rows it writes
    to parquet, in one commit with the run record; an existing table only with overwrite=True."""
    import dask.dataframe as dd
    import pandas as pd
    import pyarrow.parquet as pq

    frame = dd.from_pandas(corpus.to_pandas(types_mapper=pd.ArrowDtype), npartitions=2, sort=False)
    parquet_report = datamask_dask.write_selection(frame, tmp_path / "out", RATIO, seed=1, **OPTIONS)
    written = pq.read_table(tmp_path / "out")
    want = set(_ids(written)[written.column("selected").to_numpy()])
    delta = datamask_dask.write_selection(frame, f"delta://{tmp_path}/d", RATIO, seed=1, **OPTIONS)
    catalog.create_namespace("out")
    iceberg = datamask_dask.write_selection(frame, "iceberg://local/out.sel", RATIO, seed=1,
                                            catalog_properties=catalog_properties, **OPTIONS)
    tables = {"delta": deltalake.DeltaTable(tmp_path / "d").to_pyarrow_table(),
              "iceberg": catalog.load_table("out.sel").scan().to_arrow()}
    for table in tables.values():
        selected = table.column("selected").to_numpy()
        assert table.num_rows == N and set(_ids(table)[selected]) == want
    assert (delta.path, delta.selected, iceberg.selected) == (f"delta://{tmp_path}/d", 160, 160)
    assert _delta_run_record(tmp_path / "d")["run_id"] == delta.record["run_id"]
    assert parquet_report.record["run_id"] != delta.record["run_id"]
    with pytest.raises(FileExistsError, match=r"exists; pass .*write_selection: overwrite=True\)"):
        datamask_dask.write_selection(frame, f"delta://{tmp_path}/d", RATIO, **OPTIONS)
    with pytest.raises(FileExistsError, match=r"exists; pass .*select_table: mode='overwrite'\)"):
        select_table(f"delta://{tmp_path}/d", tmp_path / "out", RATIO, **OPTIONS)
    doors = [(datamask_dask.write_selection, frame, {"mode": "overwrite"}),
             (select_table, f"delta://{tmp_path}/d", {"overwrite": True})]
    for door, source, keyword in doors:  # each door's way is named, before the output is looked at
        with pytest.raises(OptionError, match=rf"'{next(iter(keyword))}' is not an option .*"
                                              r"select_table\(..., mode='overwrite'\)"):
            door(source, tmp_path / "out", RATIO, **keyword)
    again = datamask_dask.write_selection(frame, f"delta://{tmp_path}/d", 2 * RATIO, overwrite=True,
                                          **OPTIONS)
    assert deltalake.DeltaTable(tmp_path / "d").version() == 1 and again.rows == N
    # what each output holds now: the table's current version, not every file in its folder
    assert datamask_dask.selected_counts(f"delta://{tmp_path}/d") == (N, again.selected) == (N, 320)
    assert datamask_dask.selected_counts(tmp_path / "out") == (N, 160)
    counts = datamask_dask.selected_counts("iceberg://local/out.sel", catalog_properties=catalog_properties)
    assert counts == (N, 160)
    with pytest.raises(OptionError, match="single_file=True writes one parquet file, not a delta table"):
        datamask_dask.write_selection(frame, f"delta://{tmp_path}/e", RATIO, single_file=True)
    with pytest.raises(OptionError, match="single_file=True writes one parquet file, not a delta table"):
        select_table(tmp_path / "out", f"delta://{tmp_path}/e", RATIO, single_file=True)


def _check_summary(record):
    """The run summary in a table's commit: partitions, the sample, the selection against baselines."""
    assert sum(p["rows"] for p in record["partitions"]) == record["rows"]
    assert sum(p["selected"] for p in record["partitions"]) == record["selected"]
    summary = record["summary"]
    assert summary["sample"]["stratified"] == "by partition" and 0 < summary["sample"]["rows"] <= N
    objective = summary["objective"]
    assert set(objective) == {"datamask", "quality_topk", "random"}
    assert objective["datamask"]["rows"] == summary["sample"]["selected"] > 0
    assert objective["datamask"]["objective"] > objective["random"]["objective"]
    assert summary["curves"] and record["stages"]["learn"] > 0
    assert summary["selected_pairs"]["rows"] == record["selected"]  # pairs over every selected row


def test_delta_selection_only_and_modes(delta_source, tmp_path):
    out = tmp_path / "selection"
    report = select_table(f"delta://{delta_source}", f"delta://{out}", RATIO, output_columns=SELECTION,
                          **OPTIONS)
    table = deltalake.DeltaTable(out).to_pyarrow_table()
    assert table.column_names == ["chunk_id", "selected", "run_id"]
    assert set(table.column("run_id").to_pylist()) == {report.run_id}
    assert int(table.column("selected").to_numpy().sum()) == round(RATIO * N)
    record = _delta_run_record(out)
    _check_summary(record)  # the sample comes from the selecting tasks, not the output
    assert set(record["phases"]) == {"plan", "select and write", "summary"}
    assert record["stages"]["plan read"] > 0 and record["stages"]["read"] > 0
    # its select pass reads only the columns it uses, and selects the rows a full output selects
    full = select_table(f"delta://{delta_source}", f"delta://{tmp_path / 'all'}", RATIO, **OPTIONS)
    everything = deltalake.DeltaTable(tmp_path / "all").to_pyarrow_table()
    assert "text" in everything.column_names and full.selected == report.selected
    chosen = everything.filter(everything.column("selected")).column("chunk_id").to_pylist()
    assert sorted(chosen) == sorted(table.filter(table.column("selected")).column("chunk_id").to_pylist())
    with pytest.raises(FileExistsError):  # mode is explicit
        select_table(f"delta://{delta_source}", f"delta://{out}", RATIO, output_columns=SELECTION, **OPTIONS)
    with pytest.raises(UnsafeOutputError):  # the input is never the output
        select_table(f"delta://{delta_source}", f"delta://{delta_source}", RATIO, mode="overwrite",
                     **OPTIONS)
    with pytest.raises(UnsafeOutputError, match="inside"):  # nor a parquet output inside the input table
        select_table(f"delta://{delta_source}", delta_source / "selected", RATIO, **OPTIONS)
    with pytest.raises(UnsafeOutputError):  # a table datamask did not write is never written into
        write_delta(table, delta_source, mode="append", record={})
    assert deltalake.DeltaTable(delta_source).version() == 1


def test_delta_failure_in_the_middle_of_a_write_leaves_the_table(delta_source, tmp_path):
    out = tmp_path / "out_delta"
    select_table(f"delta://{delta_source}", f"delta://{out}", RATIO, output_columns=SELECTION, **OPTIONS)
    before = deltalake.DeltaTable(out)
    version, rows = before.version(), before.to_pyarrow_table().sort_by("chunk_id")
    replacement = rows.set_column(1, "selected", pa.array(np.ones(N, dtype=bool)))
    batches = replacement.to_batches(max_chunksize=200)
    written = []

    def failing():
        for index, batch in enumerate(batches):
            if index == 4:
                raise RuntimeError("injected failure in the middle of the write")
            written.append(index)
            yield batch

    reader = pa.RecordBatchReader.from_batches(replacement.schema, failing())
    with pytest.raises(Exception, match="injected failure"):
        write_delta(reader, out, mode="overwrite", record={"run_id": "failed"})
    assert written == [0, 1, 2, 3]  # the write was under way
    after = deltalake.DeltaTable(out)
    assert after.version() == version
    assert after.to_pyarrow_table().sort_by("chunk_id").equals(rows)
    assert _delta_run_record(out)["run_id"] != "failed"
    new = tmp_path / "new_table"  # a failed first write leaves nothing at all; a retry then works
    reader = pa.RecordBatchReader.from_batches(replacement.schema, failing())
    with pytest.raises(Exception, match="injected failure"):
        write_delta(reader, new, record={"run_id": "failed"})
    assert not new.exists() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert write_delta(replacement, new, record={"run_id": "retry"})["version"] == 0
    assert _delta_run_record(new)["run_id"] == "retry"


def test_the_sample_command_writes_a_table_to_try_the_lakehouse_inputs_on(tmp_path, capsys):
    from datamask_dask.cli import main

    uri = f"delta://{tmp_path}/sample"
    assert main(["sample", "--rows", "600", "--dim", "8", "--partitions", "3", "--output", uri]) == 0
    assert "600 rows, 8-d embeddings, 3 files -> delta://" in capsys.readouterr().out
    assert len(read_table(uri).frame) == 600
    assert main(["sample", "--rows", "300", "--dim", "8", "--output", uri]) == 1
    assert f"error: {uri} exists; pass --overwrite to replace it" in capsys.readouterr().err  # its own flag
    assert main(["sample", "--rows", "300", "--dim", "8", "--output", uri, "--overwrite"]) == 0
    assert len(read_table(uri).frame) == 300
    job = ["select", "--input", uri, "--by", "language", "--n-epochs", "5", "--n-rollout", "4"]
    assert main([*job, "--output", f"delta://{tmp_path}/out"]) == 0
    assert "300 rows, 30 selected" in capsys.readouterr().out
    assert main([*job, "--output", f"delta://{tmp_path}/out"]) == 1  # the flags, as the command line has them
    assert (f"the Delta table {tmp_path}/out exists; pass --mode append or --mode overwrite to write into it"
            in capsys.readouterr().err)
    assert main([*job, "--output", str(tmp_path / "parquet"), "--mode", "append"]) == 1
    assert "error: --mode append needs a Delta or Iceberg output" in capsys.readouterr().err


def test_delta_incremental_run_selects_only_new_rows(delta_source, tmp_path, corpus, capsys):
    out = tmp_path / "selection"
    source = f"delta://{delta_source}"
    first = select_table(f"{source}?version=0", f"delta://{out}", RATIO, output_columns=SELECTION, **OPTIONS)
    assert (first.rows, first.selected) == (FIRST, round(RATIO * FIRST))
    kept = deltalake.DeltaTable(out).to_pyarrow_table().sort_by("chunk_id")
    second = select_table(source, f"delta://{out}", RATIO, output_columns=SELECTION, incremental=True,
                          **OPTIONS)
    assert (second.rows, second.selected) == (N - FIRST, round(RATIO * (N - FIRST)))
    assert second.record["incremental"] == {"since": 0, "previous_run": first.run_id}
    table = deltalake.DeltaTable(out).to_pyarrow_table().sort_by("chunk_id")
    assert np.array_equal(_ids(table), np.arange(N))
    assert table.slice(0, FIRST).equals(kept)  # earlier selections are kept
    assert int(table.column("selected").to_numpy().sum()) == round(RATIO * FIRST) + round(RATIO * (N - FIRST))
    version = deltalake.DeltaTable(out).version()
    third = select_table(source, f"delta://{out}", RATIO, output_columns=SELECTION, incremental=True,
                         **OPTIONS)
    assert third.rows == 0 and deltalake.DeltaTable(out).version() == version  # nothing new, nothing written
    from datamask_dask.cli import main

    assert main(["select", "--input", source, "--output", f"delta://{out}", "--output-columns", SELECTION,
                 "--incremental"]) == 0
    assert f"datamask: no rows were added to {source} since version 1: nothing to select, delta://{out} is " \
        "unchanged" in capsys.readouterr().out  # where it read "0 rows ... profile None"
    assert deltalake.DeltaTable(out).version() == version


# --------------------------------------------------------------------------- Iceberg


def test_iceberg_read_scan_tasks_pushdown_and_time_travel(catalog, iceberg_source):
    frame = read_iceberg(catalog, "ns.source")
    assert frame.npartitions == 2 and len(frame) == N  # one partition per scan task
    small = read_iceberg(catalog, "ns.source", columns=["chunk_id", "quality_score"],
                         row_filter="chunk_id < 100")
    assert list(small.columns) == ["chunk_id", "quality_score"]
    assert sorted(small.compute()["chunk_id"].tolist()) == list(range(100))
    assert read_iceberg(catalog, "ns.source", row_filter="chunk_id >= 1500").npartitions == 1  # file pruned
    assert len(read_iceberg(catalog, "ns.source", snapshot_id=iceberg_source)) == FIRST
    pieces = iceberg_pieces(catalog, "ns.source", columns=["chunk_id"])  # rows from the manifests
    assert pieces.rows == [pieces.read(i).num_rows for i in range(len(pieces))]
    assert iceberg_pieces(catalog, "ns.source", row_filter="chunk_id < 100").rows is None  # a bound only


@pytest.mark.parametrize("row_filter, says", [
    ("chunk_id = ", "is not a filter pyiceberg reads: write it as, e.g."),
    ("lang = 'en'", "Could not find field with name lang, case_sensitive=True (the table's columns: "),
    ("quality_score > 'high'", "Could not convert high into a double")])
def test_a_row_filter_iceberg_cannot_apply_is_refused_in_one_line(catalog, iceberg_source, row_filter, says):
    """Before the scan, naming the filter: pyiceberg's parser raised a page of the tokens it expected."""
    with pytest.raises(OptionError, match=re.escape(f"row_filter (--row-filter) {row_filter!r}")) as raised:
        iceberg_pieces(catalog, "ns.source", row_filter=row_filter)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_iceberg_round_trip_by_uri(catalog, catalog_properties, iceberg_source, caplog):
    with caplog.at_level("WARNING", logger="pyiceberg"):
        report = select_table("iceberg://local/ns.source", "iceberg://local/out.selected", RATIO,
                              catalog_properties=catalog_properties, **OPTIONS)
    # the parts carry no statistics of their embeddings, and the table collects none: nothing to warn of
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pyiceberg")] == []
    assert (report.rows, report.selected) == (N, round(RATIO * N))
    table = catalog.load_table("out.selected")
    data = table.scan().to_arrow()
    assert data.num_rows == N and np.array_equal(_ids(data), np.arange(N))
    assert int(data.column("selected").to_numpy().sum()) == round(RATIO * N)
    record = json.loads(table.current_snapshot().summary.additional_properties["datamask.run"])
    assert record["run_id"] == report.run_id
    assert record["input"]["version"] == catalog.load_table("ns.source").current_snapshot().snapshot_id
    assert (record["rows"], record["selected"]) == (N, round(RATIO * N))
    _check_summary(record)
    assert len(table.snapshots()) == 1  # created and filled in one commit


def test_iceberg_failure_in_the_middle_of_a_write_leaves_the_table(catalog, catalog_properties,
                                                                   iceberg_source, monkeypatch):
    select_table("iceberg://local/ns.source", "iceberg://local/out.sel", RATIO, output_columns="selection",
                 catalog_properties=catalog_properties, **OPTIONS)
    before = catalog.load_table("out.sel")
    snapshot, rows = before.current_snapshot().snapshot_id, before.scan().to_arrow().sort_by("chunk_id")
    real = parquet.write_table
    written = []

    def failing(table, where, **options):  # the data file is written whole, then the write fails
        real(table, where, **options)
        written.append(table.num_rows)
        raise RuntimeError("injected failure in the middle of the write")

    monkeypatch.setattr(parquet, "write_table", failing)
    replacement = rows.set_column(1, "selected", pa.array(np.ones(N, dtype=bool)))
    with pytest.raises(RuntimeError, match="injected failure"):
        write_iceberg(replacement, catalog, "out.sel", mode="overwrite", record={"run_id": "failed"})
    with pytest.raises(RuntimeError, match="injected failure"):  # a new table: none is left behind
        write_iceberg(replacement, catalog, "out.other", mode="error", record={"run_id": "failed"})
    assert written  # data files were written before the failure
    after = catalog.load_table("out.sel")
    assert after.current_snapshot().snapshot_id == snapshot
    assert after.scan().to_arrow().sort_by("chunk_id").equals(rows)
    files = sorted(task.file.file_path.rsplit("/", 1)[1] for task in after.scan().plan_files())
    assert sorted(resolve(f"{after.location()}/data").list()) == files  # the failed write's file is gone
    assert not catalog.table_exists("out.other")
    with pytest.raises(UnsafeOutputError):  # not a datamask table
        write_iceberg(replacement, catalog, "ns.source", mode="append")


@pytest.mark.slow
def test_iceberg_catalog_by_name_from_pyiceberg_configuration(tmp_path, catalog_properties, iceberg_source):
    """``iceberg://local/...``, the catalog only in ``$PYICEBERG_HOME/.pyiceberg.yaml`` (read at import)."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    (home / ".pyiceberg.yaml").write_text("catalog:\n  local:\n" + "".join(
        f"    {key}: {value}\n" for key, value in catalog_properties.items()))
    env = {**os.environ, "PYICEBERG_HOME": str(home)}
    script = ("from datamask_dask.io.tables import read_table; t = read_table('iceberg://local/ns.source', "
              "columns=['chunk_id']); print(t.version, t.files, len(t.frame))")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    version, files, rows = result.stdout.split()
    assert (int(files), int(rows)) == (2, N) and int(version) != iceberg_source


def test_iceberg_incremental_run(catalog, catalog_properties, iceberg_source):
    first = select_table(f"iceberg://local/ns.source?snapshot_id={iceberg_source}", "iceberg://local/out.inc",
                         RATIO, output_columns="selection", catalog_properties=catalog_properties, **OPTIONS)
    second = select_table("iceberg://local/ns.source", "iceberg://local/out.inc", RATIO,
                          output_columns=SELECTION, incremental=True, catalog_properties=catalog_properties,
                          **OPTIONS)
    assert (first.rows, second.rows) == (FIRST, N - FIRST)
    data = catalog.load_table("out.inc").scan().to_arrow()
    assert np.array_equal(_ids(data), np.arange(N))
    assert int(data.column("selected").to_numpy().sum()) == round(RATIO * FIRST) + round(RATIO * (N - FIRST))
    with pytest.raises(ValueError, match="appends"):
        select_table("iceberg://local/ns.source", "iceberg://local/out.inc", RATIO, output_columns=SELECTION,
                     incremental=True, mode="overwrite", catalog_properties=catalog_properties, **OPTIONS)


def test_read_tasks_survive_pickling(delta_source, catalog, iceberg_source):
    """The graphs ship to distributed workers: pickled and run again, each partition reads the same."""
    import cloudpickle
    import dask

    for frame in (read_delta(delta_source, columns=["chunk_id"]),
                  read_iceberg(catalog, "ns.source", columns=["chunk_id"], row_filter="chunk_id < 1300")):
        graph = cloudpickle.loads(cloudpickle.dumps(dict(frame.__dask_graph__())))
        parts = dask.get(graph, frame.__dask_keys__())
        assert [len(p) for p in parts] == [len(p) for p in frame.to_delayed() for p in [p.compute()]]


# --------------------------------------------------------------------------- parquet and URIs


def test_parquet_selection_only_output_keeps_a_run_record(delta_source, tmp_path):
    out = tmp_path / "sel_parquet"
    report = select_table(f"delta://{delta_source}", out, RATIO, output_columns="selection", **OPTIONS)
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    assert table.column_names == ["chunk_id", "selected", "run_id"] and table.num_rows == N
    assert int(table.column("selected").to_numpy().sum()) == round(RATIO * N)
    assert read_record(out)["run_id"] == report.run_id
    again = select_table(f"delta://{delta_source}", out, RATIO, output_columns="selection", mode="overwrite",
                         **OPTIONS)
    assert read_record(out)["run_id"] == again.run_id  # our own output is replaced


def test_parse_table_uri():
    assert parse_table_uri("delta:///a/b?version=3").version == 3
    uri = parse_table_uri("iceberg://prod/ns.t?snapshot_id=7")
    assert (uri.format, uri.catalog, uri.location, uri.snapshot_id) == ("iceberg", "prod", "ns.t", 7)
    assert parse_table_uri("delta+s3://bucket/t").location == "s3://bucket/t"
    assert parse_table_uri("/data/corpus").format == "parquet"
    with pytest.raises(ValueError):
        parse_table_uri("iceberg://prod")
    with pytest.raises(ValueError, match=r"not delta://t\?version=2 \(for the folder t here: "
                                         rf"delta://{re.escape(os.path.abspath('t'))}\?version=2\)"):
        parse_table_uri("delta://t?version=2")  # a relative path, written as if the URI took one
    for uri, key in (("delta:///a/b?version=latest", "version"),
                     ("iceberg://prod/ns.t?snapshot_id=x", "snapshot_id")):
        with pytest.raises(OptionError, match=rf"^\?{key}=\w+ in the table URI .* is not a whole number"):
            parse_table_uri(uri)


def test_iceberg_output_keeps_the_reasons(catalog, catalog_properties, iceberg_source):
    select_table("iceberg://local/ns.source", "iceberg://local/out.explained", RATIO,
                 catalog_properties=catalog_properties, explain=True, prune=0.3, **OPTIONS)
    data = catalog.load_table("out.explained").scan().to_arrow().to_pandas()
    reasons = data["reason"].value_counts()
    assert reasons["selected"] == round(RATIO * N) and reasons.sum() == N
    assert {"near-duplicate", "quality-pruned"} <= set(reasons.index)
    near = data[data["reason"] == "near-duplicate"]
    assert near["duplicate_of"].notna().all() and near["duplicate_of"].isin(data["chunk_id"]).all()


def test_a_missing_table_version_or_catalog_is_said_in_one_line(tmp_path, delta_source, capsys):
    """On the command line: what is missing, named, and what to change; never a library's traceback."""
    from datamask_dask.cli import main

    out = ["--output", str(tmp_path / "out")]
    cases = [
        (["select", "--input", f"delta://{tmp_path}/none", *out],
         f"the Delta table {tmp_path}/none does not exist"),
        (["validate", "--input", f"delta://{tmp_path}/none"], "does not exist (no transaction log there)"),
        (["select", "--input", f"delta://{delta_source}?version=7", *out],
         "has no version 7 (its latest is 1)"),
        (["select", "--input", "iceberg://datamask_unset/ns.t", *out],
         "the Iceberg catalog 'datamask_unset' could not be loaded (no URI is configured for it)"),
        (["select", "--input", f"delta://{delta_source}", "--output", "iceberg://datamask_unset/ns.t"],
         "PYICEBERG_CATALOG__DATAMASK_UNSET__URI"),
    ]
    for args, said in cases:
        assert main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("datamask: error: ") and said in err[0], (args, err)
    assert not (tmp_path / "out").exists()


def test_a_damaged_delta_log_is_said_in_one_line(tmp_path, delta_source, capsys):
    from datamask_dask.cli import main

    damaged = tmp_path / "damaged"
    shutil.copytree(delta_source, damaged)
    first = sorted((damaged / "_delta_log").glob("*.json"))[0]
    first.write_text("{not json")
    for args in (["select", "--input", f"delta://{damaged}", "--output", str(tmp_path / "out")],
                 ["select", "--input", f"delta://{delta_source}", "--output", f"delta://{damaged}",
                  "--mode", "append"]):
        assert main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"the Delta table {damaged} could not be opened: " in err[0], err
        assert "check its _delta_log" in err[0]
    assert first.read_text() == "{not json" and not (tmp_path / "out").exists()


def test_a_table_datamask_did_not_write_is_refused_at_once_in_every_mode(delta_source, catalog,
                                                                        catalog_properties, iceberg_source,
                                                                        tmp_path):
    """Said before a mode is asked for, which would then be refused; the table is left as it was."""
    theirs = tmp_path / "theirs"
    shutil.copytree(delta_source, theirs)
    versions = deltalake.DeltaTable(theirs).version()
    for mode in ("error", "append", "overwrite"):
        said = "" if mode == "error" else f"mode='{mode}' refused: "
        with pytest.raises(UnsafeOutputError, match=f"^{said}the Delta table .* without a datamask run "
                           "record .*choose another output"):
            select_table(f"delta://{delta_source}", f"delta://{theirs}", RATIO, mode=mode, **OPTIONS)
        with pytest.raises(UnsafeOutputError, match=f"^{said}the Iceberg table ns.source was not created by "
                           "datamask"):
            select_table(f"delta://{delta_source}", "iceberg://local/ns.source", RATIO, mode=mode,
                         catalog_properties=catalog_properties, **OPTIONS)
    assert deltalake.DeltaTable(theirs).version() == versions
    assert len(catalog.load_table("ns.source").snapshots()) == 2


def test_a_missing_iceberg_table_or_snapshot_is_named(catalog, catalog_properties, iceberg_source):
    with pytest.raises(FileNotFoundError, match="the Iceberg table ns.missing does not exist in the catalog "
                       "local: check the URI"):
        read_table("iceberg://local/ns.missing", catalog_properties=catalog_properties)
    with pytest.raises(OptionError, match=r"the Iceberg table ns.source has no snapshot 7 .*: change "
                       r"\?snapshot_id= in the URI"):
        read_table("iceberg://local/ns.source?snapshot_id=7", catalog_properties=catalog_properties)
    with pytest.raises(OptionError, match="has no snapshot 7 .*: run without --incremental"):
        read_table("iceberg://local/ns.source", since=7, catalog_properties=catalog_properties)


def test_validate_reads_every_input_select_reads(delta_source, capsys):
    from datamask_dask.cli import main

    assert main(["validate", "--input", f"delta://{delta_source}"]) == 0
    assert f"{N} rows" in capsys.readouterr().out


def test_a_row_filter_on_an_input_it_cannot_filter_is_refused(delta_source, tmp_path):
    """Not read whole with the filter in the run record, as if it had applied."""
    for source in (f"delta://{delta_source}", str(tmp_path / "none.parquet")):
        with pytest.raises(OptionError, match="row_filter .--row-filter. needs an Iceberg input"):
            select_table(source, tmp_path / "out", RATIO, row_filter="chunk_id < 100", **OPTIONS)
    assert not (tmp_path / "out").exists()
