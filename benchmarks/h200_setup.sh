# Sourced by the h200_*.sh scripts on the device: $OUT, the carried wheels (.whl: sqlalchemy, diffusers; see
# h200_eval.sh) installed once into /tmp/site and put on PYTHONPATH (also on a warm machine that installed
# them in an earlier call), the checkout on PYTHONPATH, unbuffered Python, and the machine in $OUT/env.txt.
OUT=${OUT:-out}; mkdir -p "$OUT"
# The device's copy may carry a stale .git: rows name the commit measured only through FORGE_COMMIT.
[ -n "${FORGE_COMMIT:-}" ] || echo "warning: FORGE_COMMIT is not set; rows will name whatever .git the copy has" >&2
if ls .whl/*.whl >/dev/null 2>&1; then
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; python3 -c \
  'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)'; } \
  2>&1 | tee "$OUT/env.txt"
