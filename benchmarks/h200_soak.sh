#!/usr/bin/env bash
# On the device (issue 13's soak on the GPU): benchmarks/soak.py on the CUDA corpus (BACKEND=triton for the
# Triton one), 1000 candidates by default, in parts: each call starts batches for PART_S seconds (default 420;
# the part is killed at LIMIT_S, default 560, to stay inside a device call) and leaves its database in runs/
# (kept between calls on a warm machine) and in $OUT. After the machine was released: copy the returned
# runs/soak-$BACKEND.db from the call's files into runs/ here and carry it. Exit: soak.py's (0 all as
# expected, 1 not, 3 not finished: call again; 124 killed at LIMIT_S, the database as the last batch left it).
# Env: BACKEND (cuda), N (1000), PART_S, LIMIT_S, SOAK_DB (runs/soak-$BACKEND.db). Carry .whl.
set -u
. "$(dirname "$0")/h200_setup.sh"
BACKEND=${BACKEND:-cuda}
DB=${SOAK_DB:-runs/soak-$BACKEND.db}
mkdir -p "$(dirname "$DB")"
export FORGE_CACHE=$(mktemp -d)
trap 'cp "$DB" "$OUT/" 2>/dev/null' EXIT
timeout "${LIMIT_S:-560}" python3 -u benchmarks/soak.py --device cuda --backend "$BACKEND" --n "${N:-1000}" \
  --db "$DB" --seconds "${PART_S:-420}" --json "$OUT/soak-$BACKEND.json" >"$OUT/soak-$BACKEND.log" 2>&1
rc=$?
echo "soak exit $rc ($(date +%T))"
tail -n 50 "$OUT/soak-$BACKEND.log"
exit $rc
