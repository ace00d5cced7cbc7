"""Every kind of ``--output`` a user may name, from a file or a directory input, with and without
``--overwrite``, on local disk and on an object store: each cell completes, or refuses at once in one line
that names what to do, and nothing of the user's changes. A run killed part-way and run again completes."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid

import dask.dataframe as dd
import pyarrow.dataset as ds
import pytest
from conftest import FAST

from datamask_dask import write_parquet
from datamask_dask.cli import main
from datamask_dask.io.staging import work_location
from datamask_dask.io.storage import resolve
from datamask_dask.sample_data import make_corpus

pytestmark = pytest.mark.slow  # dozens of jobs and a server

ROWS = 400
FLAGS = ["--n_epochs", str(FAST["n_epochs"]), "--n_rollout", str(FAST["n_rollout"]), "--select_ratio", "0.1"]
OUTPUTS = ["absent", "empty directory", "datamask directory", "datamask file", "user's directory",
           "user's file", "the input"]
#: outputs that hold something a run must never replace, whatever the flags
REFUSED = {"user's directory", "user's file", "the input"}


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    """A fresh folder (a URI) on local disk or on the S3 server on localhost."""
    if request.param == "local":
        return str(tmp_path)
    request.getfixturevalue("s3")
    return f"s3://lake/matrix-{uuid.uuid4().hex[:8]}"


def _input(root: str, kind: str) -> str:
    folder = f"{root}/in"
    write_parquet(dd.from_pandas(make_corpus(ROWS, 8, seed=5), npartitions=2, sort=False), folder)
    return folder if kind == "directory" else f"{folder}/part.0.parquet"


def _select(source: str, output: str, *more) -> int:
    return main(["select", "--input", source, "--output", output, *FLAGS, *more])


def _prepare(root: str, source: str, output: str) -> str:
    """Make ``output`` (a kind of OUTPUTS) at ``root``; the URI to pass as ``--output``."""
    target = f"{root}/out"
    fs = resolve(root).fs
    if output == "empty directory":
        if not resolve(root).local:
            pytest.skip("an object store has no empty directories: a prefix without objects is absent")
        os.mkdir(target)
    elif output == "datamask directory":
        assert _select(f"{root}/in", target) == 0
    elif output == "datamask file":
        assert _select(f"{root}/in/part.0.parquet", target) == 0
    elif output == "user's directory":
        fs.makedirs(resolve(target).path, exist_ok=True)
        fs.pipe(resolve(f"{target}/notes.txt").path, b"the user's notes")
    elif output == "user's file":
        fs.pipe(resolve(target).path, b"the user's file")
    elif output == "the input":
        return source
    return target


def _snapshot(uri: str) -> dict:
    """Each file under ``uri`` (or the file itself) with its bytes' digest."""
    location = resolve(uri)
    if not location.exists():
        return {}
    paths = location.fs.find(location.path) if location.isdir() else [location.path]
    return {p: hashlib.sha256(location.fs.cat_file(p)).hexdigest() for p in paths}


def _rows(uri: str) -> tuple[int, int]:
    location = resolve(uri)
    table = ds.dataset(location.path, filesystem=location.fs, format="parquet",
                       exclude_invalid_files=False, ignore_prefixes=[".", "_"]).to_table(columns=["selected"])
    return table.num_rows, int(sum(table.column("selected").to_pylist()))


@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("kind", ["file", "directory"])
def test_every_output_completes_or_refuses_in_one_line(root, kind, output, overwrite, capsys):
    source = _input(root, kind)
    target = _prepare(root, source, output)
    theirs = _snapshot(source) if output == "the input" else (_snapshot(target) if output in REFUSED else {})
    capsys.readouterr()
    code = _select(source, target, *(["--overwrite"] if overwrite else []))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert not work_location(resolve(target)).exists()  # nothing half-written is left to resume or loop on
    existing = output.startswith("datamask")
    if output in REFUSED or (existing and not overwrite):
        lines = [line for line in err.strip().splitlines() if "error" in line]
        assert code != 0 and len(lines) == 1, err
        assert "again" not in lines[0]  # a refusal is not cured by running the same command again
        if existing:
            assert "--overwrite" in lines[0], err
        else:
            assert (_snapshot(source) if output == "the input" else _snapshot(target)) == theirs
        return
    assert code == 0, err
    rows = ROWS // 2 if kind == "file" else ROWS
    assert _rows(target) == (rows, round(0.1 * rows))


def _killed_then_rerun(source: str, target: str, *more) -> tuple[int, str]:
    """``datamask select`` killed (SIGKILL, as on a lost machine) once its first partition is marked
    finished, then the same command again; the rerun's exit code and stderr."""
    # each partition learned in its own task (partition scope: no pack learns them together), one after
    # another: once the first is marked finished, the second's learning leaves time to kill the job
    # before it commits, however busy the machine (a chunk this small is learned in refine epochs alone)
    command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", source, "--output", target,
               "--diversity_scope", "partition", "--refine_epochs", "2000", "--n_rollout", "8",
               "--select_ratio", "0.1", *more]
    work = work_location(resolve(target))
    environment = {**os.environ, "DASK_SCHEDULER": "synchronous"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment)
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        if any(name.startswith("part-") and name.endswith(".json") for name in work.list()):
            break
        time.sleep(0.02)
    assert process.poll() is None, "the job ended before its first partition was marked finished"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert any(name.startswith("part-") for name in work.list())  # it died part-way, with work to resume
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return rerun.returncode, rerun.stderr


@pytest.mark.parametrize("store, kind", [("local", "directory"), ("s3", "file")])
def test_a_killed_run_completes_when_run_again(request, tmp_path, store, kind):
    """The same command after a kill completes, over an absent output and, with --overwrite, over an
    earlier run's output (where the remedy once looped): a directory input on disk, a file on S3."""
    if store == "s3":
        request.getfixturevalue("s3")
    root = str(tmp_path) if store == "local" else f"s3://lake/killed-{uuid.uuid4().hex[:8]}"
    source = _input(root, kind)
    earlier = _prepare(root, source, "datamask directory")
    for target, more in ((f"{root}/fresh", ()), (earlier, ("--overwrite",))):
        code, err = _killed_then_rerun(source, target, *more)
        assert code == 0 and "Traceback" not in err, err
        assert not work_location(resolve(target)).exists()
        rows = ROWS // 2 if kind == "file" else ROWS
        assert _rows(target) == (rows, round(0.1 * rows))
