#!/usr/bin/env bash
# One visit to a lent GPU (the device tool's `run`, from the project's root): build, the CUDA tests, the costs.
# Everything lands in $OUT (at most 8 files come back): build.log, tests.log, costs.log, gpu_costs.json.
#   run: bash benchmarks/gpu_visit.sh   with timeout_s 580 (the stages below are cut at 90 + 180 + 270 s)
# GPU_VISIT_HF=0 skips transformers' decoding (its compilation takes a minute or two).
set -u
OUT=${OUT:-/tmp/gpu-visit}; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/build.log" 2>&1
timeout 90 python3 setup.py build_ext --inplace >> "$OUT/build.log" 2>&1 || echo "build failed (rc $?)" >> "$OUT/build.log"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_pass_shape.py > "$OUT/tests.log" 2>&1
echo "tests rc $?" >> "$OUT/tests.log"
HF=--hf; [ "${GPU_VISIT_HF:-1}" = 0 ] && HF=
timeout 270 python3 benchmarks/gpu_costs.py $HF --out "$OUT/gpu_costs.json" > "$OUT/costs.log" 2>&1
echo "costs rc $?" >> "$OUT/costs.log"
tail -n 5 "$OUT/tests.log" "$OUT/costs.log"
