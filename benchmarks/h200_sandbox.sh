#!/usr/bin/env bash
# On the device (issue 13 item 2): CUDA workers under the sandbox CPU workers have, the default since 2026-12-06:
# FORGE_CUDA_SANDBOX=1 (a network namespace and, started by root, FORGE_WORKER_USER: the arena travels as a file
# descriptor, forge.evaluate.devmem) and
# FORGE_CUDA_SECCOMP=1 (the seccomp filter; Triton candidates then go to an unconfined worker of the worker's own). What it prints: the worker's
# state; the CUDA corpus with both on (every test passed); the Triton corpus with both on (its candidates judged
# by the unconfined worker, with the namespace); the recipe kernels' throughput off and on (on within 20% of off, the same statuses). Carry
# .whl. Env: TESTS_LIMIT (default 300 s per pytest run). Logs in $OUT.
set -u
. "$(dirname "$0")/h200_setup.sh"
export FORGE_CACHE=$(mktemp -d)
on() { FORGE_CUDA_SANDBOX=1 FORGE_CUDA_SECCOMP=${SECCOMP:-1} "$@"; }
on python3 benchmarks/worker_state.py 2>&1 | tail -n 2
on timeout "${TESTS_LIMIT:-300}" python3 -u -m pytest -v -m cuda tests/test_corpus.py -k "test_cuda_corpus or (namespace and not triton) or hands_python or gives_it_up" \
  -p no:cacheprovider >"$OUT/sandbox-cuda.log" 2>&1
echo "cuda corpus, sandbox and seccomp: exit $?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/sandbox-cuda.log" | tail -n 20
on timeout "${TESTS_LIMIT:-300}" python3 -u -m pytest -v -m cuda tests/test_corpus.py -k triton_corpus \
  -p no:cacheprovider >"$OUT/sandbox-triton.log" 2>&1
echo "triton corpus, sandbox and seccomp (judged by the unconfined worker): exit $?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/sandbox-triton.log" | tail -n 20
on timeout "${TESTS_LIMIT:-300}" python3 -u -m pytest -v -m cuda tests/test_sandbox.py -p no:cacheprovider \
  >"$OUT/sandbox-user.log" 2>&1
echo "a CUDA worker's user (forge's memory out of reach): exit $?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/sandbox-user.log" | tail -n 5
for mode in off on; do
  if [ $mode = on ]; then run=on; else run="env FORGE_CUDA_SANDBOX=0 FORGE_CUDA_SECCOMP=0"; fi
  $run timeout 150 python3 benchmarks/eval_throughput.py --device cuda --n 54 --recipes >"$OUT/throughput-$mode.log" 2>&1
  echo "throughput, sandbox $mode: exit $?"; tail -n 5 "$OUT/throughput-$mode.log"
done
