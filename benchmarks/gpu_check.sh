#!/usr/bin/env bash
# Every GPU path on one NVIDIA GPU, in one command; logs into one folder.
#
#   benchmarks/gpu_check.sh [LOG_DIR]        # default: $OUT if set, else ./gpu_logs
#
# Needs python3 with torch (CUDA), jax (GPU), cupy and numba, e.g. the device machine's image. Wheels
# that machine lacks (array-api-compat, array-api-strict, torchao, nvidia-modelopt and its
# dependencies) can be brought in ./.whl: they are installed into /tmp/site first. Then it installs this
# project (editable, no dependencies, offline) and runs, each under its own time limit (seconds, in
# the second column below) with its log in LOG_DIR/<step>.log and its exit status in LOG_DIR/summary.txt:
# every test with a GPU backend (torch-cuda, jax-gpu, cupy ids and the CUDA-only tests), the host-sync
# report, the GPU benchmark and the per-batch and whole-model calibration benchmark on CUDA.
# The tests step ran past 330 s with 12 workers on an H200 (2026-11-28: 1015 cases), hence its 420 s limit.
# STEPS (default: all four) picks steps by name, e.g. STEPS="tests sync_report"; PYTEST_ARGS adds pytest
# arguments to the tests step (e.g. a file to rerun).
set -u -o pipefail
LOG=${1:-${OUT:-gpu_logs}}
mkdir -p "$LOG"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
WHEELS=${WHEELS:-.whl}
if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
        > /tmp/gpu_check_wheels.log 2>&1 || { tail -20 /tmp/gpu_check_wheels.log; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . > /tmp/gpu_check_install.log 2>&1 \
    || { tail -20 /tmp/gpu_check_install.log; exit 1; }
{ nvidia-smi; $PY -m pip list 2>/dev/null | grep -iE "^(torch|torchao|jax|jaxlib|jax-cuda.*|cupy.*|numpy|numba|nvidia-modelopt|array.api.*) "; } \
    > "$LOG/machine.txt" 2>&1
: > "$LOG/summary.txt"

STEPS=${STEPS:-tests sync_report bench_gpu bench_model_calibration}
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
    local start=$SECONDS
    timeout "$limit" "$@" > "$LOG/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - start)) s (limit $limit s)" | tee -a "$LOG/summary.txt"
    tail -n 4 "$LOG/$name.log"
}

step tests "${TESTS_LIMIT:-420}" $PY -m pytest -q -n "${WORKERS:-12}" -k "cuda or gpu or cupy" --tb=short -p no:cacheprovider ${PYTEST_ARGS:-}
step sync_report 45 $PY benchmarks/gpu_sync_report.py --where
step bench_gpu 60 $PY benchmarks/bench_gpu.py --repeats 10
step bench_model_calibration 120 $PY benchmarks/bench_model_calibration.py --device cuda --repeats 2 --only torch.ao ours "INT8 max"
