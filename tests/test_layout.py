"""The package's architecture holds: the learner loads no dataframe library, imports run one way
(import-linter's contracts in pyproject.toml)."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "datamask_dask"
ROOT = PACKAGE.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, known: dict) -> set[str]:
    """Package modules imported anywhere in ``path`` (function-level imports too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out |= {t for t in [base] + [f"{base}.{a.name}" for a in node.names] if t in known}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def test_no_import_circle():
    """Inside a room too (import-linter's layers only order the rooms)."""
    graph = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                pytest.fail("import circle: " + " -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_import_contracts_hold():
    """The rooms import downwards only, Spark included (pyproject.toml's [tool.importlinter])."""
    out = subprocess.run([str(LINT_IMPORTS), "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_import_contracts_refuse_an_upward_import(tmp_path):
    """A copy of the package where the learner imports the CLI breaks the layers contract."""
    shutil.copytree(PACKAGE, tmp_path / "datamask_dask", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "integrations" / "datamask_spark", tmp_path / "datamask_spark",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "datamask_dask" / "learn" / "planted.py").write_text("from ..cli import main\n")
    out = subprocess.run([str(LINT_IMPORTS), "--no-cache"], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 1, out.stdout
    assert "datamask_dask.learn.planted -> datamask_dask.cli" in out.stdout, out.stdout


@pytest.mark.parametrize("module", ["datamask_dask.learn", "datamask_dask.learn.engine",
                                    "datamask_dask.learn.baselines"])
def test_the_learner_loads_no_dataframe_library(module):
    code = (f"import sys, {module} as m; getattr(m, '__all__', None); "
            "print(sorted(x for x in ('pandas', 'dask', 'pyarrow', 'cudf', 'distributed') "
            "if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_face_names_resolve_lazily():
    code = ("import sys, datamask_dask as d; before = 'dask' in sys.modules; "
            "names = [getattr(d, n) for n in d.__all__]; print(before, 'dask' in sys.modules, len(names))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after, count = out.stdout.split()
    assert (before, after) == ("False", "True") and int(count) >= 20, out.stdout + out.stderr
