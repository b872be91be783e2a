#!/usr/bin/env bash
# Issue 5 on the device: the reference models end to end (benchmarks/models.py), one model process per GPU
# at a time, so a machine of two GPUs measures two models at once. Each model runs in its own process
# under a time limit; its JSON is written after every stage, so a model cut short keeps what it measured.
#   usage: bash benchmarks/h200_models.sh "GPU0 jobs" "GPU1 jobs" ...   a job: MODEL:DTYPE[:extra,args]
#   e.g.   bash benchmarks/h200_models.sh "resnet50:fp32 resnet50:bf16" "sd35-mmdit:bf16"
# Two lists at once share the host's CPU: a model that is compiling or exporting on one GPU slowed the other
# GPU's launch-bound forwards (ResNet-50 bf16 eager went from 4.84 to 8.38 ms), so for clean numbers time
# launch-bound models (ResNet-50, Gemma 4, Qwen 3.5) alone.
# Carry .whl (sqlalchemy for the store, diffusers for SD3.5; see h200_eval.sh). Env: LIMIT (seconds a
# model, default 540), BUDGET (candidates a model, 48), SEARCH_S (search seconds a model, 150), FIRST_GPU
# (the GPU of the first list, default 0).
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
gpu=${FIRST_GPU:-0}
for jobs in "$@"; do
  (
    for job in $jobs; do
      IFS=: read -r model dtype extra <<<"$job"
      name="$model.$dtype"
      # each GPU its own build cache and Inductor cache: the two processes never share a half-written file
      CUDA_VISIBLE_DEVICES=$gpu FORGE_CACHE=/tmp/forge-cache-$gpu TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$gpu \
        timeout "${LIMIT:-540}" python3 benchmarks/models.py --device cuda --dtype "$dtype" --models "$model" \
        --budget "${BUDGET:-48}" --seconds "${SEARCH_S:-150}" --json "$OUT/$name.json" ${extra//,/ } \
        >"$OUT/$name.log" 2>&1
      echo "$name exit $? ($(date +%T))" | tee -a "$OUT/status.txt"
    done
  ) &
  gpu=$((gpu + 1))
done
wait
tail -n 4 "$OUT"/*.log
