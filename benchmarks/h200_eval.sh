#!/usr/bin/env bash
# Issue 3 on the device: the CUDA cheat corpus and the CUDA/Triton tests, then the evaluation throughput
# benchmark. Run from the repository root on the GPU machine; writes logs under $OUT (or ./out).
# The device image lacks sqlalchemy (the store) and diffusers (the SD3.5 zoo models): fetch their wheels here
# into .whl/ (ignored by git: add /.whl/ to .git/info/exclude) and name .whl in the run's carry:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     sqlalchemy==2.1.9 greenlet diffusers==0.42.1 importlib_metadata pyseccomp==0.1.2
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # sqlalchemy (the store), diffusers: not on the device image
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export FORGE_CACHE=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; python3 -c \
  'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)'; } \
  2>&1 | tee "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider -m cuda -o addopts="" --continue-on-collection-errors tests/ "$@" 2>&1 | tail -40 \
  | tee "$OUT/pytest_cuda.txt"  # every cuda-marked test (carry .whl for the store's sqlalchemy)
python3 benchmarks/eval_throughput.py --device cuda --n 64 2>&1 | tee "$OUT/eval_throughput.txt"
