#!/usr/bin/env bash
# Downloads, on a Debian 12 (bookworm) machine with a package registry, the .debs that
# tools/gpu/build.sh unpacks on the GPU machine (which has no registry): the build dependencies
# pswitch takes from Debian that a CUDA + pip-torch machine lacks. libtorch is not among them:
# the GPU machine's pip torch provides it.
#
# Usage: tools/gpu/fetch-debs.sh [DIR]   (default tools/gpu/debs, gitignored)
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
dest="$(mkdir -p "${1:-$repo/tools/gpu/debs}" && cd "${1:-$repo/tools/gpu/debs}" && pwd)"

# Each with the packages it depends on, except the C/C++ runtime (libc6, libgcc-s1, libstdc++6),
# which the GPU machine has. Header-only: asio, nlohmann-json. Static: flatbuffers, gtest/gmock.
# Shared: abseil (Debian ships no static abseil), so the GPU machine runs bookworm's .so files.
packages=(
  libabsl-dev libabsl20220623
  libflatbuffers-dev libflatbuffers2 flatbuffers-compiler flatbuffers-compiler-dev
  libasio-dev
  libgtest-dev libgmock-dev googletest
  nlohmann-json3-dev
  # pswitchd's HTTP port: cpp-httplib is a compiled library built with OpenSSL, zlib and Brotli
  # support, so its header needs theirs; the runtime libraries the GPU machine may lack come too.
  # Boost.Beast (header-only) serves the HTTP port; cpp-httplib is the bench and test clients'.
  libboost1.74-dev libboost-dev
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 zlib1g-dev libbrotli-dev libbrotli1
  # GET /metrics: prometheus-cpp's headers and its core library (found by path, not its config).
  prometheus-cpp-dev libprometheus-cpp-core1.0
)

if ! command -v apt-get >/dev/null; then
  echo "fetch-debs: apt-get not found; run this on Debian 12 (bookworm)" >&2
  exit 1
fi
if [ -r /etc/os-release ] && ! grep -q '^VERSION_CODENAME=bookworm' /etc/os-release; then
  echo "fetch-debs: warning: not bookworm; build.sh expects bookworm's versions" >&2
fi

cd "$dest"
rm -f ./*.deb
# apt-get download fetches the candidate version without installing anything (no root needed).
if ! apt-get download "${packages[@]}"; then
  echo "fetch-debs: apt-get download failed; run 'sudo apt-get update' and retry" >&2
  exit 1
fi
# Epochs are URL-encoded in file names (libasio-dev_1%3a1.22...); keep names plain for copying.
for f in ./*%3a*.deb; do
  if [ -e "$f" ]; then mv "$f" "${f//%3a/_}"; fi
done
count=$(find . -maxdepth 1 -name '*.deb' | wc -l)
if [ "$count" -ne "${#packages[@]}" ]; then
  echo "fetch-debs: expected ${#packages[@]} .debs, got $count" >&2
  exit 1
fi
echo "fetch-debs: $count packages, $(du -sh . | cut -f1) in $dest"
echo "fetch-debs: next, on the GPU machine: tools/gpu/build.sh (carry tools/gpu/debs)"
