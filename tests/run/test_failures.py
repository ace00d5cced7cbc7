"""Failures mid-run: a worker process killed on a real LocalCluster, a partition that cannot be read,
bad data found by the plan pass. The result is identical or the previous output is untouched."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask_dask import InputDataError, datamask_select, write_selection
from datamask_dask.cli import main
from datamask_dask.io.parquet import read_parquet
from datamask_dask.io.sinks import write_parquet
from datamask_dask.io.staging import work_location
from datamask_dask.io.storage import resolve
from datamask_dask.run.selection import work_dir
from datamask_dask.sample_data import make_corpus

N_PARTS = 8
OPTIONS = {"n_epochs": 20, "n_rollout": 8, "ratio": 0.1, "seed": 1}
FLAGS = ["--n_epochs", "20", "--n_rollout", "8", "--select_ratio", "0.1", "--seed", "1"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("failures") / "in"
    write_parquet(dd.from_pandas(make_corpus(2400, 16, seed=6), npartitions=N_PARTS, sort=False), path)
    return path


@pytest.fixture(scope="module")
def expected(source) -> np.ndarray:
    """``selected`` of an uninterrupted run (threaded scheduler, no cluster)."""
    out = datamask_select(read_parquet(source), **OPTIONS).compute(scheduler="threads")
    return out["selected"].to_numpy()


def _files(path: Path) -> dict:
    """The data files' bytes (the run record differs between runs: its id, times and stage seconds)."""
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.parquet"))}


def _is_select_task(key) -> bool:
    """A fused read-select-write task of the writer (Dask names the fused task after its layers)."""
    name = str(key)
    return "datamask" in name and "plan" not in name


@pytest.fixture(params=["local", "s3"])
def target(request, tmp_path):
    """The output: a local directory, or a prefix on the S3 API server (the same rules hold)."""
    if request.param == "local":
        return resolve(tmp_path / "out")
    options = request.getfixturevalue("s3")
    return resolve(f"s3://lake/killed-worker-{tmp_path.name}", options)


@pytest.mark.slow
def test_killed_worker_gives_the_same_result(target, source, expected):
    from distributed import Client, LocalCluster

    work = work_location(target)
    # Worker processes under nannies: a killed worker is restarted, its tasks are run again.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      memory_limit="2GiB") as cluster, Client(cluster, set_as_default=False) as client:
        pids = client.run(os.getpid)
        killed: dict = {}

        def done() -> int:
            return sum((name.startswith("part-") and name.endswith(".json")) for name in work.list())

        def kill_a_busy_worker():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not killed:
                if done():  # mid-run: some partitions written, others running
                    for address, keys in client.processing().items():
                        if address in pids and any(_is_select_task(key) for key in keys):
                            killed.update(pid=pids[address], done=done(), published=target.exists())
                            os.kill(pids[address], signal.SIGKILL)
                            return
                time.sleep(0.005)

        killer = threading.Thread(target=kill_a_busy_worker, daemon=True)
        killer.start()
        report = write_selection(read_parquet(source), target.uri, scheduler=client,
                                 storage_options=target.fs.storage_options, **OPTIONS)
        killer.join()
        assert killed and killed["done"] < N_PARTS and not killed["published"]
        client.wait_for_workers(2, timeout=60)  # the nanny brought a fresh worker process back
        assert killed["pid"] not in client.run(os.getpid).values()
    table = pq.read_table(target.path, filesystem=None if target.local else target.fs)
    np.testing.assert_array_equal(table.column("selected").to_numpy(), expected)
    assert table.column("chunk_id").to_pylist() == list(range(2400))  # no row lost or written twice
    assert report.rows == 2400 and report.selected == 240 and report.computed == tuple(range(N_PARTS))
    assert target.list() == ["_datamask_run.json", *sorted(f"part.{i}.parquet" for i in range(N_PARTS))]
    assert not work.exists()


def _corrupt_column(file: Path, column: str) -> None:
    """Overwrite ``column``'s pages in a parquet file; its footer (and other columns) stay readable."""
    metadata = pq.ParquetFile(file).metadata
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    chunk = metadata.row_group(0).column(names.index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(file.read_bytes())
    data[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    file.write_bytes(bytes(data))


def test_run_failing_mid_way_leaves_the_previous_output_intact(tmp_path, source, capsys):
    inputs, target = tmp_path / "in", tmp_path / "out"
    shutil.copytree(source, inputs)
    args = ["select", "--input", str(inputs), "--output", str(target), *FLAGS]
    assert main(args) == 0
    before = _files(target)
    # A file whose `text` pages are corrupt: the plan pass (small columns) reads it fine, the
    # select pass fails on it while other partitions are being written.
    _corrupt_column(inputs / "part.5.parquet", "text")
    capsys.readouterr()
    assert main([*args, "--overwrite", "--seed", "2"]) == 1
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("datamask: ")]  # not the timed log lines
    assert said[0].startswith("datamask: error:")
    assert _files(target) == before  # the previous output, byte for byte
    hidden = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    work = work_dir(target)
    # Which partitions finish before the bad one fails depends on the threads' timing: the work
    # directory (and the hint to resume) stays exactly when one did; no staging is ever left.
    if work.exists() and any(work.glob("part-*.json")):
        assert hidden == [work.name] and "run the same command again to resume" in err
    else:
        assert hidden == [] and "resume" not in err


def test_bad_data_fails_in_the_plan_pass_before_anything_is_written(tmp_path, source):
    target = tmp_path / "out"
    write_selection(read_parquet(source), target, scheduler="threads", **OPTIONS)
    before = _files(target)
    frame = make_corpus(2400, 16, seed=6)
    frame.loc[2000, "quality_score"] = np.inf
    bad = dd.from_pandas(frame, npartitions=N_PARTS, sort=False)
    with pytest.raises(InputDataError, match=r"partition 6: quality column 'quality_score' has 1 NaN or "
                                             r"infinite value\(s\) at rows \[200\] \(ids \[2000\]\)"):
        write_selection(bad, target, overwrite=True, scheduler="threads", **OPTIONS)
    assert _files(target) == before
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no work directory: no partition was learned
