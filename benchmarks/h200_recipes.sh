#!/usr/bin/env bash
# Issue 5 on the device: the CUDA recipe tests, then the anchor searches (args: anchor names, or none for all).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # sqlalchemy (the store) is not on the device image
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export FORGE_CACHE=${FORGE_CACHE:-$(mktemp -d)}
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider -m cuda -o addopts="" tests/test_recipe_cuda.py -x 2>&1 | tail -30 \
    | tee "$OUT/pytest_recipes.txt"
fi
python3 benchmarks/anchors.py --json "$OUT/anchors.json" ${ANCHORS_ARGS:-} --only "$@" 2>&1 \
  | grep -v -i "warn" | tee "$OUT/anchors.txt"
