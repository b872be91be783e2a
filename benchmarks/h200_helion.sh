#!/usr/bin/env bash
# Issue 18 item 2 on the device: the Helion recipe and export tests, then the seven anchors' Helion recipe candidates
# verified and timed against the CUDA recipes, eager and torch.compile (args: anchor names, or none for all), then a
# recipes+helion run of the RMSNorm + SwiGLU example exported and its Helion forms called in a fresh process: Helion's
# autotuner is a tripwire there (an exported kernel runs its shipped config), and the first call (compile) and the
# steady state are timed. Writes $OUT/{env,pytest_helion,helion_recipes,optimize,export,first_call}.txt and
# $OUT/helion_recipes.json. HELION_ARGS="--autotune 30" also runs Helion's autotuner on each anchor's best Helion
# candidate (benchmarks/triton_recipes.py). Carry the helion wheels to try (below: the newest that works here is used).
# The image lacks helion and what it imports, and sqlalchemy and pyseccomp (the evaluator); fetch the wheels here
# into .whl/ (ignored by git; about 12 MB) and carry .whl:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     helion==1.5.0 rich markdown-it-py mdurl pygments psutil filecheck sqlalchemy==2.1.9 greenlet pyseccomp==0.1.2
#   and other releases to try in .whl/helion-try/ (out of the other scripts' .whl/*.whl):
#   for v in 1.5.1 1.4.0 1.2.0; do python3 -m pip download --no-deps -d .whl/helion-try helion==$v; done
# (numpy and typing-extensions come with the image's torch; helion's scikit-learn and SciPy, 45 MB, only feed its
# autotuner's surrogate models, imported if present: without them forge's autotune step runs Helion's PatternSearch.)
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v '/helion-') && export PYTHONPATH=/tmp/site || exit 1  # helion: picked below
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export FORGE_CACHE=${FORGE_CACHE:-$(mktemp -d)}
# Which Helion works with this machine's torch and Triton: each carried helion wheel, newest first, in its own
# folder, until one imports and runs a kernel (1.5.1 imports a name torch 2.11's Inductor lacks: IntelGPUError).
for whl in $(ls .whl/helion-*.whl .whl/helion-try/helion-*.whl 2>/dev/null | sed 's/.*helion-\([0-9.]*\)-.*/\1 &/' \
             | sort -V -r | cut -d' ' -f2); do
  dir=/tmp/helion-$(basename "$whl" .whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$dir" "$whl" || continue
  cat >/tmp/helion_probe.py <<'PY'  # a file, not stdin: Helion reads a kernel's source with inspect
import importlib.metadata as m
import torch, helion, helion.language as hl
@helion.kernel(config=helion.Config(block_sizes=[128]))
def add1(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(x.size(0)):
        out[tile] = x[tile] + 1
    return out
x = torch.randn(1000, device="cuda")
assert torch.equal(add1(x), x + 1)
print("helion", m.version("helion"), "works with torch", torch.__version__)
PY
  if PYTHONPATH=$dir:$PYTHONPATH timeout 120 python3 /tmp/helion_probe.py >>"$OUT/helion_versions.txt" 2>&1; then
    export PYTHONPATH=$dir:$PYTHONPATH; break
  fi
  echo "$(basename "$whl"): does not work here" >>"$OUT/helion_versions.txt"
done
cat "$OUT/helion_versions.txt" 2>/dev/null | grep -E "works|does not|Error" | tail -8
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c \
  'import importlib.metadata as m, torch, triton, helion, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, m.version("helion"))'; } \
  2>&1 | tee "$OUT/env.txt"
python3 -c 'import helion' || exit 1
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_recipe_helion.py tests/test_tilechecks.py \
    tests/test_export_helion.py tests/test_helion_autotune.py 2>&1 | tail -15 | tee "$OUT/pytest_helion.txt"
fi
python3 benchmarks/triton_recipes.py --backend helion --json "$OUT/helion_recipes.json" ${HELION_ARGS:-} --only "$@" \
  2>&1 | grep -v -i "warn" | tee "$OUT/helion_recipes.txt"
[ -n "${ONLY_RECIPES:-}" ] && exit 0  # the table alone (the optimize, export and first call below skipped)
DB="$OUT/forge.db"
python3 -m forge.cli optimize examples/rmsnorm_swiglu.py --device cuda --eval --policy recipes+helion \
  --seconds "${SECONDS_BUDGET:-180}" --db "$DB" --out "$OUT/runs" 2>&1 | tail -12 | tee "$OUT/optimize.txt"
python3 - "$DB" <<'PY' 2>&1 | tee "$OUT/autotune_meta.txt"  # what Helion's autotuner did at each task's end
import json, sqlite3, sys
for key, meta in sqlite3.connect(sys.argv[1]).execute("select key, meta from tasks"):
    print(key, json.dumps(json.loads(meta or "{}").get("autotune")))
PY
python3 -m forge.cli export last "$OUT/repo" --db "$DB" 2>&1 | tee "$OUT/export.txt" || exit 1
python3 benchmarks/helion_first_call.py "$OUT/repo/build/torch-universal" --json "$OUT/first_call.json" 2>&1 \
  | tee "$OUT/first_call.txt"
