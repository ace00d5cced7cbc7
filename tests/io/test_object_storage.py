"""Object storage: the same jobs, rules and outputs on S3 as on local disk.

A real S3 API server (moto, started as its own process on a free localhost port) is talked to by
s3fs (fsspec) and pyarrow, as a user's job would talk to a bucket; the CLI gets its endpoint and
keys from the usual environment variables, the Python API from ``storage_options``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import dask.dataframe as dd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FAST

from datamask_dask.cli import main
from datamask_dask.errors import OptionError, StorageError
from datamask_dask.io.output import UnsafeOutputError, lock_location, output_lock, read_record
from datamask_dask.io.parquet import read_parquet
from datamask_dask.io.sinks import write_parquet
from datamask_dask.io.storage import resolve
from datamask_dask.io.tables import read_table
from datamask_dask.run.selection import write_selection
from datamask_dask.sample_data import make_corpus

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'datamask-dask[s3]')")
pytest.importorskip("moto", reason="moto[server] is not installed (the test extra brings it)")

pytestmark = pytest.mark.slow  # a cluster, a server or a whole job: see the fast subset

N_PARTS = 6
FLAGS = ["--n_epochs", str(FAST["n_epochs"]), "--n_rollout", str(FAST["n_rollout"]), "--select_ratio", "0.1",
         "--seed", "5"]
OPTIONS = {**FAST, "ratio": 0.1, "seed": 5}


@pytest.fixture(scope="module")
def local_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("s3-corpus") / "corpus"
    write_parquet(dd.from_pandas(make_corpus(1800, 16, seed=4), npartitions=N_PARTS, sort=False), path)
    return path


@pytest.fixture(scope="module")
def s3_corpus(s3, local_corpus):
    """The same parquet files under s3://lake/corpus/."""
    fs = resolve("s3://lake", s3).fs
    fs.put(str(local_corpus) + "/", "lake/corpus/", recursive=True)
    return "s3://lake/corpus"


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, local_corpus):
    """The reference: the same job on local disk through the CLI."""
    out = tmp_path_factory.mktemp("s3-reference") / "out"
    assert main(["select", "--input", str(local_corpus), "--output", str(out), *FLAGS]) == 0
    return out


def _selected_ids(uri, options=None) -> set:
    frame = read_parquet(uri, columns=["chunk_id", "selected"], storage_options=options).compute()
    return set(frame.loc[frame["selected"], "chunk_id"])


def _part_bytes(uri, options=None) -> dict:
    location = resolve(uri, options)
    return {name: location.child(name).read_bytes() for name in location.list() if name.endswith(".parquet")}


def test_cli_s3_to_s3_selects_the_rows_of_the_local_run(s3, s3_corpus, local_run, tmp_path, monkeypatch,
                                                        capsys):
    monkeypatch.chdir(tmp_path)  # a URI taken for a local path would show up here as a folder "s3:"
    assert main(["select", "--input", s3_corpus, "--output", "s3://lake/out", *FLAGS]) == 0
    assert "-> s3://lake/out" in capsys.readouterr().out
    assert not (tmp_path / "s3:").exists() and not list(tmp_path.iterdir())
    assert _selected_ids("s3://lake/out", s3) == _selected_ids(local_run)
    assert len(_selected_ids("s3://lake/out", s3)) == 180  # exactly 10% of 1800
    assert _part_bytes("s3://lake/out", s3) == _part_bytes(local_run)  # byte for byte the local output
    record = read_record(resolve("s3://lake/out", s3))
    assert record["input"]["location"] == s3_corpus and sorted(record["files"]) == sorted(
        _part_bytes("s3://lake/out", s3))
    assert not resolve("s3://lake/.out.datamask-work", s3).exists()  # the work directory is gone
    assert not lock_location(resolve("s3://lake/out", s3)).exists()  # and so is the lock


def test_a_config_file_is_read_from_its_uri(s3, s3_corpus, capsys):
    from datamask_dask.config import resolve_options

    location = resolve("s3://lake/conf/job.yaml", s3)
    with location.fs.open(location.path, "w") as handle:
        handle.write("n_epochs: 7\nlamb: 0.25\n")
    options = resolve_options("s3://lake/conf/job.yaml")
    assert (options.learner.n_epochs, options.learner.lamb, options.profile) == (7, 0.25, "s3://lake/conf/job.yaml")
    assert main(["validate", "--input", s3_corpus, "--config", "s3://lake/conf/job.yaml"]) == 0
    with pytest.raises(OptionError, match="config file 's3://lake/conf/nope.yaml' does not exist"):
        resolve_options("s3://lake/conf/nope.yaml")  # where it looked for a local file 's3:/lake/...'


