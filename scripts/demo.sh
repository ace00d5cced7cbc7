#!/usr/bin/env bash
# Set up, then run the main job on the embedded sample corpus (no arguments needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/datamask demo "$@"
