#!/usr/bin/env bash
# On the device (issue 12): is FlashAttention 4 faster than cuDNN's attention on the reference models' shapes?
# benchmarks/fa4_pack.sh made .fa4a and .fa4b here; a call carries at most 64 MiB, so two calls, back to back
# (the machine is given back 30 s after a call, and /tmp goes with it):
#   1. bash benchmarks/h200_fa4.sh stage        carry [".fa4a"]: the compiler library into /tmp/fa4stage
#   2. bash benchmarks/h200_fa4.sh run          carry [".fa4b"]: the rest unpacked into /tmp/fa4site, then
#                                               benchmarks/sdpa_backends.py
# The wheels are unzipped, not installed with pip --target: three of them fill one top-level folder
# (nvidia_cutlass_dsl/), and pip --target keeps only the first wheel's.
# Writes $OUT/sdpa.json and $OUT/sdpa.log.
set -u -o pipefail
SITE=${FA4_SITE:-/tmp/fa4site}; STAGE=${FA4_STAGE:-/tmp/fa4stage}
case "${1:-run}" in
  stage)
    mkdir -p "$STAGE" && cp .fa4a/ir.path "$STAGE/" && xz -dc .fa4a/ir.so.xz >"$STAGE/ir.so.part" &&
      mv "$STAGE/ir.so.part" "$STAGE/ir.so" &&
      echo "staged $(du -sh "$STAGE" | cut -f1)"
    exit ;;
  run) ;;
  *) echo "usage: h200_fa4.sh stage|run" >&2; exit 2 ;;
esac
[ -s "$STAGE/ir.so" ] || { echo "the compiler library is not staged: run 'stage' first, on the same warm machine"; exit 3; }
rm -rf "$SITE" && mkdir -p "$SITE"
for w in .fa4b/*.whl .fa4b/cu13-rest.zip; do unzip -q -o "$w" -d "$SITE" || exit 1; done
xz -dc .fa4b/rt.so.xz >"$SITE/$(cat .fa4b/rt.path)" && cp "$STAGE/ir.so" "$SITE/$(cat "$STAGE/ir.path")" || exit 1
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages  # the .pth file pip would have read
. "$(dirname "$0")/h200_setup.sh"  # $OUT, the checkout on PYTHONPATH, the machine in $OUT/env.txt
python3 -c 'import flash_attn.cute.interface as f; print("flash_attn.cute from", f.__file__)' 2>&1 | tee -a "$OUT/env.txt"
timeout "${LIMIT:-400}" python3 benchmarks/sdpa_backends.py --json "$OUT/sdpa.json" 2>&1 | tee "$OUT/sdpa.log" | tail -n 12
