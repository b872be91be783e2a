#!/usr/bin/env bash
# On the device: benchmarks/kernelbench_optimize.py on KernelBench problem files (fetched into kb/, git-ignored,
# carried with the call: they are not part of forge), at their own (GPU) sizes. Rows are written after each
# file, so a call that runs out of time keeps the files it finished; each file's forge report, -v log and
# store are kept in $OUT/kb.tgz.
#   usage: bash benchmarks/h200_kernelbench.sh kb/level1/40_LayerNorm.py ...
# Carry .whl and kb. Env: LIMIT (seconds for the whole list, default 560), SECONDS_EACH (forge optimize's
# --seconds, default 40), TIMEOUT_EACH (default 120).
set -u
. "$(dirname "$0")/h200_setup.sh"
timeout "${LIMIT:-560}" python3 benchmarks/kernelbench_optimize.py --device cuda --seconds "${SECONDS_EACH:-40}" \
  --timeout "${TIMEOUT_EACH:-120}" --json "$OUT/kernelbench.json" --keep "$OUT/kb" "$@" >"$OUT/kernelbench.log" 2>&1
echo "kernelbench exit $? ($(date +%T))"
# one archive: a call brings back only a few files, and each file here leaves three
tar czf "$OUT/kb.tgz" -C "$OUT" kb && rm -r "$OUT/kb"
grep -vE "Warning|warnings.warn|return cls" "$OUT/kernelbench.log" | tail -n 30
