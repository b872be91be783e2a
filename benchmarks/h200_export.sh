#!/usr/bin/env bash
# Issue 18 on the device: a CUDA run of the RMSNorm + SwiGLU example exported with `forge export --format hf-kernels`,
# the export's own tests run, and the export loaded with the kernels package in a fresh process: kernelize swaps the
# RMSNorm in, outputs are compared with eager and the first call and the steady state are timed.
# Wheels: as benchmarks/h200_eval.sh says, plus the kernels package and what it needs beyond the image:
#   pip download kernels==0.19.1 huggingface_hub --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl
# and carry .whl. Not run yet: the CUDA path of the exported runtime (ctypes with the current stream) is untested.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export FORGE_CACHE=${FORGE_CACHE:-$(mktemp -d)}
DB="$OUT/forge.db"
python3 -m forge.cli optimize examples/rmsnorm_swiglu.py --device cuda --eval --seconds "${SECONDS_BUDGET:-120}" \
  --db "$DB" --out "$OUT/runs" 2>&1 | tail -12 | tee "$OUT/optimize.txt"
python3 -m forge.cli export last "$OUT/repo" --db "$DB" 2>&1 | tee "$OUT/export.txt" || exit 1
(cd "$OUT/repo" && python3 -m pytest -q -p no:cacheprovider -o addopts="" tests 2>&1 | tail -5) | tee "$OUT/export_tests.txt"
python3 - "$OUT/repo" <<'PY' 2>&1 | tee "$OUT/kernelize.txt"
import sys, time
from pathlib import Path
import torch
from kernels import LocalLayerRepository, Mode, get_local_kernel, kernelize, replace_kernel_forward_from_hub
from kernels import use_kernel_mapping
from forge.capture.model_input import load_file

repo = Path(sys.argv[1])
k = get_local_kernel(repo)
print("layers:", k.LAYERS)
torch.manual_seed(0)
loaded = load_file("examples/rmsnorm_swiglu.py", "cuda", eval=True)
model, (x,) = loaded.model, loaded.inputs
with torch.no_grad():
    want = model(x)
if "RMSNorm" in k.LAYERS:
    replace_kernel_forward_from_hub(type(model.norm), "RMSNorm")
    with use_kernel_mapping({"RMSNorm": {"cuda": LocalLayerRepository(repo, layer_name="RMSNorm")}}):
        model = kernelize(model, mode=Mode.INFERENCE, device="cuda")
with torch.no_grad():
    torch.cuda.synchronize(); t = time.perf_counter(); got = model(x); torch.cuda.synchronize()
    first = (time.perf_counter() - t) * 1e3
    for _ in range(10):
        model(x)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(100):
        model(x)
    torch.cuda.synchronize()
print(f"first call {first:.3f} ms, steady {(time.perf_counter() - t) * 10:.3f} ms; max abs err "
      f"{(got - want).abs().max().item():.2e}")
PY
