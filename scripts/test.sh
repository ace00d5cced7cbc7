#!/usr/bin/env bash
# Set up, then run the linter and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check datamask_dask integrations tests benchmarks examples
.venv/bin/python -m pytest -q "$@"
