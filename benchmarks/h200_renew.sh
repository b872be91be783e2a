#!/usr/bin/env bash
# On the device: the spot check's renewal (forge.evaluate.measured.renews, d7cda71) through a real CUDA worker.
# tests/kernels/mm_few_changed.cu is right unless 1 to 4096 input elements changed since its last call: at this
# checkout it must pass (a product's inputs are drawn anew every round); from the tree in .base/old (git archive
# 91d47cb forge | tar -x -C .base/old; carry .base), which perturbed 8 elements an input a round, it is caught.
# Env: FORGE_COMMIT (this checkout's), OLD_COMMIT (the old tree's, default 91d47cb...), N (evaluations, 3).
set -u
. "$(dirname "$0")/h200_setup.sh"
K=tests/kernels/mm_few_changed.cu
timeout 150 python3 benchmarks/kept_address.py --task mm --device cuda --n "${N:-3}" --json "$OUT/renew-new.json" \
  "$K" >"$OUT/renew-new.log" 2>&1; echo "this checkout: exit $?"; grep '^|' "$OUT/renew-new.log"
[ -d .base/old/forge ] || { echo "no .base/old: the old tree was not carried"; exit 0; }
(cd .base/old && FORGE_COMMIT=${OLD_COMMIT:-91d47cb6f779879ef1608d197001afac396a4ef3} PYTHONPATH=$PWD:$PYTHONPATH \
  timeout 150 python3 ../../benchmarks/kept_address.py --task mm --device cuda --n "${N:-3}" \
  --json "$OUT/renew-old.json" "../../$K" >"$OUT/renew-old.log" 2>&1; echo "old tree: exit $?")
grep '^|' "$OUT/renew-old.log"
