#!/usr/bin/env bash
# On the device (issue 13's soak on the GPU): benchmarks/soak.py on the CUDA corpus (BACKEND=triton for the
# Triton one), 1000 candidates by default, in parts: each call runs the soak for PART_S seconds (default 480)
# and leaves its database in runs/ (kept between calls on a warm machine) and in $OUT; carry `runs/soak-*.db`
# back to go on after the machine was released. Exit 3 from soak.py: not finished, call again.
# Env: BACKEND (cuda), N (1000), PART_S (480), SOAK_DB (runs/soak-$BACKEND.db). Carry .whl.
set -u
. "$(dirname "$0")/h200_setup.sh"
BACKEND=${BACKEND:-cuda}
DB=${SOAK_DB:-runs/soak-$BACKEND.db}
mkdir -p "$(dirname "$DB")"
export FORGE_CACHE=$(mktemp -d)
python3 -u benchmarks/soak.py --device cuda --backend "$BACKEND" --n "${N:-1000}" --db "$DB" \
  --seconds "${PART_S:-480}" --json "$OUT/soak-$BACKEND.json" >"$OUT/soak-$BACKEND.log" 2>&1
rc=$?
echo "soak exit $rc ($(date +%T))"
cp "$DB" "$OUT/"
tail -n 50 "$OUT/soak-$BACKEND.log"
