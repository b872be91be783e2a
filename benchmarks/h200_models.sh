#!/usr/bin/env bash
# On the device: benchmarks/models.py for each job (eager, torch.compile default and reduce-overhead, and
# forge optimize's result, interleaved in one process), one model process at a time: two at once disturb
# launch-bound timings. Each under a time limit; JSON and log per job under $OUT.
#   usage: bash benchmarks/h200_models.sh MODEL:DTYPE[:extra,args] ...
#   e.g.   bash benchmarks/h200_models.sh resnet50:fp32 resnet50:bf16 gemma4:bf16:--seconds,200
# Carry .whl (sqlalchemy for the store, diffusers for SD3.5; see h200_eval.sh). Env: LIMIT (seconds a job,
# default 560).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; python3 -c \
  'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)'; } \
  2>&1 | tee "$OUT/env.txt"
for job in "$@"; do
  IFS=: read -r model dtype extra <<<"$job"
  name="$model.$dtype"
  timeout "${LIMIT:-560}" python3 benchmarks/models.py --device cuda --dtype "$dtype" --models "$model" \
    --json "$OUT/$name.json" ${extra//,/ } >"$OUT/$name.log" 2>&1
  echo "$name exit $? ($(date +%T))"
  grep -E '^\|' "$OUT/$name.log" | tail -n 3
done
