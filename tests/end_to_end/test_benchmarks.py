"""The benchmark scripts import against the package as it is (they run by hand, not in CI)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("script", sorted(p.stem for p in BENCHMARKS.glob("*.py")))
def test_a_benchmark_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # they import each other as the scripts they are
    module = importlib.import_module(script)
    assert callable(getattr(module, "main", None)) or script == "record", script  # record: shared writer
    sys.modules.pop(script, None)
