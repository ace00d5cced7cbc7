"""The quality gate runs in CI: a fall in the default selection's share of greedy's gain fails it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a cluster, a server or a whole job: see the fast subset

GATE = Path(__file__).resolve().parents[2] / "benchmarks" / "quality_gate.py"
RECORD = GATE.parent / "results" / "quality-gate.json"


def test_the_default_selections_keep_their_recorded_share_of_greedys_gain():
    run = subprocess.run([sys.executable, str(GATE), "--check"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    # every case has a record and holds it
    assert run.stdout.count("  ok  ") == len(json.loads(RECORD.read_text())), run.stdout
    assert " new  " not in run.stdout, run.stdout
