"""The examples run as shipped: the quickstart notebook, the batch job and the Spark job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pyarrow.parquet as pq
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # a cluster, a server or a whole job: see the fast subset

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_quickstart_notebook(tmp_path):
    notebook = nbformat.read(EXAMPLES / "quickstart.ipynb", as_version=4)
    # "python3" is the kernel of the running interpreter (jupyter_client maps it to sys.executable).
    NotebookClient(notebook, kernel_name="python3", timeout=300,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                     for output in cell.outputs)
    assert "4000 rows, 400 selected" in text
    assert "datamask" in text and "random" in text


def test_batch_job(tmp_path, client):
    target = tmp_path / "selected"
    # On the session's LocalCluster (by address): the job's own cluster start is tested elsewhere.
    run = subprocess.run([sys.executable, str(EXAMPLES / "batch_job.py"), "--output", str(target),
                          "--rows", "3000", "--cluster", client.scheduler.address, "--n-epochs", "20",
                          "--n-rollout", "8"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "3000 rows, 300 selected" in run.stdout
    table = pq.read_table(target)
    assert table.num_rows == 3000 and int(table.column("selected").to_numpy().sum()) == 300


def test_spark_job_with_spark_submit(tmp_path):
    """examples/spark_job.py as its docstring runs it: spark-submit, local[2]."""
    import os
    import shutil

    pytest.importorskip("pyspark", reason="the Spark example needs pyspark (pip install '.[spark]')")
    from conftest import spark_worker_environment

    spark_worker_environment()  # the workers (and spark-submit's driver) run this interpreter
    submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent))
    assert submit, "pyspark installs spark-submit next to the interpreter"
    target = tmp_path / "selected"
    env = {**os.environ, "PYSPARK_DRIVER_PYTHON": sys.executable}
    run = subprocess.run([submit, "--master", "local[2]", str(EXAMPLES / "spark_job.py"),
                          "--output", str(target), "--rows", "3000", "--n-epochs", "20", "--n-rollout", "8"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "selected 300 of 3000 rows" in run.stdout
    table = pq.read_table(target)
    assert table.num_rows == 3000 and int(table.column("selected").to_numpy().sum()) == 300
