#!/usr/bin/env bash
# The GPU path's check, for the few minutes a machine with one NVIDIA GPU is at hand (an H200 with
# CUDA torch preinstalled and no network). Run from the repository root:
#
#     OUT=/some/dir WHEELS=wheels tests/gpu/device_check.sh
#
# It installs parasim offline (pip --no-index from $WHEELS, the project's other wheels carried
# in a folder; SKIP_INSTALL=1 when it is importable already), then, each step with its own
# timeout and all within $BUDGET_S seconds (default 450: under 8 minutes):
#   env         torch, CUDA, NCCL, the GPU's name and memory
#   gpu_tests   pytest -m gpu (the NCCL/CUDA path of the executor)
#   bench       GEMM TFLOP/s at the job's shapes and a square one, HBM bandwidth of a copy
#   simulate    the 1-GPU Llama-style job (bf16, flash attention, ~20 GB) predicted
#   run         the job for real (parasim run)
#   calibrate   parasim calibrate --run: the GPU's kernels measured and fitted
#   validate_preset, validate_calibrated
#               parasim validate against the preset's profile and against the calibrated one
# and writes every figure to $OUT/device_check.json and $OUT/device_check.txt (a failed or
# timed-out step is recorded with its status and last line; the next step still runs).
# DEVICE=cpu rehearses all of it on the CPU with a tiny fp32 model (tests/gpu/test_device_check.py).
set -u
OUT=${OUT:?set OUT to the folder the figures go to}
DEVICE=${DEVICE:-cuda}
WHEELS=${WHEELS:-wheels}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-450}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
: > "$OUT/steps.tsv"
START=$(date +%s)

# step NAME LIMIT_S CMD...: stdout to $OUT/NAME.out, stderr to $OUT/NAME.err, status and time
# to steps.tsv; the limit is cut to what the budget leaves (20 s kept for the summary).
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET_S - 20 - ($(date +%s) - START)))
    if [ "$left" -lt "$limit" ]; then limit=$left; fi
    if [ "$limit" -le 0 ]; then
        echo "out of budget before this step" > "$OUT/$name.err"
        printf '%s\t%s\t%s\n' "$name" 124 0 >> "$OUT/steps.tsv"
        return
    fi
    local t0 rc
    echo "device_check: $name (up to $limit s)" >&2
    t0=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(awk "BEGIN {print $(date +%s.%N) - $t0}")" \
        >> "$OUT/steps.tsv"
    echo "device_check: $name rc $rc" >&2
}

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    step install 90 "$PY" -m pip install --no-index --find-links "$WHEELS" --no-build-isolation \
        . pytest
fi

# The job: a Llama-style 1.24B model (Llama 3.2 1B's shape) in bf16 with flash attention,
# ~25 GB predicted on one H200 or H100 (parameters, gradients, Adam, 4K-token activations); on the CPU a
# tiny fp32 one on one local rank.
if [ "$DEVICE" = cuda ]; then
    SHAPE='layers = 16
hidden = 2048
heads = 32
kv_heads = 8
seq_len = 4096
vocab = 128256
ffn_hidden = 8192
tied_embeddings = true
dtype = "bf16"'
    # The preset of the GPU at hand (PRESET overrides): its peaks are the prediction's.
    PRESET=${PRESET:-$("$PY" -c "
import torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''
print(next((p for m, p in (('H200', 'dgx-h200'), ('H100', 'dgx-h100'), ('A100', 'dgx-a100'))
            if m in name), 'dgx-h200'))")}
    CLUSTER="preset = \"$PRESET\"
nodes = 1
gpus_per_node = 1"
    STEPS=3
else
    SHAPE='layers = 2
hidden = 128
heads = 4
kv_heads = 2
seq_len = 128
vocab = 512
ffn_hidden = 256
dtype = "fp32"'
    CLUSTER='preset = "localhost"
gpus_per_node = 1'
    STEPS=2
fi
cat > "$OUT/job.toml" <<EOF
# written by tests/gpu/device_check.sh (DEVICE=$DEVICE)
[model]
$SHAPE
ffn = "swiglu"
norm = "rmsnorm"
position = "rope"
bias = false
dropout = 0.0
attention = "flash"

[parallel]
micro_batch = 1
global_batch = 4

[cluster]
$CLUSTER
EOF
# The preset's own profile as a file, so validate can be asked to use it (no calibration).
"$PY" -c "
import json, sys
from sim.config import load_experiment
from sim.profile import default_profile
exp = load_experiment(sys.argv[1])
print(json.dumps(default_profile(exp.cluster.accelerator).to_json(), indent=1))
" "$OUT/job.toml" > "$OUT/preset-profile.json"

step env 30 "$PY" "$HERE/device_figures.py" env --device "$DEVICE" "$OUT/env.json"
GPU_TESTS=$(grep -rl "pytest.mark.gpu" tests --include='test_*.py' | sort)
step gpu_tests 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml "$OUT/gpu_tests.xml" \
    $GPU_TESTS
step bench 45 "$PY" "$HERE/device_figures.py" bench --device "$DEVICE" "$OUT/bench.json"
step simulate 30 "$PY" -m sim simulate "$OUT/job.toml" --json
step run 60 "$PY" -m sim run "$OUT/job.toml" --out "$OUT/run" --steps "$STEPS" --warmup 1 \
    --timeout 50 --json
step calibrate 90 "$PY" -m sim calibrate --run "$OUT/job.toml" -o "$OUT/calibrated.json" \
    --timeout 80 --json
step validate_preset 60 "$PY" -m sim validate "$OUT/job.toml" --profile \
    "$OUT/preset-profile.json" --steps "$STEPS" --timeout 50 --json
step validate_calibrated 60 "$PY" -m sim validate "$OUT/job.toml" --profile \
    "$OUT/calibrated.json" --steps "$STEPS" --timeout 50 --json
"$PY" "$HERE/device_figures.py" summary "$OUT"
cat "$OUT/device_check.txt"
echo "device_check: $(( $(date +%s) - START )) s; figures in $OUT/device_check.json" >&2
