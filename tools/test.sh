#!/usr/bin/env bash
# Installs dependencies, builds everything (tests included) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${PSWITCH_CMAKE_ARGS:-}
cmake --build build -j "$jobs"
# The schedulers' loop-only state, checked by clang's thread-safety analysis (GCC ignores it).
tools/thread_safety.sh build
ctest --test-dir build --output-on-failure -j "$jobs" ${PSWITCH_CTEST_ARGS:-}
# The parsers of untrusted input under libFuzzer (ASan, UBSan), about a minute in all; a
# separate clang build in build-fuzz/ (no libtorch).
tools/fuzz.sh
# The GPU machine builds against pip's torch 2.x (CUDA): compile-check that code path too,
# including the CUDA worker, which this machine's CPU-only libtorch cannot build.
tools/gpu/check-torch2.sh build
