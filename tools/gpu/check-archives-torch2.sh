#!/usr/bin/env bash
# Do archives exported with Debian's torch 1.13 (tests/data/archives) load and run in libtorch
# 2.x, the GPU build's? Downloads pip's torch wheel (~530 MB, once, into WORK), builds
# tools/gpu/archive_check.cc against its headers and libtorch_cpu (no GPU needed), and runs the
# committed archives on their recorded input: gates must fire and outputs match Python's.
#   tools/gpu/check-archives-torch2.sh [WORK=/tmp/pswitch-torch2-archives]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="${1:-/tmp/pswitch-torch2-archives}"
version="${PSWITCH_TORCH2_VERSION:-2.11.0}"
mkdir -p "$work"
cd "$work"
wheel=$(ls torch-"$version"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  /usr/bin/python3 -m pip download --quiet "torch==$version" --no-deps -d "$work"
  wheel=$(ls torch-"$version"-*.whl | head -1)
fi
[ -f torch/lib/libtorch_cpu.so ] || unzip -q -o "$wheel" 'torch/lib/*' 'torch/include/*'
inc="$work/torch/include"
g++ -std=c++17 -O1 -I"$inc" -I"$inc/torch/csrc/api/include" "$repo/tools/gpu/archive_check.cc" \
  -o archive_check -Ltorch/lib -ltorch_cpu -lc10 -Wl,-rpath,"$work/torch/lib"
./archive_check "$repo/tests/data/archives/residual_cnn" "$repo/tests/data/archives/tiny_transformer" \
  "$repo/tests/data/archives/masked_classifier"
