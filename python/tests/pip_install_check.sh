#!/usr/bin/env bash
# The package installs with pip (client-only CMake build, no network: --no-deps, no isolation)
# and its client works from the installed copy. Run by ctest (python_pip_install).
set -euo pipefail
python=${1:?usage: pip_install_check.sh PYTHON}
repo=$(cd "$(dirname "$0")/../.." && pwd)
target=$(mktemp -d /tmp/pswitch-pip-XXXXXX)
trap 'rm -rf "$target" "$repo/python/build" "$repo"/python/*.egg-info' EXIT
"$python" -m pip install --quiet --no-build-isolation --no-deps --target "$target" "$repo/python"
cd "$target"
PYTHONPATH="$target" "$python" - <<'PY'
import pswitch
assert pswitch.__file__.startswith(__import__("os").getcwd()), pswitch.__file__
try:
    pswitch.Client("127.0.0.1:1", timeout=5)
except pswitch.errors.UnavailableError as error:
    print("installed pswitch works:", error)
else:
    raise SystemExit("connecting to a closed port did not fail")
PY
