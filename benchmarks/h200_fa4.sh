#!/usr/bin/env bash
# On the device (issue 12): is FlashAttention 4 faster than cuDNN's attention on the reference models' shapes, and
# does forge's fa4-attention rewrite make a whole model faster?
# benchmarks/fa4_pack.sh made .fa4a and .fa4b here; a call carries at most 64 MiB, so the calls go back to back
# (the machine is given back 30 s after a call, and /tmp goes with it):
#   1. bash benchmarks/h200_fa4.sh stage        carry [".fa4a"]: the compiler library into /tmp/fa4stage
#   2. bash benchmarks/h200_fa4.sh sdpa         carry [".fa4b", ".whl"]: the rest unpacked into /tmp/fa4site, then
#                                               benchmarks/sdpa_backends.py ($OUT/sdpa.json, sdpa.log) and the
#                                               CUDA tests of fa4-attention ($OUT/fa4-tests.log); LIMIT (300 s)
#                                               and TEST_LIMIT (200 s) keep it under a call's 600
#   3. bash benchmarks/h200_fa4.sh models JOB.. carry [".whl"]: benchmarks/h200_models.sh JOB... with FlashAttention 4
#                                               importable, so that forge optimize also tries fa4-attention
#                                               (e.g. sd35-mmdit:bf16; LIMIT as h200_models.sh's)
# `sdpa` and `models` unpack into /tmp/fa4site when it is not there yet (then .fa4b must be carried).
# The wheels are unzipped, not installed with pip --target: three of them fill one top-level folder
# (nvidia_cutlass_dsl/), and pip --target keeps only the first wheel's.
set -u -o pipefail
SITE=${FA4_SITE:-/tmp/fa4site}; STAGE=${FA4_STAGE:-/tmp/fa4stage}
mode=${1:-sdpa}; shift || true
case "$mode" in
  stage)
    mkdir -p "$STAGE" && cp .fa4a/ir.path "$STAGE/" && xz -dc .fa4a/ir.so.xz >"$STAGE/ir.so.part" &&
      mv "$STAGE/ir.so.part" "$STAGE/ir.so" &&
      echo "staged $(du -sh "$STAGE" | cut -f1)"
    exit ;;
  sdpa) ;;
  models) [ $# -gt 0 ] || { echo "usage: h200_fa4.sh models MODEL:DTYPE[:extra,args] ..." >&2; exit 2; } ;;
  *) echo "usage: h200_fa4.sh stage|sdpa|models JOB..." >&2; exit 2 ;;
esac
# unpacked once a machine; again when the carried .fa4b differs from what filled the folder
have=$(cat "$SITE/.unpacked" 2>/dev/null); carried=$( [ -d .fa4b ] && (cd .fa4b && md5sum -- *) | md5sum )
if [ -z "$have" ] || { [ -n "$carried" ] && [ "$carried" != "$have" ]; }; then
  [ -s "$STAGE/ir.so" ] || { echo "the compiler library is not staged: run 'stage' first, on the same warm machine"; exit 3; }
  [ -n "$carried" ] || { echo "FlashAttention 4 is not unpacked on this machine: carry .fa4b"; exit 3; }
  rm -rf "$SITE" && mkdir -p "$SITE"
  for w in .fa4b/*.whl .fa4b/cu13-rest.zip; do python3 -m zipfile -e "$w" "$SITE" || exit 1; done  # no unzip there
  xz -dc .fa4b/rt.so.xz >"$SITE/$(cat .fa4b/rt.path)" && cp "$STAGE/ir.so" "$SITE/$(cat "$STAGE/ir.path")" || exit 1
  echo "$carried" >"$SITE/.unpacked"
fi
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}  # the .pth pip would read
if [ "$mode" = models ]; then
  exec bash "$(dirname "$0")/h200_models.sh" "$@"
fi
. "$(dirname "$0")/h200_setup.sh"  # $OUT, the checkout on PYTHONPATH, the machine in $OUT/env.txt
python3 -c 'import flash_attn.cute.interface as f; print("flash_attn.cute from", f.__file__)' 2>&1 | tee -a "$OUT/env.txt"
python3 -c 'import forge.runtime.rewrite_fa4 as r; print("fa4-attention offered:", r.available("cuda"))' 2>&1 |
  tee -a "$OUT/env.txt"
timeout "${LIMIT:-300}" python3 benchmarks/sdpa_backends.py --json "$OUT/sdpa.json" 2>&1 | tee "$OUT/sdpa.log" | tail -n 12
timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_rewrite_fa4.py \
  >"$OUT/fa4-tests.log" 2>&1; echo "fa4-attention CUDA tests: exit $?"; tail -n 3 "$OUT/fa4-tests.log"
