#!/usr/bin/env bash
# The GPU path end to end, on a machine with a CUDA GPU, torch and RAPIDS (cuDF, dask-cuda):
# the -m gpu tests, the 1M-row pipeline on one LocalCUDACluster worker (every column, with 1 and
# with THREADS threads, and the selection table only), the cuDF I/O ceiling and the same table on
# the machine's CPU cores. With BASELINE (the root of another checkout, e.g. `git worktree add`
# of main), the same GPU job runs on that code too, in the same run; the `selected` columns of the
# outputs are compared (this code against the baseline's, and one thread against THREADS).
#
#   OUT=/tmp/acceptance BASELINE=/tmp/main bash scripts/gpu-acceptance.sh
#
# Every step runs under `timeout` and a failure never stops the next. $OUT receives summary.md (each
# step's exit code, seconds and tables), gpu.json (the tables as records, benchmarks/record.py) and
# logs.tar.gz (every log). ROWS (default 1000000) sizes the run; QUALITY=1 adds the quality case
# (CASE, default 1m-d64) learned as one chunk per metric and lamb (selections.npz, scored on any
# machine with `python benchmarks/gpu_acceptance.py score`). Without a GPU the GPU steps fail fast
# and the CPU steps still run.
set -u
OUT=${OUT:-/tmp/gpu-acceptance}
ROWS=${ROWS:-1000000}
CASE=${CASE:-1m-d64}
PY=${PY:-python3}
WORKERS=${WORKERS:-$(nproc)}
THREADS=${THREADS:-4}
CACHE=${CACHE:-.benchmark-cache}
FILES=$((ROWS / 100000))
LOGS=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
[ -n "${COMMIT:-}" ] && export BENCH_COMMIT=$COMMIT  # a device machine's copy of the tree: the commit it was sent at
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
      grep -E '^(\||GPU:|Command:|stages|  generated|pipeline table|quality table|[0-9]+ (passed|failed)|=+ .*(passed|failed|error))' "$log" | tail -80
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
QUALITY_CASE=()
[ "${QUALITY:-0}" = 1 ] && QUALITY_CASE=(--quality-case "$CASE")
(timeout -k 10 240 "$PY" benchmarks/gpu_acceptance.py data --rows "$ROWS" "${QUALITY_CASE[@]}" \
   > "$LOGS/data.log" 2>&1; echo "| data (beside the tests) | $? | |" >> "$LOGS/steps.md") &
data=$!
step tests 120 "$PY" -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider
wait "$data"
summarise

GPU_JOB=(benchmarks/bench_gpu.py --sizes "$ROWS" --algorithms Pair_simi Facility --no-objective --keep-output)
step gpu-all-columns 110 "$PY" "${GPU_JOB[@]}" --label this "${RECORDS[@]}"
if [ -n "${BASELINE:-}" ]; then
  step gpu-all-columns-baseline 110 env PYTHONPATH="$BASELINE:$BASELINE/integrations:${PYTHONPATH:-}" \
    "$PY" "${GPU_JOB[@]}" --label baseline "${RECORDS[@]}"
  step same-selection 60 "$PY" benchmarks/gpu_acceptance.py compare "$CACHE/pipeline-gpu-out" this baseline
fi
step gpu-all-columns-threads 110 "$PY" "${GPU_JOB[@]}" --threads "$THREADS" --label threads "${RECORDS[@]}"
step same-selection-threads 60 "$PY" benchmarks/gpu_acceptance.py compare "$CACHE/pipeline-gpu-out" this threads
step io-ceiling 40 "$PY" benchmarks/gpu_acceptance.py ceiling --rows "$ROWS" "${RECORDS[@]}"
step cpu-cores 50 "$PY" benchmarks/bench_pipeline.py --sizes "$ROWS" --workers "$WORKERS" \
  --algorithms Pair_simi --no-objective "${RECORDS[@]}"
step gpu-selection-only 50 "$PY" benchmarks/bench_gpu.py --sizes "$ROWS" --algorithms Pair_simi \
  --no-objective --output-columns selection --threads "$THREADS" --label this "${RECORDS[@]}"
# Facility's 100k-row chunks need more memory a task than 16 workers leave: one worker a file
step cpu-cores-facility 60 "$PY" benchmarks/bench_pipeline.py --sizes "$ROWS" --workers "$FILES" \
  --algorithms Facility --no-objective "${RECORDS[@]}"
if [ "${QUALITY:-0}" = 1 ]; then
  step one-chunk-selections 100 "$PY" benchmarks/gpu_acceptance.py selections --case "$CASE" \
    --out "$OUT/selections.npz" "${RECORDS[@]}"
fi
echo "summary: $OUT/summary.md"
