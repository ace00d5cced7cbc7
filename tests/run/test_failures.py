"""Failures mid-run: a partition that cannot be read, bad data found by the plan pass. The previous
output is untouched. (A worker process killed mid-run, on every sink: tests/run/test_sinks.py.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask_dask import InputDataError, write_selection
from datamask_dask.cli import main
from datamask_dask.io.parquet import read_parquet
from datamask_dask.io.sinks import write_parquet
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


def _files(path: Path) -> dict:
    """The data files' bytes (the run record differs between runs: its id, times and stage seconds)."""
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.parquet"))}


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
    with pytest.raises(InputDataError, match=r"partition 6: quality column 'quality_score' has 1 NaN, "
                                             r"null or infinite value\(s\) at rows \[200\] \(ids \[2000\]\)"):
        write_selection(bad, target, overwrite=True, scheduler="threads", **OPTIONS)
    assert _files(target) == before
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no work directory: no partition was learned


def _hold(limit: int, dask_worker=None) -> int:
    """In a worker (a task, or ``client.run``): fill its process to 90% of its memory limit, and keep it
    (no task's result holds it)."""
    import psutil
    from distributed import get_worker

    room = int(0.9 * limit) - psutil.Process().memory_info().rss
    (dask_worker or get_worker()).held = np.ones(max(room, 0), dtype=np.uint8)
    return room


def _ended(job) -> list[BaseException]:
    """What ``job()`` raised, once it ended (it must within a minute)."""
    import threading

    caught: list[BaseException] = []

    def run() -> None:
        try:
            job()
        except Exception as exc:
            caught.append(exc)

    waiting = threading.Thread(target=run, daemon=True)
    waiting.start()
    waiting.join(60)
    assert not waiting.is_alive(), "the job is still waiting on the paused worker"
    return caught


def _statuses(client) -> list[str]:
    """Each worker's status as the scheduler has it (``"running"``, ``"paused"``, ...)."""
    return client.run_on_scheduler(lambda dask_scheduler: [ws.status.name for ws in
                                                            dask_scheduler.workers.values()])


STALLED = (r"worker tcp://.* has been paused for \d+ s with tasks it will not start: its process holds .* of "
           r"its 1\.00 GiB memory limit.*more memory \(memory_limit=\)")


@pytest.mark.slow
def test_a_worker_paused_for_good_fails_the_job_naming_it(monkeypatch):
    """A worker whose process stays past Dask's pause share of its memory limit (memory no task result
    holds, so nothing Dask spills or frees brings it back) never starts the tasks it holds, and Dask
    waits for ever: the computation fails after STALL_SECONDS, naming the worker, what it holds and
    what to change, and its futures are cancelled."""
    import re

    import dask
    from distributed import Client, LocalCluster

    from datamask_dask import progress, stalls
    from datamask_dask.errors import WorkerMemoryError

    monkeypatch.setattr(stalls, "STALL_SECONDS", 3.0)
    limit = 1 << 30
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, memory_limit=limit,
                      dashboard_address=":0") as local, Client(local, set_as_default=False) as client:
        held = dask.delayed(_hold)(limit)
        after = dask.delayed(lambda room: room)(held)  # the worker's next task, which it never starts
        caught = _ended(lambda: progress.compute(after, scheduler=client, progress=False))
        status = _statuses(client)
    assert status == ["paused"]  # paused it stays: the job, not Dask, ended the wait
    assert len(caught) == 1 and isinstance(caught[0], WorkerMemoryError), caught
    assert re.search(STALLED, str(caught[0]))


@pytest.mark.slow
def test_a_users_own_compute_on_a_worker_paused_for_good_fails_naming_it(monkeypatch):
    """The select pass of ``datamask_select`` is the user's to compute, outside the package's waits: on a
    worker paused for good after the plan, the scheduler's stall watch fails the selection's tasks with
    the same error, where Dask would wait for ever; another computation's task it leaves waiting."""
    import re
    import time

    from distributed import Client, LocalCluster

    from datamask_dask import datamask_select, stalls
    from datamask_dask.errors import WorkerMemoryError

    monkeypatch.setattr(stalls, "STALL_SECONDS", 3.0)
    limit = 1 << 30
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, memory_limit=limit,
                      dashboard_address=":0") as local, Client(local, set_as_default=False) as client:
        frame = dd.from_pandas(make_corpus(2000, 16, seed=3), npartitions=2, sort=False)
        out = datamask_select(frame, scheduler=client, **OPTIONS)  # the plan pass runs on the worker
        client.run(_hold, limit)
        deadline = time.monotonic() + 30
        while _statuses(client) != ["paused"]:
            assert time.monotonic() < deadline, "the worker did not pause"
            time.sleep(0.1)
        caught = _ended(lambda: out.compute(scheduler=client))
        other = client.submit(sum, [1, 2])  # another computation's task: the watch leaves it to Dask
        time.sleep(stalls.STALL_SECONDS + 2)
        assert other.status == "pending"
    assert len(caught) == 1 and isinstance(caught[0], WorkerMemoryError), caught
    assert re.search(STALLED, str(caught[0]))
