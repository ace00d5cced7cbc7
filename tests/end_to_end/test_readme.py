"""The README's code blocks run as written (fenced ```python and ```bash blocks, in order, in one
directory), so the headline, the command line and the Python API shown to users are proven."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow  # a cluster, a server or a whole job: see the fast subset

README = Path(__file__).resolve().parents[2] / "README.md"


def _blocks() -> list[tuple[str, str]]:
    return re.findall(r"^```(python|bash)\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)


def test_every_code_block_of_the_readme_runs(tmp_path):
    blocks = _blocks()
    assert [kind for kind, _ in blocks] == ["python", "bash", "python"]
    bin_dir = Path(sys.executable).parent  # the `datamask` console script of this environment
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    headline, commands, api = (code for _, code in blocks)
    # The headline reads corpus/: the command-line block's first line makes it. Run that first.
    first, rest = commands.split("\n", 1)
    for code, kind in ((first, "bash"), (headline, "python"), (rest, "bash"), (api, "python")):
        script = tmp_path / ("block.py" if kind == "python" else "block.sh")
        script.write_text(code if kind == "python" else "set -euo pipefail\n" + code)
        command = [sys.executable, str(script)] if kind == "python" else ["bash", str(script)]
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"README {kind} block failed:\n{code}\n{run.stdout}\n{run.stderr}"
    assert pq.read_table(tmp_path / "corpus-mask").num_rows == 4000
    selected = pq.read_table(tmp_path / "corpus-mask", columns=["selected"]).column(0).to_numpy()
    assert int(selected.sum()) == 400
    assert pq.read_table(tmp_path / "corpus-selected").num_rows == 4000
    selected, profile = run.stdout.splitlines()[-1].split()[:2]
    assert (selected, profile) == ("400", "cpu"), run.stdout
