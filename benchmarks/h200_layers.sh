#!/usr/bin/env bash
# On the device (issues 13 and 18): the worker sandbox as it now is by default (a user id of its own per worker,
# Landlock, the network namespace and the seccomp filter) through the CUDA and Triton corpora, the sandbox and
# Landlock tests, the recipe kernels' throughput side by side with a baseline tree, then a real
# `forge optimize --policy recipes+helion` (the search-level Helion autotune) with what its store says.
#   BASE=.base/1358e3e bash benchmarks/h200_layers.sh
# BASE: a tree with forge/ and benchmarks/eval_throughput.py of the commit to compare with (made here with
# `git archive 1358e3e forge benchmarks/eval_throughput.py | tar -x -C .base/1358e3e`; carry .base and .whl).
# Env: TESTS_LIMIT (default 240 s), PAIRS (throughput pairs, default 2), HELION_S (optimize budget, default 300;
# 0 skips it), SKIP_TESTS=1. Logs in $OUT, few files: the device returns only a handful (at 53a1df0 the first
# throughput logs and the run folder's files were left out), so every throughput run appends to one log and
# the optimize run's folder is a temporary one.
set -u
. "$(dirname "$0")/h200_setup.sh"
export FORGE_CACHE=$(mktemp -d)
python3 benchmarks/worker_state.py 2>&1 | tail -n 2
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TESTS_LIMIT:-240}" python3 -u -m pytest -v -m cuda tests/test_corpus.py tests/test_sandbox.py \
    -p no:cacheprovider >"$OUT/corpus-cuda.log" 2>&1
  echo "cuda corpus and sandbox tests: exit $? ($(date +%T))"
  grep -E "passed|failed|^FAILED|^ERROR" "$OUT/corpus-cuda.log" | tail -n 20
  timeout 120 python3 -u -m pytest -v tests/test_landlock.py -p no:cacheprovider >"$OUT/landlock.log" 2>&1
  echo "landlock tests: exit $? ($(date +%T))"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/landlock.log" | tail -n 5
fi
rm -f "$OUT/tp.log"
for pair in $(seq "${PAIRS:-2}"); do
  FORGE_CACHE=$(mktemp -d) timeout 150 python3 benchmarks/eval_throughput.py --device cuda --n 54 --recipes \
    >"$OUT/tp.log" 2>&1
  echo "throughput head, pair $pair: exit $?"; grep -E '^\| [0-9]' "$OUT/tp.log"; cat "$OUT/tp.log" >>"$OUT/throughput.log"
  if [ -n "${BASE:-}" ]; then
    (cd "$BASE" && FORGE_CACHE=$(mktemp -d) PYTHONPATH=$PWD:${PYTHONPATH#*:} timeout 150 python3 \
      benchmarks/eval_throughput.py --device cuda --n 54 --recipes) >"$OUT/tp.log" 2>&1
    echo "throughput $BASE, pair $pair: exit $?"; grep -E '^\| [0-9]' "$OUT/tp.log"; cat "$OUT/tp.log" >>"$OUT/throughput.log"
  fi
done
rm -f "$OUT/tp.log"
# The autotune needs time: at the end of a task it gets half of what the search has left past its deadline, and
# runs only from 15 s a kernel (forge.search.tune.plan): a --seconds 120 run (53a1df0) left it none.
HELION_S=${HELION_S:-300}
[ "$HELION_S" = 0 ] && exit 0
timeout $((HELION_S + 150)) python3 -m forge.cli optimize examples/rmsnorm_swiglu.py --device cuda \
  --policy recipes+helion --seconds "$HELION_S" --no-inductor --db "sqlite:///$OUT/helion.db" --out "$(mktemp -d)" \
  --json "$OUT/helion.json" >"$OUT/helion-optimize.log" 2>&1
echo "optimize recipes+helion: exit $? ($(date +%T))"; tail -n 6 "$OUT/helion-optimize.log"
python3 - "$OUT/helion.db" <<'EOF'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for key, meta in db.execute("select key, meta from tasks"):
    print("task", key, "autotune:", json.dumps(json.loads(meta or "{}").get("autotune")))
for row in db.execute("select backend, status, count(*) from candidates group by backend, status"):
    print("candidates", *row)
EOF
