#!/usr/bin/env bash
# Builds pswitch with the CUDA backend and the CUDA worker on the GPU machine, then runs the
# tests. That machine has nvcc, CMake, Ninja and Python torch 2.x (a CUDA build) but no package
# registry: the other build dependencies are bookworm .debs fetched beforehand on a Debian machine
# (tools/gpu/fetch-debs.sh) and carried along, unpacked here into a prefix inside the repository.
# Nothing is installed system-wide.
#
# Usage: tools/gpu/build.sh [BUILD_DIR]        (default: build-gpu, gitignored)
# Environment:
#   PYTHON=python3           interpreter whose torch to build against
#   PSWITCH_GPU_TARGETS="a b" build only these targets (default: everything)
#   PSWITCH_GPU_TEST=0       build only; otherwise ctest runs after the build
#   PSWITCH_CTEST_ARGS="..." extra ctest arguments, e.g. "-R Cuda"
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(mkdir -p "${1:-$repo/build-gpu}" && cd "${1:-$repo/build-gpu}" && pwd)"
debs="$repo/tools/gpu/debs"
prefix="$repo/tools/gpu/prefix"
python="${PYTHON:-python3}"
jobs="$(nproc)"

die() {
  echo "build.sh: error: $*" >&2
  exit 1
}
say() { echo "build.sh: $*"; }

# --- tools ---
command -v cmake >/dev/null || die "cmake not found on PATH"
command -v ninja >/dev/null || die "ninja not found on PATH"
command -v c++ >/dev/null || die "no C++ compiler (c++) on PATH"
command -v "$python" >/dev/null || die "'$python' not found (set PYTHON=/path/to/python)"
cuda_root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
if [ ! -x "$cuda_root/bin/nvcc" ]; then
  command -v nvcc >/dev/null || die "nvcc not found in $cuda_root/bin or on PATH (set CUDAToolkit_ROOT)"
  cuda_root="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
fi
say "compiler: $(c++ --version | head -1); CUDA: $("$cuda_root/bin/nvcc" --version | tail -1)"

# --- torch ---
if ! torch_info="$("$python" -c 'import torch; print(torch.__version__); print(torch.version.cuda or ""); print(torch.utils.cmake_prefix_path)' 2>&1)"; then
  die "'$python' cannot import torch: $torch_info"
fi
torch_version="$(sed -n 1p <<<"$torch_info")"
torch_cuda="$(sed -n 2p <<<"$torch_info")"
torch_cmake="$(sed -n 3p <<<"$torch_info")"
[ -n "$torch_cuda" ] || die "torch $torch_version is a CPU-only build; the CUDA worker needs a CUDA build"
[ -f "$torch_cmake/Torch/TorchConfig.cmake" ] || die "no TorchConfig.cmake under $torch_cmake"
say "torch $torch_version (CUDA $torch_cuda) from $torch_cmake"

# --- bookworm dependencies, unpacked into $prefix ---
shopt -s nullglob
deb_files=("$debs"/*.deb)
shopt -u nullglob
[ ${#deb_files[@]} -gt 0 ] ||
  die "no .debs in $debs: run tools/gpu/fetch-debs.sh on a Debian 12 machine and bring tools/gpu/debs"
stamp="$prefix/.unpacked"
if [ ! -f "$stamp" ] || [ -n "$(find "$debs" -name '*.deb' -newer "$stamp")" ]; then
  rm -rf "$prefix"
  mkdir -p "$prefix"
  if command -v dpkg-deb >/dev/null; then
    for deb in "${deb_files[@]}"; do dpkg-deb -x "$deb" "$prefix"; done
  else
    "$python" "$repo/tools/gpu/unpack-debs.py" "$debs" "$prefix"
  fi
  touch "$stamp"
  say "unpacked ${#deb_files[@]} packages into $prefix"
fi
libdir="$prefix/usr/lib/x86_64-linux-gnu"
# bookworm's binaries (flatc, abseil's .so files) need glibc >= 2.34 and libstdc++ >= GCC 11.
if ! flatc_out="$("$prefix/usr/bin/flatc" --version 2>&1)"; then
  die "bookworm's flatc does not run here ($(ldd --version 2>&1 | head -1)): $flatc_out"
fi

# --- configure, build, test ---
# The binaries carry the prefix as DT_RPATH, not RUNPATH: only RPATH also serves the prefix's own
# libraries' dependencies (abseil's among themselves, cpp-httplib's Brotli), whoever starts them.
say "configuring in $build"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" -DPSWITCH_CUDA=ON \
  -DCUDAToolkit_ROOT="$cuda_root" \
  -DCMAKE_PREFIX_PATH="$prefix/usr;$libdir/cmake;$torch_cmake" \
  -DFLATC="$prefix/usr/bin/flatc" \
  -DPSWITCH_PYTHON_PACKAGE=OFF \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags \
  -DPSWITCH_PARITY_PYTHON="$(command -v "$python")" 2>&1 | tee "$build/configure.log"
grep -q 'CUDA backend ON' "$build/configure.log" || die "the CUDA backend is off (see $build/configure.log)"
grep -q 'CUDA worker ON' "$build/configure.log" ||
  die "the CUDA worker is off: CMake did not find a CUDA libtorch (see $build/configure.log)"

# shellcheck disable=SC2086  # PSWITCH_GPU_TARGETS is a list of target names
cmake --build "$build" -j "$jobs" ${PSWITCH_GPU_TARGETS:+--target $PSWITCH_GPU_TARGETS}
say "built in $build"
if [ "${PSWITCH_GPU_TEST:-1}" != 0 ]; then
  # shellcheck disable=SC2086
  ctest --test-dir "$build" --output-on-failure -j "$jobs" ${PSWITCH_CTEST_ARGS:-}
fi
