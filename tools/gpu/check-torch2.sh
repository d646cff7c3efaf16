#!/usr/bin/env bash
# Compile-checks pswitch against pip's torch 2.x, the CUDA build the GPU machine runs: the libtorch
# code (models/, worker/, the libtorch tools) and the CUDA worker (worker/cuda/), which only
# builds against a CUDA libtorch. Compiles, never links: of the wheel only the headers and CMake
# files are unpacked (the libraries are ~1 GB), and zero-byte placeholders stand in for the
# libraries so TorchConfig.cmake configures. Fails when any checked file stops compiling.
#
# Usage: tools/gpu/check-torch2.sh [BUILD_DIR]   (default: build; works in BUILD_DIR/torch2)
# Environment:
#   PSWITCH_TORCH2_VERSION=2.11.0  the torch release to check against (the GPU machine's)
#   PSWITCH_TORCH2_CHECK=0         skip the check (e.g. offline)
# Needs the CUDA toolkit (/usr/local/cuda or CUDAToolkit_ROOT) and pip (python3 -m pip).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mkdir -p "${1:-$repo/build}/torch2" && cd "${1:-$repo/build}/torch2" && pwd)"
version="${PSWITCH_TORCH2_VERSION:-2.11.0}"
prefix="$work/torch-$version"
build="$work/build"
start=$SECONDS

say() { echo "check-torch2: $*"; }
die() {
  echo "check-torch2: error: $*" >&2
  exit 1
}

if [ "${PSWITCH_TORCH2_CHECK:-1}" = 0 ]; then
  say "skipped (PSWITCH_TORCH2_CHECK=0)"
  exit 0
fi
cuda_root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
[ -f "$cuda_root/include/cuda_runtime_api.h" ] ||
  die "no CUDA toolkit at $cuda_root (set CUDAToolkit_ROOT, or PSWITCH_TORCH2_CHECK=0 to skip)"

# --- torch headers, cached under $prefix ---
if [ ! -f "$prefix/.complete" ]; then
  rm -rf "$prefix" "$work/wheel"
  say "downloading torch==$version (the default PyPI wheel, a CUDA build)"
  python3 -m pip --version >/dev/null 2>&1 || die "pip is missing (apt-get install python3-pip)"
  # Downloads only; nothing is installed. --no-deps: the CUDA runtime wheels are not needed.
  if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --no-cache-dir \
    --dest "$work/wheel" "torch==$version"; then
    die "cannot download torch==$version from PyPI (PSWITCH_TORCH2_CHECK=0 skips this check)"
  fi
  python3 - "$work/wheel" "$prefix" <<'PY'
import os, sys, zipfile
wheel_dir, prefix = sys.argv[1], sys.argv[2]
(wheel,) = [os.path.join(wheel_dir, f) for f in os.listdir(wheel_dir) if f.endswith(".whl")]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if name.endswith("/"):
            continue
        if name.startswith(("torch/include/", "torch/share/cmake/")) or name == "torch/version.py":
            z.extract(info, prefix)
        elif name.startswith("torch/lib/") and ".so" in os.path.basename(name):
            # TorchConfig checks that the libraries exist; this prefix never links.
            path = os.path.join(prefix, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
PY
  grep -q "cuda: Optional\[str\] = '" "$prefix/torch/version.py" ||
    die "torch==$version from PyPI is not a CUDA build ($prefix/torch/version.py)"
  rm -rf "$work/wheel"
  touch "$prefix/.complete"
fi
say "torch $(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$prefix/torch/version.py") headers in $prefix"

# --- configure: the project itself, against that torch, compiled without optimisation ---
# CMAKE_OPTIMIZE_DEPENDENCIES lets a library's objects compile without first building the
# libraries it links (none are built here).
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=CompileCheck -DCMAKE_CXX_FLAGS="-O0 -g0" \
  -DCMAKE_OPTIMIZE_DEPENDENCIES=ON -DPSWITCH_CUDA=ON -DCUDAToolkit_ROOT="$cuda_root" \
  -DCMAKE_PREFIX_PATH="$prefix/torch/share/cmake" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; die "configure failed"; }
grep -q "libtorch $version.* CUDA worker ON" "$work/configure.log" ||
  { cat "$work/configure.log" >&2; die "configure did not select torch $version with the CUDA worker"; }

# --- compile: every object of the libtorch libraries, the CUDA worker and the libtorch tools ---
objects="$(ninja -C "$build" -t targets all | cut -d: -f1 |
  grep -E '^(models/CMakeFiles/pswitch_models|worker/CMakeFiles/(pswitch_worker|worker_cuda_test)|tools/CMakeFiles/(run-model|profile-model|pswitch-worker))\.dir/.*\.o$')"
grep -q 'cuda/cuda_lease_allocator\.cc\.o' <<<"$objects" || die "the CUDA worker objects are missing"
count="$(wc -l <<<"$objects")"
say "compiling $count files"
# Generated headers first (flatc): with the optimised dependencies, objects no longer wait for
# the targets that generate them.
generated="$(ninja -C "$build" -t targets all | grep -E '^[^/][^:]*\.(h|hpp|inc): CUSTOM_COMMAND$' |
  cut -d: -f1)"
if [ -n "$generated" ]; then
  # shellcheck disable=SC2086  # one path per word
  ninja -C "$build" $generated >/dev/null
fi
# shellcheck disable=SC2086  # one object path per word
ninja -C "$build" -k 0 $objects || die "pswitch does not compile against torch $version (above)"
say "OK: $count files compile against torch $version with the CUDA worker ($((SECONDS - start)) s)"