def test_python_api_on_a_cluster_reads_and_writes_s3(s3, s3_corpus, local_run, client):
    report = write_selection(read_parquet(s3_corpus, storage_options=s3), "s3://lake/api-out",
                             scheduler=client, storage_options=s3, **OPTIONS)
    assert report.rows == 1800 and report.selected == 180
    assert _selected_ids("s3://lake/api-out", s3) == _selected_ids(local_run)


def _markers(work) -> list[str]:
    """The completion markers in a run's work area."""
    return sorted(name for name in work.list() if name.startswith("part-") and name.endswith(".json"))


def test_a_killed_run_on_s3_resumes_and_gives_the_same_bytes(s3, s3_corpus, local_run, capsys):
    work = resolve("s3://lake/.killed.datamask-work", s3)
    command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", s3_corpus,
               "--output", "s3://lake/killed", *FLAGS]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(_markers(work)) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)  # the client dies mid-write, as on a lost machine
    process.wait()
    finished = _markers(work)
    assert 2 <= len(finished) < N_PARTS, process.stderr.read().decode()
    assert read_record(resolve("s3://lake/killed", s3)) is None  # nothing looks complete
    assert lock_location(resolve("s3://lake/killed", s3)).exists()  # the dead run's lock is left behind

    assert main(["select", "--input", s3_corpus, "--output", "s3://lake/killed", *FLAGS]) == 0
    reused = f"{len(finished)} of {N_PARTS} partitions reused from the interrupted run"
    assert reused in capsys.readouterr().out
    assert _part_bytes("s3://lake/killed", s3) == _part_bytes(local_run)


def test_a_second_run_on_the_same_s3_output_is_refused(s3, s3_corpus):
    target = resolve("s3://lake/busy", s3)
    with output_lock(target):
        with pytest.raises(UnsafeOutputError, match="another datamask run is writing"):
            write_selection(read_parquet(s3_corpus, storage_options=s3), "s3://lake/busy", storage_options=s3,
                            scheduler="threads", **OPTIONS)
    assert not lock_location(target).exists()
    assert not target.exists()


def test_an_expired_lock_is_taken_over(s3, s3_corpus):
    lock = lock_location(resolve("s3://lake/expired", s3))
    held = {"pid": 1, "host": "elsewhere", "run": "x", "expires": time.time() - 1}
    lock.write_bytes(json.dumps(held).encode())
    report = write_selection(read_parquet(s3_corpus, storage_options=s3), "s3://lake/expired",
                             storage_options=s3, scheduler="threads", summary_rows=0, **OPTIONS)
    assert report.selected == 180 and not lock.exists()


def test_overwrite_on_s3_replaces_only_what_datamask_wrote(s3, s3_corpus, capsys):
    fs = resolve("s3://lake", s3).fs
    fs.pipe_file("lake/users-folder/notes.md", b"mine")
    assert main(["select", "--input", s3_corpus, "--output", "s3://lake/users-folder", "--overwrite",
                 *FLAGS]) == 1
    assert "without a datamask run record" in capsys.readouterr().err
    assert fs.cat_file("lake/users-folder/notes.md") == b"mine"

    assert main(["select", "--input", s3_corpus, "--output", "s3://lake/again", *FLAGS]) == 0
    assert main(["select", "--input", s3_corpus, "--output", "s3://lake/again", *FLAGS]) == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err
    fs.pipe_file("lake/again/extra.txt", b"someone else's")
    assert main(["select", "--input", s3_corpus, "--output", "s3://lake/again", "--overwrite", *FLAGS]) == 1
    assert "did not write: extra.txt" in capsys.readouterr().err
    fs.rm_file("lake/again/extra.txt")
    assert main(["select", "--input", s3_corpus, "--output", "s3://lake/again", "--overwrite",
                 "--select_ratio", "0.2", *FLAGS[:4], "--seed", "5"]) == 0
    assert len(_selected_ids("s3://lake/again", s3)) == 360


@pytest.mark.parametrize("output, relation", [("s3://lake/corpus", "is the input"),
                                              ("s3://lake/corpus/sub", "lies inside the input"),
                                              ("s3://lake", "contains the input")])
