#!/usr/bin/env bash
# On the device: every cuda-marked test (the CUDA and Triton corpora, the recipes' GPU verification, the
# GPU rewrites), then benchmarks/variants.py for the variants named in $VARIANTS on $MODEL (no kernels),
# each under a time limit; logs and JSON under $OUT.
#   usage: MODEL=gemma4 VARIANTS="@inductor-cuda-graph attention-gemm@inductor-cuda-graph" bash benchmarks/h200_check.sh
# Carry .whl (see h200_eval.sh). Env: TESTS_LIMIT (default 230 s), VARIANTS_LIMIT (default 300 s).
set -u
. "$(dirname "$0")/h200_setup.sh"
timeout "${TESTS_LIMIT:-230}" python3 -m pytest -q -m cuda tests/ -p no:cacheprovider >"$OUT/cuda-tests.log" 2>&1
echo "cuda tests exit $? ($(date +%T))"
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/cuda-tests.log" | tail -n 15
if [ -n "${MODEL:-}" ]; then
  timeout "${VARIANTS_LIMIT:-300}" python3 benchmarks/variants.py --device cuda --dtype "${DTYPE:-bf16}" \
    --models "$MODEL" --no-compile --variants ${VARIANTS:-} --json "$OUT/variants.$MODEL.json" \
    >"$OUT/variants.$MODEL.log" 2>&1
  echo "variants exit $? ($(date +%T))"
  grep -E '^\|' "$OUT/variants.$MODEL.log"
fi
