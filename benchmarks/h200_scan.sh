#!/usr/bin/env bash
# Issue 15 item 3 on the device: the Triton scan recipe's variants (block_v x warps x prefetch) verified and timed
# by forge's evaluator against the library's gated delta rule at Qwen 3.5's real shape (the scan task of
# profiles/qwen35.cuda.bf16.json: prefill 1x2048, bf16, 16 heads of 128 x 128). Writes $OUT/scan_recipes.{txt,json}.
# Carry .whl (sqlalchemy, pyseccomp: the evaluator's; see h200_triton.sh for the pip download line). TESTS=1 also
# runs tests/test_recipe_triton_scan.py (Triton's interpreter on the CPU: minutes).
# Then Qwen 3.5 end to end (eager, torch.compile, forge with the recipe): bash benchmarks/h200_models.sh qwen35:bf16
set -u
. "$(dirname "$0")/h200_setup.sh"
export FORGE_CACHE=${FORGE_CACHE:-$(mktemp -d)}
if [ -n "${TESTS:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_recipe_triton_scan.py 2>&1 | tail -15 \
    | tee "$OUT/pytest_triton_scan.txt"
fi
python3 benchmarks/scan_recipes.py --json "$OUT/scan_recipes.json" "$@" 2>&1 | grep -v -i "warn\|falling back" \
  | tee "$OUT/scan_recipes.txt"
