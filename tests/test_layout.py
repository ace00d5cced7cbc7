"""The package's architecture holds: the learner loads no dataframe library, imports run one way."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "datamask_dask"
# Rooms from the bottom up: a module may import from its own room and from rooms below it.
RANKS = {"errors": 0, "stages": 0, "_lazy": 0, "progress": 0, "learn": 1, "config": 2, "plan": 3,
         "dedup": 4, "partition": 5, "sample_data": 5, "ops": 6, "io": 7, "cluster": 8, "report": 8,
         "text": 8, "cli": 9}


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


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "face"


def test_no_import_circle():
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


def test_imports_run_one_way():
    """cli and io on top, the learner at the bottom: no room imports from a room above it."""
    upward = []
    for module, targets in _graph().items():
        room = _room(module)
        if room == "face":  # the package face names everything (lazily)
            continue
        assert room in RANKS, f"{module}: room {room!r} has no rank in this test; give it one"
        for target in targets:
            other = _room(target)
            if other != "face" and RANKS[other] > RANKS[room]:
                upward.append(f"{module} -> {target}")
    assert not upward, f"imports from a room above: {upward}"


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