def test_an_s3_output_overlapping_the_input_is_refused(s3, s3_corpus, output, relation, capsys):
    before = sorted(resolve(s3_corpus, s3).files())
    assert main(["select", "--input", s3_corpus, "--output", output, "--overwrite", *FLAGS]) == 1
    assert relation in capsys.readouterr().err
    assert sorted(resolve(s3_corpus, s3).files()) == before


def test_a_table_job_writes_its_parquet_output_to_the_bucket(s3, tmp_path, local_corpus, monkeypatch, capsys):
    pytest.importorskip("deltalake", reason="deltalake is not installed (the lakehouse extra)")
    import deltalake
    import pyarrow.parquet as pq

    table = pq.read_table(local_corpus)
    deltalake.write_deltalake(str(tmp_path / "delta"), table)
    monkeypatch.chdir(tmp_path)
    assert main(["select", "--input", f"delta://{tmp_path / 'delta'}", "--output", "s3://lake/from-delta",
                 *FLAGS]) == 0
    assert "-> s3://lake/from-delta" in capsys.readouterr().out
    assert not (tmp_path / "s3:").exists()
    assert len(_selected_ids("s3://lake/from-delta", s3)) == 180
    record = read_record(resolve("s3://lake/from-delta", s3))
    assert sorted(record["files"]) == sorted(_part_bytes("s3://lake/from-delta", s3))


def test_a_uri_whose_filesystem_is_not_installed_names_the_package():
    try:  # gcsfs is not a dependency: the error must name it
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(OptionError, match="pip install gcsfs"):
            resolve("gs://bucket/corpus")
    else:
        pytest.skip("gcsfs is installed here, so gs:// resolves")


def test_s3_parquet_to_a_delta_table_on_s3(s3, s3_corpus, local_run, capsys, monkeypatch):
    deltalake = pytest.importorskip("deltalake", reason="deltalake is not installed (the lakehouse extra)")
    from datamask_dask.io.delta import delta_pieces

    # an http:// AWS_ENDPOINT_URL is enough, as for parquet: deltalake alone also wants AWS_ALLOW_HTTP
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    assert main(["select", "--input", s3_corpus, "--output", "delta+s3://lake/delta-out", *FLAGS]) == 0
    assert "-> delta+s3://lake/delta-out" in capsys.readouterr().out
    options = {"AWS_ENDPOINT_URL": s3["endpoint_url"], "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    table = deltalake.DeltaTable("s3://lake/delta-out", storage_options=options).to_pyarrow_table()
    selected = set(table.filter(table.column("selected")).column("chunk_id").to_pylist())
    assert table.num_rows == 1800 and selected == _selected_ids(local_run)
    pieces = delta_pieces("s3://lake/delta-out", columns=["chunk_id"], storage_options=options)
    assert pieces.rows == [pieces.read(i).num_rows for i in range(len(pieces))]  # from the log, on S3 too
    # the Python door of a frame, with nothing in the environment: the storage options as the parquet
    # sinks take them (fsspec's) or as deltalake does (its http:// endpoint among them), for the table,
    # its lock and its probe alike
    import s3fs

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()
    frame = read_parquet(s3_corpus, storage_options=s3)
    deltas = {k: v for k, v in options.items() if k != "AWS_ALLOW_HTTP"}
    for dialect, given in (("fsspec", s3), ("delta", deltas)):
        write_selection(frame, f"delta+s3://lake/delta-{dialect}", storage_options=given, **OPTIONS)
        table = deltalake.DeltaTable(f"s3://lake/delta-{dialect}", storage_options=options).to_pyarrow_table()
        assert set(table.filter(table.column("selected")).column("chunk_id").to_pylist()) == selected
        assert read_table(f"delta+s3://lake/delta-{dialect}", storage_options=given).frame["selected"].sum() \
            .compute() == len(selected)
    s3fs.S3FileSystem.clear_instance_cache()  # none made here without credentials serves the next test


def test_an_iceberg_table_on_s3_to_s3_parquet(s3, local_corpus, local_run, tmp_path):
    pytest.importorskip("pyiceberg.catalog.sql", reason="pyiceberg is not installed (the lakehouse extra)")
    pytest.importorskip("sqlalchemy", reason="pyiceberg's SQL catalog needs sqlalchemy")
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.catalog.sql import SqlCatalog

    from datamask_dask.run.tables import select_table

    properties = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": "s3://lake/warehouse",
                  "s3.endpoint": s3["endpoint_url"], "s3.access-key-id": "testing",
                  "s3.secret-access-key": "testing", "s3.region": "us-east-1"}
    catalog = SqlCatalog("lake", **{k: v for k, v in properties.items() if k != "type"})
    catalog.create_namespace("ns")
    files = sorted(local_corpus.glob("*.parquet"), key=lambda p: int(p.stem.split(".")[1]))
    for file in files:  # one snapshot per file: the partitions of the local run
        part = pq.read_table(file).replace_schema_metadata(None)
        part = part.set_column(2, "feature_arr", part.column("feature_arr").cast(pa.list_(pa.float32())))
        table = catalog.create_table_if_not_exists("ns.corpus", schema=part.schema)
        table.append(part)
    report = select_table("iceberg://lake/ns.corpus", "s3://lake/from-iceberg", catalog_properties=properties,
                          storage_options=s3, **OPTIONS)
    assert report.rows == 1800 and report.selected == 180
    assert len(_selected_ids("s3://lake/from-iceberg", s3)) == 180


