#!/usr/bin/env bash
# On the device: benchmarks/models.py for each job (eager, torch.compile default and reduce-overhead, and
# forge optimize's result, interleaved in one process), one model process at a time: two at once disturb
# launch-bound timings. Each under a time limit; JSON and log per job under $OUT.
#   usage: bash benchmarks/h200_models.sh MODEL:DTYPE[:extra,args] ...
#   e.g.   bash benchmarks/h200_models.sh resnet50:fp32 resnet50:bf16 gemma4:bf16:--seconds,200
# A model whose compilations do not fit one call (Qwen 3.5: forge ~440 s, torch.compile's default mode over 495 s)
# is measured one part a call, each with its own eager, merged by models.py --collect:
#   qwen35:bf16:--parts,forge   then   qwen35:bf16:--parts,compile   then   qwen35:bf16:--parts,compile_ro
# Each job's JSON and log are named MODEL.DTYPE[.extra args' letters]. A job stops itself 15 s before its limit
# (models.py --limit), saving a compilation still running as unfinished.
# Carry .whl (sqlalchemy for the store, diffusers for SD3.5; see h200_eval.sh). Env: LIMIT (seconds a job,
# default 560).
set -u
. "$(dirname "$0")/h200_setup.sh"
for job in "$@"; do
  IFS=: read -r model dtype extra <<<"$job"
  tag=${extra//[^a-z0-9_]/}
  name="$model.$dtype${tag:+.$tag}"
  timeout "${LIMIT:-560}" python3 benchmarks/models.py --device cuda --dtype "$dtype" --models "$model" \
    --limit $(( ${LIMIT:-560} - 15 )) --json "$OUT/$name.json" ${extra//,/ } >"$OUT/$name.log" 2>&1
  echo "$name exit $? ($(date +%T))"
  grep -E '^\|' "$OUT/$name.log" | tail -n 3
done
