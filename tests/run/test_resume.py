"""Resumable runs: completion markers, the manifest, resuming after a kill, refusing a changed run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask_dask import ResumeError, datamask_select, write_selection
from datamask_dask.cli import main
from datamask_dask.io.output import UnsafeOutputError
from datamask_dask.io.parquet import read_parquet
from datamask_dask.io.sinks import write_parquet
from datamask_dask.io.staging import read_manifest
from datamask_dask.io.storage import input_fingerprint
from datamask_dask.run.selection import work_dir
from datamask_dask.sample_data import make_corpus

N_PARTS = 8
# Each partition (300 rows) is learned on its own, so a partition that cannot be read leaves the others
# finished (packed partitions are learned, and so fail, together).
# by partition: each partition learns in its own task, so a run that fails on one has finished others
FLAGS = ["--n_epochs", "20", "--n_rollout", "8", "--select_ratio", "0.1", "--seed", "5",
         "--max-chunk-rows", "300", "--pieces", "partitions"]
OPTIONS = {"n_epochs": 20, "n_rollout": 8, "ratio": 0.1, "seed": 5, "max_chunk_rows": 300,
           "pieces": "partitions"}


@pytest.fixture(scope="module")
def eight_parts(tmp_path_factory):
    """2400 rows in 8 parquet files (one partition each)."""
    path = tmp_path_factory.mktemp("resume") / "in"
    write_parquet(dd.from_pandas(make_corpus(2400, 16, seed=2), npartitions=N_PARTS, sort=False), path)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory, eight_parts):
    """An uninterrupted run of the same job, written by the Python API."""
    out = tmp_path_factory.mktemp("reference") / "out"
    report = write_selection(read_parquet(eight_parts), out, scheduler="threads", **OPTIONS)
    assert report.computed == tuple(range(N_PARTS)) and report.reused == ()
    return out


@pytest.fixture(scope="module")
def killed(tmp_path_factory, eight_parts):
    """The work directory of a ``datamask select`` process killed (SIGKILL) after 3 partitions."""
    target = tmp_path_factory.mktemp("killed") / "out"
    work = work_dir(target)
    command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(eight_parts),
               "--output", str(target), *FLAGS]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(list(work.glob("part-*.json"))) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)  # the whole job dies, as on a lost machine
    process.wait()
    finished = sorted(int(p.stem.split("-")[1]) for p in work.glob("part-*.json"))
    assert 3 <= len(finished) < N_PARTS, process.stderr.read().decode()
    assert not target.exists()  # nothing is published before every partition is done
    return work, finished


def _restore(killed, target: Path) -> list[int]:
    """Put a copy of the killed run's work directory next to ``target``; return its finished partitions."""
    shutil.copytree(killed[0], work_dir(target))  # copy2: modification times are kept
    return killed[1]


def _bytes(path: Path) -> dict:
    """The data files' bytes (the run record differs between runs: its id, times and stage seconds)."""
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.parquet"))}


def test_uninterrupted_run_matches_the_operator(eight_parts, reference):
    expected = datamask_select(read_parquet(eight_parts), **OPTIONS).compute(scheduler="sync")
    table = pq.read_table(reference)
    np.testing.assert_array_equal(table.column("selected").to_numpy(), expected["selected"].to_numpy())
    assert table.column("chunk_id").to_pylist() == list(range(2400))
    assert int(table.column("selected").to_numpy().sum()) == 240
    assert sorted(p.name for p in reference.iterdir()) == ["_datamask_run.json",
                                                            *(f"part.{i}.parquet" for i in range(N_PARTS))]
    assert not work_dir(reference).exists()  # the work directory goes once the output is published


