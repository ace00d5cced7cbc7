"""Safety: user-supplied files are data only (no pickle, no eval, no YAML tags) and paths are never
interpreted by a shell."""

from __future__ import annotations

import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dask.dataframe as dd
import pyarrow.parquet as pq
import pytest
from conftest import FAST

from datamask_dask import OptionError, load_config, write_selection
from datamask_dask.cli import main
from datamask_dask.run.selection import work_dir

PACKAGE = Path(__file__).resolve().parents[2] / "datamask_dask"
FAST_FLAGS = ["--n_epochs", str(FAST["n_epochs"]), "--n_rollout", str(FAST["n_rollout"])]
# What the package must never do with a user's file, each with a line that does it: ruff's bandit
# rules (S) and banned APIs (TID251, pyproject.toml) must refuse every one in the package's code.
FORBIDDEN = {
    "pickle.loads": "import pickle\npickle.loads(data)\n",
    "eval": "eval(text)\n",
    "exec": "exec(text)\n",
    "shell=True": "import subprocess\nsubprocess.run(text, shell=True)\n",
    "os.system": "import os\nos.system(text)\n",
    "yaml.load": "import yaml\nyaml.load(text)\n",
    "torch.load": "import torch\ntorch.load(path)\n",
    "numpy.load": "import numpy as np\nnp.load(path, allow_pickle=True)\n",
    "read_pickle": "import pandas as pd\npd.read_pickle(path)\n",
}
ROOT = PACKAGE.parent


class _Trap:
    """Unpickling this creates a file: proof that a pickle was loaded."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_package_source_never_unpickles_evaluates_or_uses_a_shell():
    """The linter CI runs refuses each forbidden call in the package, and the package has none."""
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise"]
    for name, code in FORBIDDEN.items():
        for room in ("datamask_dask", "integrations/datamask_spark"):
            planted = subprocess.run([*ruff, "--stdin-filename", f"{room}/planted.py", "-"], input=code,
                                     capture_output=True, text=True, cwd=ROOT)
            assert planted.returncode == 1 and re.search(r": (S\d+|TID251) ", planted.stdout), (name, planted)
    clean = subprocess.run([*ruff, "datamask_dask", "integrations"], capture_output=True, text=True, cwd=ROOT)
    assert clean.returncode == 0, clean.stdout


def test_yaml_config_with_a_python_tag_is_rejected(tmp_path, corpus, capsys):
    trap = tmp_path / "executed"
    config = tmp_path / "job.yaml"
    config.write_text("n_epochs: !!python/object/apply:pathlib.Path.touch "
                      f"[!!python/object/apply:pathlib.Path ['{trap}']]\n")
    with pytest.raises(OptionError, match=r"job\.yaml' is not valid YAML.*python/object"):
        load_config(config)
    source = tmp_path / "in.parquet"
    corpus.iloc[:200].to_parquet(source)
    assert main(["select", "--input", str(source), "--output", str(tmp_path / "out.parquet"),
                 "--config", str(config)]) == 1
    assert "is not valid YAML" in capsys.readouterr().err
    assert not trap.exists() and not (tmp_path / "out.parquet").exists()


def test_a_pickled_manifest_is_never_loaded(tmp_path, corpus):
    target, trap = tmp_path / "out", tmp_path / "unpickled"
    work = work_dir(target)
    work.mkdir()
    (work / "manifest.json").write_bytes(pickle.dumps(_Trap(str(trap))))
    (work / "part-00000.json").write_bytes(pickle.dumps(_Trap(str(trap))))
    report = write_selection(dd.from_pandas(corpus, npartitions=2, sort=False), target, scheduler="sync",
                             ratio=0.1, **FAST)
    assert report.computed == (0, 1) and report.reused == ()  # an unreadable manifest: start afresh
    assert not trap.exists() and not work.exists()


def test_paths_are_not_interpreted_by_a_shell(tmp_path, parquet_dir, capsys):
    source = tmp_path / "in; touch hacked"
    shutil.copytree(parquet_dir, source)
    target = tmp_path / "out $(touch hacked2) `touch hacked3`"
    assert main(["select", "--input", str(source), "--output", str(target), "--select_ratio", "0.1",
                 *FAST_FLAGS]) == 0
    assert pq.read_table(target).num_rows == 1600
    assert main(["validate", "--input", str(source)]) == 0
    missing = tmp_path / "$(touch hacked4)"
    assert main(["validate", "--input", str(missing)]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([source.name, target.name])
    assert not any(Path.cwd().glob("hacked*"))
