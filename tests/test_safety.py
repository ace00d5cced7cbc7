"""Safety: user-supplied files are data only (no pickle, no eval, no YAML tags) and paths are never
interpreted by a shell."""

from __future__ import annotations

import pickle
import re
import shutil
from pathlib import Path

import dask.dataframe as dd
import pyarrow.parquet as pq
import pytest
from conftest import FAST

from datamask_dask import OptionError, load_config, write_selection
from datamask_dask.cli import main
from datamask_dask.io.writer import work_dir

PACKAGE = Path(__file__).resolve().parents[1] / "datamask_dask"
FAST_FLAGS = ["--n_epochs", str(FAST["n_epochs"]), "--n_rollout", str(FAST["n_rollout"])]
FORBIDDEN = {
    "pickle.load": r"\bpickle\.loads?\(",
    "eval(": r"(?<![\w.])eval\(",
    "exec(": r"(?<![\w.])exec\(",
    "shell=True": r"shell\s*=\s*True",
    "yaml.load (unsafe)": r"\byaml\.(unsafe_)?load\(",
    "torch.load": r"\btorch\.load\(",
    "allow_pickle=True": r"allow_pickle\s*=\s*True",
    "read_pickle": r"\bread_pickle\(",
    "os.system": r"\bos\.system\(",
}


class _Trap:
    """Unpickling this creates a file: proof that a pickle was loaded."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_package_source_never_unpickles_evaluates_or_uses_a_shell():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10
    found = [f"{path.relative_to(PACKAGE)}:{number}: {name}" for path in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for name, pattern in FORBIDDEN.items() if re.search(pattern, line)]
    assert found == []


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
    (work / "part-00000.done").write_bytes(pickle.dumps(_Trap(str(trap))))
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
