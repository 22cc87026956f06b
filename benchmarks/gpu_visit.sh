#!/usr/bin/env bash
# One visit to a lent GPU (the device tool's `run`, from the project's root): build, the CUDA tests, the costs.
# Everything lands in $OUT (at most 8 files come back): build.log, tests.log, costs.log, gpu_costs.json, hf.log,
# gpu_costs_hf.json.
#   run: bash benchmarks/gpu_visit.sh   with timeout_s 580 (the stages below are cut at 90 + 150 + 240 + 100 s)
# Each stage saves what it measured as it goes; a stage cut short loses only its own rest. GPU_VISIT_HF=0 skips
# transformers' decoding (its compilation takes a minute or two).
set -u
OUT=${OUT:-/tmp/gpu-visit}; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/build.log" 2>&1
timeout 90 python3 setup.py build_ext --inplace >> "$OUT/build.log" 2>&1 || echo "build failed (rc $?)" >> "$OUT/build.log"
# the compiled passes' tests come last in the file: a cut loses those first
timeout 150 python3 -m pytest -q -p no:cacheprovider --durations=0 tests/test_cuda.py > "$OUT/tests.log" 2>&1
echo "tests rc $?" >> "$OUT/tests.log"
timeout 240 python3 benchmarks/gpu_costs.py --pass-shapes off,auto,auto:compiled,auto:written --out "$OUT/gpu_costs.json" \
  > "$OUT/costs.log" 2>&1
echo "costs rc $?" >> "$OUT/costs.log"
if [ "${GPU_VISIT_HF:-1}" != 0 ]; then
  timeout 100 python3 benchmarks/gpu_costs.py --pass-shapes "" --hf --out "$OUT/gpu_costs_hf.json" > "$OUT/hf.log" 2>&1
  echo "hf rc $?" >> "$OUT/hf.log"
fi
tail -n 5 "$OUT/tests.log" "$OUT/costs.log" "$OUT/hf.log" 2>/dev/null
