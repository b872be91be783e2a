#!/usr/bin/env bash
# Issue 18 item 3 on the device: the Triton recipe tests (interpreter, CPU tensors) and the export's Triton forms,
# then the seven anchors' Triton recipe candidates verified and timed against the CUDA recipes, eager and
# torch.compile (args: anchor names, or none for all). Writes $OUT/triton_recipes.{txt,json}.
# The device image lacks sqlalchemy and pyseccomp (the evaluator); fetch their wheels here into .whl/
# (ignored by git) and carry .whl:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     sqlalchemy==2.1.9 greenlet pyseccomp==0.1.2
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export FORGE_CACHE=${FORGE_CACHE:-$(mktemp -d)}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c \
  'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)'; } \
  2>&1 | tee "$OUT/env.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_recipe_triton.py 2>&1 | tail -15 \
    | tee "$OUT/pytest_triton.txt"
fi
python3 benchmarks/triton_recipes.py --json "$OUT/triton_recipes.json" ${TRITON_ARGS:-} --only "$@" 2>&1 \
  | grep -v -i "warn" | tee "$OUT/triton_recipes.txt"