def test_an_iceberg_catalog_on_s3_takes_the_endpoint_from_the_environment(s3, s3_corpus, local_run, tmp_path):
    """A catalog configured by its URI and an s3:// warehouse alone: its file IO reaches the store at
    AWS_ENDPOINT_URL, as every other reader does (pyiceberg's own reads only its s3.* properties)."""
    pytest.importorskip("pyiceberg.catalog.sql", reason="pyiceberg is not installed (the lakehouse extra)")
    pytest.importorskip("sqlalchemy", reason="pyiceberg's SQL catalog needs sqlalchemy")
    from pyiceberg.catalog import load_catalog

    catalog = {"uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": "s3://lake/env-warehouse"}
    environment = {**os.environ, **{f"PYICEBERG_CATALOG__ENVLAKE__{key.upper()}": value
                                    for key, value in catalog.items()}}
    # a process of its own: pyiceberg reads its environment once, when it is imported
    output = "iceberg://envlake/ns.selected"
    run = subprocess.run([sys.executable, "-m", "datamask_dask.cli", "select", "--input", s3_corpus,
                          "--output", output, *FLAGS], env=environment, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"-> {output}" in run.stdout
    reader = load_catalog("envlake", **catalog, **{"s3.endpoint": s3["endpoint_url"]})
    table = reader.load_table("ns.selected")
    rows = table.scan().to_arrow()
    selected = rows.filter(rows.column("selected")).column("chunk_id").to_pylist()
    assert set(selected) == _selected_ids(local_run)


def test_the_spark_file_job_reads_and_writes_s3_without_a_hadoop_connector(s3, s3_corpus, local_run,
                                                                          local_corpus):
    pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
    from conftest import local_spark
    from datamask_spark.files import write_file_selection

    record = write_file_selection(local_spark(), s3_corpus, "s3://lake/spark-out", storage_options=s3,
                                  **OPTIONS)
    assert record["rows"] == 1800 and record["selected"] == 180
    assert _selected_ids("s3://lake/spark-out", s3) == _selected_ids(local_run)  # --engine dask's rows
    assert read_record(resolve("s3://lake/spark-out", s3))["engine"] == "spark"
    # the DataFrame door's sink takes the storage options it is given, as Dask's door does: an endpoint
    # there that nothing serves is told before any Spark job, though the environment names a good one
    from datamask_spark import write_selection as spark_write_selection

    frame = local_spark().read.parquet(str(local_corpus))
    with pytest.raises(StorageError, match="^s3://lake/spark-frame-out: cannot connect to the storage "
                                           "endpoint http://127.0.0.1:9"):
        spark_write_selection(frame, "s3://lake/spark-frame-out", **OPTIONS,
                              storage_options={**s3, "endpoint_url": "http://127.0.0.1:9",
                                               "config_kwargs": {"retries": {"max_attempts": 1}}})


def test_sample_and_report_commands_on_s3(s3, s3_corpus, capsys):
    assert main(["sample", "--rows", "600", "--dim", "8", "--partitions", "3", "--output",
                 "s3://lake/sample"]) == 0
    files = read_record(resolve("s3://lake/sample", s3))["files"]
    assert sorted(files) == [f"part.{i}.parquet" for i in range(3)]
    assert read_parquet("s3://lake/sample", storage_options=s3).compute().shape[0] == 600
    again = ["sample", "--rows", "300", "--dim", "8", "--output", "s3://lake/sample"]
    assert main(again) == 1 and "pass --overwrite" in capsys.readouterr().err  # the flag it names exists
    assert main([*again, "--overwrite"]) == 0
    assert read_parquet("s3://lake/sample", storage_options=s3).compute().shape[0] == 300
    assert main(["sample", "--rows", "600", "--dim", "8", "--partitions", "3", "--output", "s3://lake/sample",
                 "--overwrite"]) == 0

    assert main(["select", "--input", "s3://lake/sample", "--output", "s3://lake/sample-out", *FLAGS]) == 0
    assert main(["report", "s3://lake/sample-out"]) == 0
    assert "s3://lake/sample-out-report/index.html" in capsys.readouterr().out
    page = resolve("s3://lake/sample-out-report/index.html", s3).read_bytes().decode()
    assert "datamask selection report: sample-out" in page and "<img" in page


def test_explain_and_its_report_on_s3(s3, s3_corpus, capsys):
    """An explained output in the bucket: `datamask explain` and the report's audit read it there."""
    assert main(["select", "--input", s3_corpus, "--output", "s3://lake/explained", "--explain", *FLAGS]) == 0
    frame = read_parquet("s3://lake/explained", storage_options=s3).compute()
    near = frame[frame["reason"] == "near-duplicate"]
    assert len(near) and frame["reason"].eq("selected").sum() == frame["selected"].sum()
    capsys.readouterr()
    row = int(near["chunk_id"].iloc[0])
    assert main(["explain", "s3://lake/explained", "--id", str(row)]) == 0
    printed = capsys.readouterr().out
    assert f"row {row}: near-duplicate" in printed and "nearest selected rows" in printed
    assert main(["explain", "s3://lake/explained", "--id", "-5"]) == 1
    assert "--id '-5'" in capsys.readouterr().err
    assert main(["report", "s3://lake/explained"]) == 0
    page = resolve("s3://lake/explained-report/index.html", s3).read_bytes().decode()
    assert "<section id='audit'>" in page and "audit-group-0" in page


def test_a_replacing_commit_cut_short_on_s3_is_finished_by_the_next_run(s3, s3_corpus, local_run,
                                                                       monkeypatch):
    """The run dies after it took the old output's record away and copied one part: the output is not
    complete (no record), and the same job run again finishes that commit."""
    from datamask_dask.io.storage import Location

    target = "s3://lake/recommit"
    write_selection(read_parquet(s3_corpus, storage_options=s3), target, storage_options=s3,
                    scheduler="threads", **{**OPTIONS, "seed": 6})
    copy, copied = Location.copy_to, []

    def dies_after_one_copy(self, destination):
        if copied:
            raise ConnectionError("the client died mid-commit")
        copied.append(destination.name)
        return copy(self, destination)

    monkeypatch.setattr(Location, "copy_to", dies_after_one_copy)
    with pytest.raises(ConnectionError):
        write_selection(read_parquet(s3_corpus, storage_options=s3), target, overwrite=True,
                        storage_options=s3, scheduler="threads", **OPTIONS)
    monkeypatch.undo()
    assert copied and read_record(resolve(target, s3)) is None  # not complete: no run record
    report = write_selection(read_parquet(s3_corpus, storage_options=s3), target, overwrite=True,
                             storage_options=s3, scheduler="threads", **OPTIONS)
    assert report.reused == tuple(range(N_PARTS)) and report.computed == ()
    assert _part_bytes(target, s3) == _part_bytes(local_run)
    assert sorted(read_record(resolve(target, s3))["files"]) == sorted(_part_bytes(local_run))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_native_writer_fills_a_file_whole_or_not_at_all(s3, tmp_path, where):
    """``write_with`` gives a native writer (cuDF's) a local path, and an object store's handle elsewhere;
    a writer that fails leaves neither the name nor a temporary behind."""
    folder = resolve(str(tmp_path) if where == "local" else "s3://lake/native", s3)
    table = pa.table({"x": list(range(100))})
    given = []

    def write(target):
        given.append(type(target))
        pq.write_table(table, target)

    folder.child("part.parquet").write_with(write)
    assert (given == [str]) == (where == "local")
    with folder.child("part.parquet").fs.open(folder.child("part.parquet").path, "rb") as handle:
        assert pq.read_table(handle).equals(table)

    def broken(target):
        pq.write_table(table, target)
        raise RuntimeError("the writer stopped")

    with pytest.raises(RuntimeError, match="the writer stopped"):
        folder.child("broken.parquet").write_with(broken)
    assert folder.list() == ["part.parquet"]
