#!/usr/bin/env bash
# On the device: benchmarks/variants.py for each job, one model process at a time (launch-bound timings are
# disturbed by a second process), each under a time limit; JSON and log per job under $OUT.
#   usage: bash benchmarks/h200_variants.sh MODEL:DTYPE[:extra,args] ...
#   e.g.   bash benchmarks/h200_variants.sh resnet50:bf16:--freezing sd35-vae-decoder:bf16
# Carry .whl (sqlalchemy, diffusers: see h200_eval.sh). Env: LIMIT (seconds a job, default 150).
set -u
. "$(dirname "$0")/h200_setup.sh"
for job in "$@"; do
  IFS=: read -r model dtype extra <<<"$job"
  name="$model.$dtype"
  timeout "${LIMIT:-150}" python3 benchmarks/variants.py --device cuda --dtype "$dtype" --models "$model" \
    --json "$OUT/$name.json" ${extra//,/ } >"$OUT/$name.log" 2>&1
  echo "$name exit $? ($(date +%T))" | tee -a "$OUT/status.txt"
  grep -E '^\|' "$OUT/$name.log" | tail -n 14
done
