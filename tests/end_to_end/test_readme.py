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

from datamask_dask.io.output import read_record

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
    # The headline reads corpus/: the command-line block's first line makes it. Run that first. The other
    # commands run one by one, so that each selection's run record is read before the next replaces it.
    first, *lines = re.sub(r"\\\n\s*", " ", commands).strip().splitlines()
    steps = [(first, "bash"), (headline, "python"), *((line, "bash") for line in lines), (api, "python")]
    for code, kind in steps:
        script = tmp_path / ("block.py" if kind == "python" else "block.sh")
        script.write_text(code if kind == "python" else "set -euo pipefail\n" + code)
        command = [sys.executable, str(script)] if kind == "python" else ["bash", str(script)]
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"README {kind} block failed:\n{code}\n{run.stdout}\n{run.stderr}"
        if code.startswith("datamask select"):
            _at_or_above_quality_topk(tmp_path / code.split("--output ")[1].split()[0], code)
    _at_or_above_quality_topk(tmp_path / "corpus-api", api)
    assert pq.read_table(tmp_path / "corpus-mask").num_rows == 4000
    selected = pq.read_table(tmp_path / "corpus-mask", columns=["selected"]).column(0).to_numpy()
    assert int(selected.sum()) == 400
    assert pq.read_table(tmp_path / "corpus-selected").num_rows == 4000
    selected, profile = run.stdout.splitlines()[-1].split()[:2]
    assert (selected, profile) == ("400", "cpu"), run.stdout


def _at_or_above_quality_topk(output: Path, example: str) -> None:
    """An example shows the product at its best: its selection gains at least quality top-k's share of
    the baseline's gain over random (the run record's yardstick)."""
    yardstick = read_record(output)["summary"]["yardstick"]
    assert yardstick["share"] >= yardstick["topk_share"], (example, yardstick)
