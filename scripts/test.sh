#!/usr/bin/env bash
# Set up, then run the linter, the type checker and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check datamask_dask integrations tests benchmarks examples docs
# The contracts' types ([tool.mypy] in pyproject.toml names the modules it holds to them).
.venv/bin/mypy
# The documentation site, with warnings as errors (its code blocks run in tests/end_to_end/test_docs.py).
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
# Two processes, a test file each at a time (a module's fixtures, clusters and Spark session stay in
# one process); DATAMASK_TEST_PROCESSES=0 runs in this one. The slowest tests are listed, so that
# the suite's time can be kept in check.
.venv/bin/python -m pytest -q --durations=25 -n "${DATAMASK_TEST_PROCESSES:-2}" --dist loadfile "$@"
