#!/usr/bin/env bash
# Regenerate the committed reference profiles (CPU machine; about 10 minutes on 2 cores).
#   meta: full-size task lists (shapes only, no times), bf16 like the GPU runs; ResNet-50 also in fp32.
#   cpu:  per-node CPU timings at reduced size, fp32.
#   cuda: per-node GPU timings at full size, bf16 (ResNet-50 also fp32), on an NVIDIA GPU (the H200 here:
#         `PROFILE_OUT=$OUT FORGE="python3 -m forge.cli" profiles/make.sh cuda` on the device machine).
#   usage: profiles/make.sh [meta|cpu|cuda|all]   (default all: meta and cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${PROFILE_OUT:-profiles}
what=${1:-all}
forge() { ${FORGE:-command forge} "$@"; }
if [ "$what" = cuda ]; then
  forge profile --zoo resnet50 --device cuda --dtype fp32 --budget 2 --top 10 --json "$out/resnet50.cuda.fp32.json"
  for m in resnet50 sd35-vae-decoder sd35-mmdit gemma4 qwen35; do
    forge profile --zoo "$m" --device cuda --dtype bf16 --budget 2 --top 10 --json "$out/$m.cuda.bf16.json"
  done
  exit 0
fi
if [ "$what" != cpu ]; then
for m in resnet50 sd35-mmdit sd35-vae-decoder gemma4 qwen35; do
  forge profile --zoo "$m" --device meta --dtype bf16 --top 10 --json "$out/$m.meta.bf16.json"
done
forge profile --zoo resnet50 --device meta --dtype fp32 --top 10 --json "$out/resnet50.meta.fp32.json"
fi
[ "$what" = meta ] && exit 0
forge profile --zoo resnet50 --batch 2 --top 10 --json "$out/resnet50.cpu.json"
forge profile --zoo sd35-mmdit --layers 2 --batch 1 --resolution 256 --seq 128 --top 10 --json "$out/sd35-mmdit.cpu.json"
forge profile --zoo sd35-vae-decoder --resolution 256 --top 10 --json "$out/sd35-vae-decoder.cpu.json"
forge profile --zoo gemma4 --layers 2 --seq 256 --top 10 --json "$out/gemma4.cpu.json"
forge profile --zoo qwen35 --layers 4 --seq 256 --top 10 --json "$out/qwen35.cpu.json"
