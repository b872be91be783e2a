#!/usr/bin/env bash
# Build time against build parallelism on the device (issue 3): eval_throughput at several pool sizes.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|Model name" | tee "$OUT/lscpu.txt"
for w in "$@"; do
  FORGE_CACHE=$(mktemp -d) python3 benchmarks/eval_throughput.py --device cuda --n 64 --build-workers "$w" 2>&1 \
    | grep -v -i warn | tee -a "$OUT/builds.txt"
done