@pytest.mark.slow
def test_killed_run_resumes_without_recomputing_finished_partitions(tmp_path, eight_parts, reference, killed,
                                                                    capsys):
    target = tmp_path / "out"
    finished = _restore(killed, target)
    work = work_dir(target)
    manifest = read_manifest(work)
    assert manifest["settings"]["n_epochs"] == 20 and manifest["settings"]["seed"] == 5
    assert manifest["input"]["rows"] == [300] * N_PARTS
    written = {i: (work / f"part-{i:05d}.parquet").stat().st_mtime_ns for i in finished}

    assert main(["select", "--input", str(eight_parts), "--output", str(target), *FLAGS]) == 0
    shown = capsys.readouterr()
    assert f"{len(finished)} of {N_PARTS} partitions reused" in shown.out
    # a batch job (no terminal, so no progress bar) logs what ran, through the datamask_dask logger
    log = [line.split("datamask: ", 1)[1] for line in shown.err.splitlines() if "datamask: " in line]
    steps = [line.split(":")[0].split(" ")[0] for line in log]
    assert steps == ["planning", "planned", "resuming", "committed"], log
    assert f"{len(finished)} finished partition(s) reused, {N_PARTS - len(finished)} to compute" in log[2]
    assert _bytes(target) == _bytes(reference)  # bit for bit the uninterrupted run's output
    assert not work.exists()
    # Finished parts are published as they are (hard links): not written again, same times.
    for i, stamp in written.items():
        assert (target / f"part.{i}.parquet").stat().st_mtime_ns == stamp


def _corrupt_column(file: Path, column: str) -> bytes:
    """Overwrite ``column``'s data in a parquet file (its footer stays readable); return the old bytes."""
    original = file.read_bytes()
    chunk = pq.ParquetFile(file).metadata.row_group(0)
    meta = chunk.column(chunk.to_dict()["columns"].index(
        next(c for c in chunk.to_dict()["columns"] if c["path_in_schema"] == column)))
    start = meta.dictionary_page_offset or meta.data_page_offset
    data = bytearray(original)
    data[start:start + meta.total_compressed_size] = b"\xff" * meta.total_compressed_size
    file.write_bytes(bytes(data))
    return original


def _interrupt(ddf, target: Path, file: Path, **options) -> list[int]:
    """Run a job that fails on ``file`` (its text column is unreadable); return the finished partitions."""
    original = _corrupt_column(file, "text")
    try:
        with pytest.raises(OSError):
            write_selection(ddf, target, scheduler="sync", **options)
    finally:
        file.write_bytes(original)  # repaired: the next run can finish
    assert not target.exists()
    return sorted(int(p.stem.split("-")[1]) for p in work_dir(target).glob("part-*.json"))


def test_resume_skips_marked_partitions_and_redoes_broken_ones(tmp_path, eight_parts, reference, killed):
    target = tmp_path / "out"
    finished = _restore(killed, target)
    work = work_dir(target)
    # Damage two finished partitions: a truncated part file, and a marker from another run.
    truncated, foreign, kept = finished[0], finished[1], finished[2:]
    part = work / f"part-{truncated:05d}.parquet"
    part.write_bytes(part.read_bytes()[:100])
    marker = json.loads((work / f"part-{foreign:05d}.json").read_text())
    (work / f"part-{foreign:05d}.json").write_text(json.dumps({**marker, "run_id": "another run"}))

    report = write_selection(read_parquet(eight_parts), target, scheduler="sync",
                             input_fingerprint=input_fingerprint(eight_parts), **OPTIONS)
    assert report.reused == tuple(kept)
    assert report.computed == tuple(sorted({*range(N_PARTS)} - set(kept)))
    assert (report.rows, report.selected) == (2400, 240)
    assert _bytes(target) == _bytes(reference)
    assert not work.exists()  # published: the work directory is gone


def test_resume_with_other_options_or_input_refuses(tmp_path, eight_parts, capsys):
    target = tmp_path / "out"
    ddf = read_parquet(eight_parts)
    finished = _interrupt(ddf, target, eight_parts / "part.6.parquet", **OPTIONS)
    work = work_dir(target)
    manifest = read_manifest(work)
    assert [run["computed"] for run in manifest["runs"]] == [list(range(N_PARTS))]
    with pytest.raises(ResumeError, match=r"other options \(n_epochs: 20 -> 30\).*--no-resume"):
        write_selection(ddf, target, scheduler="sync", **{**OPTIONS, "n_epochs": 30})
    with pytest.raises(ResumeError, match=r"other options \(seed: 5 -> 6\)"):
        write_selection(ddf, target, scheduler="sync", **{**OPTIONS, "seed": 6})
    changed = dd.from_pandas(make_corpus(2400, 16, seed=9), npartitions=N_PARTS, sort=False)
    with pytest.raises(ResumeError, match="the input changed since it started"):
        write_selection(changed, target, scheduler="sync", **OPTIONS)
    with pytest.raises(ResumeError, match=r"memory_budget"):
        write_selection(ddf, target, scheduler="sync", memory_budget="64MiB", **OPTIONS)
    assert sorted(int(p.stem.split("-")[1]) for p in work.glob("part-*.json")) == finished  # untouched
    # The command line refuses too (it also fingerprints the files), naming what to do.
    assert main(["select", "--input", str(eight_parts), "--output", str(target), *FLAGS]) == 1
    err = capsys.readouterr().err  # what to do, and not "run the same command again", which would loop
    assert "cannot resume the unfinished run" in err and "run the same command again" not in err
    report = write_selection(ddf, target, scheduler="sync", resume=False, **{**OPTIONS, "n_epochs": 30})
    assert report.reused == () and report.computed == tuple(range(N_PARTS))


