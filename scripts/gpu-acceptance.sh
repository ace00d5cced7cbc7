#!/usr/bin/env bash
# The GPU path end to end, on a machine with a CUDA GPU, torch and RAPIDS (cuDF, dask-cuda):
# the -m gpu tests, the 1M-row pipeline on one LocalCUDACluster worker (every column, and the
# selection table only), the cuDF I/O ceiling, the same table on the machine's CPU cores, and the
# quality case learned as one chunk on the GPU per metric and lamb.
#
#   OUT=/tmp/acceptance bash scripts/gpu-acceptance.sh
#
# Every step runs under `timeout` and a failure never stops the next. $OUT receives summary.md (each
# step's exit code, seconds and tables), gpu.json (the tables as records, benchmarks/record.py),
# logs.tar.gz (every log) and selections.npz (scored on any machine with
# `python benchmarks/gpu_acceptance.py score`). ROWS (default 1000000) and CASE (default
# 1m-d64) size the run; without a GPU the GPU steps fail fast and the CPU steps still run.
set -u
OUT=${OUT:-/tmp/gpu-acceptance}
ROWS=${ROWS:-1000000}
CASE=${CASE:-1m-d64}
PY=${PY:-python3}
WORKERS=${WORKERS:-$(nproc)}
FILES=$((ROWS / 100000))
LOGS=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 BENCH_COMMIT=${COMMIT:-unknown}
RECORDS=(--json "$OUT/gpu.json")

summarise() {
  {
    echo "# GPU acceptance run"
    echo
    echo "Commit ${COMMIT:-unknown}; rows $ROWS; quality case $CASE; $(date -u +%FT%TZ)"
    echo
    echo '| step | exit | seconds |'
    echo '|---|---:|---:|'
    cat "$LOGS/steps.md" 2>/dev/null
    for log in "$LOGS"/*.log; do
      echo
      echo "## $(basename "$log" .log)"
      echo
      grep -E '^(\||GPU:|Command:|stages|  generated|pipeline table|quality table|[0-9]+ (passed|failed)|=+ .*(passed|failed|error))' "$log" | tail -40
      grep -E 'Error|error:|Traceback' "$log" | head -5 | cut -c1-300
    done
  } > "$OUT/summary.md"
  tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
}

step() {  # step NAME LIMIT_SECONDS COMMAND...: run it under timeout, log it, record exit code and seconds
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  echo "== $name (limit ${limit} s): $*"
  timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  echo "| $name | $rc$([ "$rc" = 124 ] && echo ' (timed out)') | $((SECONDS - start)) |" >> "$LOGS/steps.md"
  echo "   exit $rc after $((SECONDS - start)) s"
  summarise
}

step environment 30 bash -c "nvidia-smi; $PY -c 'import sys, torch, pandas, pyarrow, dask, distributed
print(sys.version); print(\"torch\", torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(0))
print(\"pandas\", pandas.__version__, \"pyarrow\", pyarrow.__version__, \"dask\", dask.__version__)
import cudf, dask_cuda; print(\"cudf\", cudf.__version__, \"dask_cuda\", dask_cuda.__version__)'"

# the tables are drawn on the CPU cores while the tests use the GPU
(timeout -k 10 240 "$PY" benchmarks/gpu_acceptance.py data --rows "$ROWS" --quality-case "$CASE" \
   > "$LOGS/data.log" 2>&1; echo "| data (beside the tests) | $? | |" >> "$LOGS/steps.md") &
data=$!
step tests 100 "$PY" -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider
wait "$data"
summarise

step gpu-all-columns 130 "$PY" benchmarks/bench_gpu.py --sizes "$ROWS" --algorithms Pair_simi Facility \
  --no-objective "${RECORDS[@]}"
step io-ceiling 30 "$PY" benchmarks/gpu_acceptance.py ceiling --rows "$ROWS" "${RECORDS[@]}"
step one-chunk-selections 100 "$PY" benchmarks/gpu_acceptance.py selections --case "$CASE" \
  --out "$OUT/selections.npz" "${RECORDS[@]}"
step cpu-cores 40 "$PY" benchmarks/bench_pipeline.py --sizes "$ROWS" --workers "$WORKERS" \
  --algorithms Pair_simi --no-objective "${RECORDS[@]}"
# Facility's 100k-row chunks need more memory a task than 16 workers leave: one worker a file
step cpu-cores-facility 60 "$PY" benchmarks/bench_pipeline.py --sizes "$ROWS" --workers "$FILES" \
  --algorithms Facility --no-objective "${RECORDS[@]}"
step gpu-selection-only 35 "$PY" benchmarks/bench_gpu.py --sizes "$ROWS" --algorithms Pair_simi \
  --no-objective --output-columns selection "${RECORDS[@]}"
echo "summary: $OUT/summary.md"
