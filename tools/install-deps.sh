#!/usr/bin/env bash
# Installs pswitch's build and test dependencies from Debian packages.
# Idempotent and non-interactive: packages already present are left alone.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libtorch-dev libasio-dev libflatbuffers-dev flatbuffers-compiler
  libabsl-dev libgtest-dev libgmock-dev nlohmann-json3-dev
  # pswitchd's HTTP/JSON port (Open Inference Protocol): Boost.Beast (header-only, in
  # libboost-dev) gives the limits a hostile network needs (docs/architecture.md); the C++ and
  # bench clients still use cpp-httplib.
  libboost-dev libcpp-httplib-dev
  # GET /metrics (prometheus-cpp's core; the package also brings its pull and push parts).
  prometheus-cpp-dev
  python3-torchvision python3-numpy
  # The Python package (python/): pybind11 bindings over the C++ client, tested with pytest.
  pybind11-dev python3-dev python3-pytest
  # tools/fuzz.sh: libFuzzer targets built with clang (libclang-rt-14-dev has libFuzzer and the
  # ASan/UBSan runtimes).
  clang-14 libclang-rt-14-dev
  # tools/gpu/check-torch2.sh downloads pip's torch 2.x headers (CUDA) to compile-check against.
  python3-pip
  # tests/tritonclient: PyPI's tritonclient[http] in a virtual environment (below).
  python3-venv
  # Debian's libtorch calls the system libblas.so.3; the reference BLAS is ~100x slower than
  # OpenBLAS on BERT's matrix products, so install OpenBLAS (it takes over the alternative).
  libopenblas0-pthread
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  echo "install-deps: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Triton's own client (tests/tritonclient drives pswitchd's shared-memory extension with it) is
# on PyPI only: a virtual environment of its own, on Debian's python3 with its system packages
# (numpy), where CMake looks for it (PSWITCH_TRITONCLIENT_VENV; the same default there). Set
# PSWITCH_SKIP_TRITONCLIENT=1 on a machine without PyPI: the test then reports SKIPPED.
venv=${PSWITCH_TRITONCLIENT_VENV:-${HOME}/.cache/pswitch/tritonclient-venv}
if [ "${PSWITCH_SKIP_TRITONCLIENT:-0}" = 1 ]; then
  echo "install-deps: tritonclient skipped (PSWITCH_SKIP_TRITONCLIENT=1)"
elif "$venv/bin/python" -c 'import tritonclient.http, tritonclient.utils.shared_memory' 2>/dev/null; then
  echo "install-deps: tritonclient present in $venv"
else
  echo "install-deps: installing tritonclient[http] into $venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'tritonclient[http]'
fi
