#!/usr/bin/env bash
# On the device: the clock under a busy CPU (forge.bench.PAD_US, forge.evaluate.build.BUILD_NICE).
#   1. benchmarks/launch_path.py: eager RMSNorm and a one-op call timed by forge's clock with no load, with one
#      compiler loop a core at niceness 0 and at BUILD_NICE, each with the GPU pad and without it
#      ($OUT/launch_path.json, launch_path.log);
#   2. unless SKIP_TESTS=1, the clock's CUDA test and the CUDA cheat corpus (the cross-check holds the padded times to account);
#   3. with HELION_S > 0, the Helion autotune run of h200_layers.sh (forge optimize --policy recipes+helion), whose
#      store says how far each candidate's timing spread (carry .whl).
# FORGE_COMMIT names the commit measured (the device's copy of .git may be stale).
set -u
. "$(dirname "$0")/h200_setup.sh"
export FORGE_CACHE=$(mktemp -d)
timeout 200 python3 benchmarks/launch_path.py --device cuda --helion benchmarks/data/helion_silu_mul_*.py --json "$OUT/launch_path.json" 2>&1 | tee "$OUT/launch_path.log"
[ "${SKIP_TESTS:-0}" = 1 ] || timeout "${TESTS_LIMIT:-240}" python3 -u -m pytest -q -p no:cacheprovider -m cuda tests/test_clock_pad.py tests/test_corpus.py \
  >"$OUT/clock-tests.log" 2>&1
[ "${SKIP_TESTS:-0}" = 1 ] || { echo "clock test and CUDA corpus: exit $? ($(date +%T))"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/clock-tests.log" | tail -n 12; }
[ "${HELION_S:-0}" = 0 ] || SKIP_TESTS=1 PAIRS=0 bash "$(dirname "$0")/h200_layers.sh"
