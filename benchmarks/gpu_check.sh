#!/usr/bin/env bash
# The one GPU check of the CUDA path (fused layers, static-buffer step, CUDA graphs with their
# self-check), sized for a lent H100 / H200 session: about 6 minutes of commands, so that with
# the machine's start it fits in 8 and a 15-minute lease leaves time to rerun a stage.
#
#   bash benchmarks/gpu_check.sh            # from the repository root; results under $OUT
#
# Stages, in order of what a lease must not miss, each under its own time limit and all under
# one budget (GPU_CHECK_BUDGET seconds, default 390; the last stage gets what is left):
#   1. gpu_tests   pytest -m gpu: real CUDA graph replay vs eager (fp32 and bf16), doctor on
#                  CUDA, the gpu-marked kernel tests
#   2. bench       benchmarks/bench_gpu.py on the decisive settings: cache none and dual,
#                  batch 1 and 32, one token per step, gen 256, graphs on and off
#                  (random LLaDA-8B shape, 32 layers, bf16) -> gpu.csv
#   3. doctor      dllm-decode doctor: facts, every Triton kernel vs its reference, the
#                  weight-streaming floor and each cache mode's ratio, the graph self-check
#                  per cache mode -> doctor.csv
#   4. kernels     every kernel test on CUDA (compiled Triton instead of the interpreter)
# summary.txt gets each stage's exit status, time and last lines; each stage's full output is
# its .log. At most 8 files come back from a lent machine: these are 7.
#
# Nothing is installed: the lent image's python3 has torch, triton, transformers, tokenizers,
# safetensors, pytest and hypothesis; the package is imported from the checkout (PYTHONPATH).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET:-390}
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
FAILED=0

say() { echo "$*" | tee -a "$SUMMARY"; }

# stage NAME CAP_SECONDS COMMAND...: run under min(CAP, what is left of the budget)
stage() {
    local name=$1 cap=$2 left limit began rc note
    shift 2
    left=$(( BUDGET - ($(date +%s) - START) ))
    limit=$(( cap < left ? cap : left ))
    if [ "$limit" -lt 20 ]; then
        say "== $name: skipped, ${left}s of the budget left"
        FAILED=1
        return
    fi
    say "== $name (limit ${limit}s): $*"
    began=$(date +%s)
    timeout --signal=INT --kill-after=15 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    note=""
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note=" (stopped at its time limit)"; fi
    say "   exit $rc after $(( $(date +%s) - began ))s$note"
    tail -n 4 "$OUT/$name.log" | sed 's/^/   | /' | tee -a "$SUMMARY"
    [ $rc -eq 0 ] || FAILED=1
}

say "== environment ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 \
    | sed 's/^/   /' | tee -a "$SUMMARY"
$PY - <<'EOF' 2>&1 | sed 's/^/   /' | tee -a "$SUMMARY"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available",
      torch.cuda.is_available())
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton absent")
EOF

stage gpu_tests 110 $PY -m pytest -q -p no:cacheprovider -m gpu -rs \
    tests/test_graph_step.py tests/test_doctor.py tests/kernels
stage bench 170 $PY benchmarks/bench_gpu.py --caches none dual --batch 1 32 \
    --tokens-per-step 1 --gen-length 256 --out "$OUT/gpu.csv"
stage doctor 100 $PY -m dllm_decode.cli doctor --out "$OUT/doctor.csv"
stage kernels 300 $PY -m pytest -q -p no:cacheprovider -rs tests/kernels

say "== done in $(( $(date +%s) - START ))s; $([ $FAILED -eq 0 ] && echo 'every stage passed' \
    || echo 'a stage FAILED or ran out of time (see above)')"
exit $FAILED