def test_existing_output_needs_overwrite_and_is_replaced_whole(tmp_path, eight_parts, reference):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("previous output")
    for overwrite in (False, True):  # not an output of datamask: said at once, not after overwrite=True
        with pytest.raises(UnsafeOutputError, match="without a datamask run record.*keep.txt"):
            write_selection(read_parquet(eight_parts), target, overwrite=overwrite, **OPTIONS)
    assert (target / "keep.txt").read_text() == "previous output"
    (target / "keep.txt").unlink()
    target.rmdir()
    write_selection(read_parquet(eight_parts), target, scheduler="threads", **OPTIONS)
    with pytest.raises(FileExistsError, match="to replace it"):  # ours: replaced on request
        write_selection(read_parquet(eight_parts), target, **OPTIONS)
    report = write_selection(read_parquet(eight_parts), target, overwrite=True, scheduler="threads",
                             **OPTIONS)
    assert report.rows == 2400
    assert _bytes(target) == _bytes(reference)
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging, old copy or work directory left


def test_fingerprint_does_not_depend_on_block_sizes():
    """The content summary a resume compares is the same bits whatever the blocks (memory budget)
    or BLAS threads of the run: a float32 matrix product's rounding depends on them."""
    import torch

    from datamask_dask.config import resolve_options
    from datamask_dask.partition.checks import embedding_problems
    from datamask_dask.partition.spec import spec_from_meta
    from datamask_dask.sample_data import make_corpus

    frame = make_corpus(3000, 768, seed=0)
    spec = spec_from_meta(frame.iloc[:0], resolve_options(None, ratio=0.1))
    threads = torch.get_num_threads()
    runs = []
    try:
        for size, n_threads in ((None, 1), (200_000, 2), (77_777, 1)):
            torch.set_num_threads(n_threads)
            runs.append(embedding_problems(frame, 0, spec, block_bytes=size, sign=True))
    finally:
        torch.set_num_threads(threads)
    for _, problems, summary, signed in runs[1:]:
        assert not problems
        assert np.array_equal(summary, runs[0][2]) and np.array_equal(signed, runs[0][3])


def test_a_run_started_before_a_setting_existed_resumes(tmp_path, eight_parts):
    """Its manifest lacks the new key: the key had its built-in default then, so nothing changed."""
    target = tmp_path / "out"
    ddf = read_parquet(eight_parts)
    finished = _interrupt(ddf, target, eight_parts / "part.6.parquet", **OPTIONS)
    manifest_path = work_dir(target) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["settings"].pop("explain")
    manifest_path.write_text(json.dumps(manifest))
    report = write_selection(ddf, target, scheduler="sync", **OPTIONS)
    assert report.reused == tuple(finished) and len(finished) > 0


def test_a_work_area_of_an_earlier_version_is_refused_with_what_to_do(tmp_path, eight_parts):
    """An unfinished run of the previous layout (format 1, ``.done`` markers) is neither resumed nor
    silently discarded: the message says how to start over, and that works."""
    target = tmp_path / "out"
    work = work_dir(target)
    work.mkdir()
    old = {"format": 1, "run_id": "old", "settings": {}, "runs": []}
    (work / "manifest.json").write_text(json.dumps(old))
    (work / "part-00000.done").write_text("{}")
    with pytest.raises(ResumeError, match=r"earlier version of datamask-dask.*--no-resume"):
        write_selection(read_parquet(eight_parts), target, scheduler="sync", **OPTIONS)
    assert (work / "part-00000.done").exists() and not target.exists()
    report = write_selection(read_parquet(eight_parts), target, scheduler="sync", resume=False, **OPTIONS)
    assert report.computed == tuple(range(N_PARTS)) and not work.exists()
