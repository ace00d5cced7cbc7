"""The quality gate runs in CI: a fall in the default selection's share of greedy's gain fails it."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a cluster, a server or a whole job: see the fast subset

GATE = Path(__file__).resolve().parents[2] / "benchmarks" / "quality_gate.py"


def test_the_default_selections_keep_their_recorded_share_of_greedys_gain():
    run = subprocess.run([sys.executable, str(GATE), "--check"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("  ok  ") == 8, run.stdout  # every case has a record and holds it
