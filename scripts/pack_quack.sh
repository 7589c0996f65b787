#!/usr/bin/env bash
# Pack the `quack` extra (quack_dgated's QuACK and CuTe DSL wheels for Python 3.12, about 240 MB unpacked) for a
# machine without network: the unpacked wheels as one xz archive (about 60 MB, under one transfer to the H200
# machine), which scripts/h200_env.sh unpacks there. Usage (repo root, with network): bash scripts/pack_quack.sh
set -euo pipefail
work=$(mktemp -d)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d "$work/wheels" \
    quack-kernels==0.6.5 nvidia-cutlass-dsl==4.7.0 nvidia-cutlass-dsl-libs-base==4.7.0 \
    nvidia-cutlass-dsl-libs-core==4.7.0 nvidia-cutlass-dsl-libs-cu13==4.7.0 'apache-tvm-ffi>=0.1.6,<0.2'
# QuACK decides which of an epilogue's globals are external by whether their module's path contains
# "site-packages": unpacked anywhere else, every gemm_dgated fails to build its cache key.
mkdir -p "$work/site-packages" .quack
for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site-packages"; done
tar -C "$work" -cf - site-packages | xz --x86 --lzma2=preset=9e -T2 > .quack/site-packages.tar.xz
rm -rf "$work"
ls -l .quack/site-packages.tar.xz
