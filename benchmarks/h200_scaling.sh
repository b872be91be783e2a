#!/usr/bin/env bash
# Issue 20 on the device: evaluation workers per GPU (forge optimize --gpus). On a one-GPU machine this is N=1
# through the same per-GPU pool as N=8 (forge.evaluate.pool); Ray does not travel (its cp312 wheel is ~76 MiB,
# over the 64 MiB carry), so --ray is tested on the CPU in CI (tests/test_cluster.py), not here.
#   usage: bash benchmarks/h200_scaling.sh            (env: SECONDS_EACH, default 120; ZOO, default resnet50)
# Carry .whl (sqlalchemy for the store; see h200_eval.sh). Writes $OUT/gpu_scaling.{json,txt}, $OUT/gpus_all.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
export FORGE_CACHE=${FORGE_CACHE:-$(mktemp -d)}
# the CLI path: --gpus all on a small model (one worker per GPU, each pinned with CUDA_VISIBLE_DEVICES)
timeout 150 python3 -m forge.cli optimize tests/models/two_tasks.py --device cuda --gpus all --budget 12 \
  --seconds 60 --no-inductor --db "$(mktemp -d)/f.db" >"$OUT/gpus_all.txt" 2>&1
echo "forge optimize --gpus all: exit $?"; grep -E "task|end to end" "$OUT/gpus_all.txt" | tail -n 6
# candidates per minute for the recipe policy on a reference model, with 1, 2, 4, 8 GPUs as there are
timeout 400 python3 benchmarks/gpu_scaling.py --device cuda --zoo "${ZOO:-resnet50}" --seconds "${SECONDS_EACH:-120}" \
  --json "$OUT/gpu_scaling.json" 2>&1 | grep -v -i "warn" | tee "$OUT/gpu_scaling.txt"
