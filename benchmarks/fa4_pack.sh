#!/usr/bin/env bash
# Here (a machine with pip's network): FlashAttention 4 (`flash-attn-4`, CuTe DSL) and what it imports, packed for
# the device in two folders, each under the 64 MiB a call may carry: the CuTe DSL compiler library alone is
# 193 MB (92 MB as its wheel, 50 MB with xz), so it travels in a call of its own and waits on the warm machine
# for the next (benchmarks/h200_fa4.sh). Writes .fa4a/ (the compiler library, xz) and .fa4b/ (the other wheels,
# the toolkit wheel without that library, and its runtime library, xz); both ignored by git (.git/info/exclude).
#   bash benchmarks/fa4_pack.sh     # FA4_VERSION, CUTLASS_DSL_VERSION to change the pins
set -eu
FA4=${FA4_VERSION:-4.0.0b40}; DSL=${CUTLASS_DSL_VERSION:-4.8.1}
cd "$(dirname "$0")/.."
for d in /.fa4a/ /.fa4b/; do grep -qx "$d" .git/info/exclude || echo "$d" >>.git/info/exclude; done
rm -rf .fa4a .fa4b; mkdir -p .fa4a .fa4b
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --pre --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp" "flash-attn-4==$FA4" "nvidia-cutlass-dsl==$DSL" \
  "nvidia-cutlass-dsl-libs-base==$DSL" "nvidia-cutlass-dsl-libs-core==$DSL" \
  "nvidia-cutlass-dsl-libs-cu13==$DSL" apache-tvm-ffi==0.1.15.post2 \
  torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5
libs=$(ls "$tmp"/nvidia_cutlass_dsl_libs_cu13-*.whl)
mv $(ls "$tmp"/*.whl | grep -v nvidia_cutlass_dsl_libs_cu13) .fa4b/
mkdir "$tmp/cu13" && (cd "$tmp/cu13" && unzip -q "$libs")
ir=$(cd "$tmp/cu13" && ls nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.*.so)
rt=nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so
xz -9 -T2 -c "$tmp/cu13/$ir" >.fa4a/ir.so.xz && echo "$ir" >.fa4a/ir.path
xz -9 -T2 -c "$tmp/cu13/$rt" >.fa4b/rt.so.xz && echo "$rt" >.fa4b/rt.path
rm "$tmp/cu13/$ir" "$tmp/cu13/$rt"
(cd "$tmp/cu13" && zip -q -r "$OLDPWD/.fa4b/cu13-rest.zip" .)
du -sh .fa4a .fa4b
