#!/usr/bin/env bash
# Create .venv and install the package with its test tools. Without a GPU it pins torch's CPU
# build (on these machines torch==2.13.0 is a CPU wheel on local disk; elsewhere set
# TORCH_INDEX_URL to a CPU wheel index); with nvidia-smi present pip picks torch's CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-test,lakehouse,report,spark,text,docs}
# Reinstall only when what the install depends on changed (a stamp of it lives in .venv).
stamp=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$EXTRAS
if [ -x .venv/bin/python ] && [ "$(cat .venv/.datamask-installed 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
# One line before each step: the installs are quiet and take minutes.
say() { echo "setup: $*"; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
say "upgrading pip in .venv"
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    say "installing torch 2.13.0 (CUDA build: nvidia-smi found)"
    python -m pip install -q "torch==2.13.0"
  else
    say "installing torch 2.13.0 (CPU build${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL})"
    python -m pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  fi
fi
say "installing datamask-dask (editable) with extras $EXTRAS: a few minutes"
python -m pip install -q -e ".[$EXTRAS]"
# The report test opens the HTML page in a real headless browser: Debian's chromium, where apt can
# install it (the test is skipped, saying so, where no chromium can be found).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  say "installing chromium with apt-get (running as root) for the report's browser test"
  { apt-get update -q >/dev/null 2>&1; apt-get install -y -q chromium >/dev/null 2>&1; } || say "could not install chromium; the browser test will be skipped"
fi
echo "$stamp" > .venv/.datamask-installed
say "done: .venv is ready"
