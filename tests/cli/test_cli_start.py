"""The command answers what needs only its arguments (version, help, a refused option) before it loads
torch, Dask, pandas or pyarrow: those cost seconds of start-up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numpy", "torch", "dask", "dask.dataframe", "distributed", "pandas", "pyarrow")

# Runs main() as the console script does, then reports its exit status and the heavy modules loaded.
PROBE = f"""
import json, sys
from datamask_dask.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps([code, sorted(m for m in {HEAVY!r} if m in sys.modules)]), file=sys.stderr)
"""


def _probe(args: list[str], cwd) -> tuple[int, list[str], str]:
    run = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                         cwd=cwd)
    *said, last = run.stderr.strip().splitlines()
    code, loaded = json.loads(last)
    return code, loaded, "\n".join(said)


@pytest.mark.parametrize(("args", "code"), [
    (["--version"], 0),
    (["--help"], 0),
    (["select", "--help"], 0),
    (["select", "--input", "x", "--output", "y", "--bogus"], 2),
    (["select", "--input", "x", "--output", "y", "--n_epochs", "many"], 2),
    (["select", "--input", "x", "--output", "y", "--n-workers", "0"], 2),
    (["select", "--input", "x", "--output", "y", "--n-workers", "2", "--threads-per-worker", "-1"], 2),
    (["select", "--demo", "--rows", "0"], 2),
    (["sample", "--output", "y", "--partitions", "0"], 2),
    (["sample", "--output", "y", "--dim", "1"], 2),
    (["embed", "--input", "x", "--output", "y", "--n-workers", "-2"], 2),  # a cluster of no workers
    (["score", "--input", "x", "--output", "y", "--batch-size", "0"], 2),
    (["report", "x", "--sample-rows", "0"], 2),
    (["explain", "x", "--id", "1", "--neighbours", "-1"], 2),
])
def test_version_help_and_usage_errors_load_nothing_heavy(args, code, tmp_path):
    assert _probe(args, tmp_path)[:2] == (code, [])


@pytest.mark.parametrize(("args", "flag"), [
    (["select", "--input", "x", "--output", "y", "--select_ratio", "0"], "--ratio=0.0 is out of range"),
    (["select", "--input", "x", "--output", "y", "--n_rollout", "1"], "--n_rollout=1 is invalid"),
    (["validate", "--input", "x", "--lamb", "2"], "--lamb=2.0 is invalid"),
    (["select", "--input", "x", "--output", "y", "--duplicate-cosine", "1"], "--duplicate-cosine=1.0"),
    (["select", "--budget-tokens", "0"], "--budget-tokens=0 is invalid"),
    (["select", "--input", "x", "--output", "y", "--seed", "-1"], "--seed=-1 is invalid"),
])
def test_a_refused_option_is_told_before_the_input_is_read(args, flag, tmp_path):
    """The value rules the resolved settings are checked with, applied to the flags first: the input x
    does not exist, and the message is about the option."""
    code, loaded, err = _probe(args, tmp_path)
    assert (code, loaded) == (1, [])
    assert err.startswith("datamask: error: ") and flag in err and "does not exist" not in err, err


@pytest.mark.parametrize("command", [["select", "--output", "y"], ["validate"]])
def test_a_missing_input_is_told_before_torch_and_dask_load(command, tmp_path):
    code, loaded, err = _probe([command[0], "--input", "missing", *command[1:]], tmp_path)
    assert code == 1 and err == "datamask: error: --input missing does not exist", err
    assert not {"torch", "dask.dataframe", "distributed"} & set(loaded), loaded  # the seconds of start-up


def test_a_uri_of_no_known_filesystem_is_one_line(tmp_path):
    code, _, err = _probe(["select", "--input", "hdfs2://lake/corpus", "--output", "y"], tmp_path)
    assert code == 1 and err == ("datamask: error: hdfs2://lake/corpus: no filesystem is known for hdfs2:// "
                                 "(fsspec has none of that name): give a local path or a URI such as "
                                 "s3://bucket/path"), err


def test_a_glob_input_is_told_as_a_pattern_with_the_directory_to_name(tmp_path):
    """Dask and Spark readers expand globs; datamask's input is a file or a directory (a resume lists it
    again), and the message says so rather than that the pattern does not exist."""
    from datamask_dask.io.parquet import parquet_pieces

    code, _, err = _probe(["select", "--input", "lake/part.*.parquet", "--output", "y"], tmp_path)
    told = ("datamask: error: --input lake/part.*.parquet is a pattern, which datamask does not expand: name "
            "a parquet file or the directory of them, e.g. lake")
    assert code == 1 and err == told, err
    with pytest.raises(FileNotFoundError, match=r"is a pattern, .* e\.g\. .*/lake$"):
        parquet_pieces(tmp_path / "lake" / "year=*")


def test_a_list_of_paths_is_told_at_each_python_door(tmp_path):
    """``dd.read_parquet`` takes a list of files; datamask's doors read one input: each says what to
    name instead, rather than that the list's text is a pattern or not a path."""
    import datamask_dask
    from datamask_dask.errors import OptionError

    files = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    for door in (datamask_dask.read_parquet, datamask_dask.read_table, datamask_dask.selected_counts,
                 lambda paths: datamask_dask.select_table(paths, tmp_path / "out", 0.1)):
        with pytest.raises(OptionError, match=r"^a list of paths was given where one path or URI is "
                           r"expected: name the directory .* dask\.dataframe\.read_parquet\(paths\)"):
            door(files)
    assert not (tmp_path / "out").exists()


# Each log record of the job, with the heavy modules loaded when it was written.
JOB_PROBE = f"""
import json, logging, sys
from datamask_dask.cli import main

class Loaded(logging.Handler):
    def emit(self, record):
        print(json.dumps([record.getMessage(), sorted(m for m in {HEAVY!r} if m in sys.modules)]))

logging.getLogger("datamask_dask").addHandler(Loaded())
code = main(sys.argv[1:])
print(json.dumps(["exit", code, "distributed" in sys.modules]))
"""


def test_a_job_says_what_it_does_before_the_heavy_imports(tmp_path):
    """A job's first line comes before torch and Dask load (seconds); on the threaded scheduler it never
    imports distributed."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"chunk_id": np.arange(300), "quality_score": rng.random(300),
                             "feature_arr": list(rng.standard_normal((300, 8)).astype(np.float32))}),
                   tmp_path / "in.parquet")
    command = ["select", "--input", "in.parquet", "--output", "out", "--verbose"]
    run = subprocess.run([sys.executable, "-c", JOB_PROBE, *command], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")]  # not the result
    (first, loaded), *_, last = records
    assert "loading" in first and not {"torch", "pandas", "pyarrow", "dask.dataframe"} & set(loaded), records
    assert last == ["exit", 0, False], run.stderr
