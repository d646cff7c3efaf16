#!/bin/bash
# Checks the scheduler's loop-only state with clang's thread-safety analysis (-Wthread-safety):
# what only a GPU's event loop may touch is ABSL_GUARDED_BY its LoopRole (controller/event_loop.h),
# and the analysis proves every access holds it. GCC builds the project and ignores these
# annotations, so this compiles the annotated files once more with clang, syntax only, with the
# build's own flags (compile_commands.json). Usage: tools/thread_safety.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
clang=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$clang" ]; then
  echo "thread-safety: no clang++ (tools/install-deps.sh installs clang-14)" >&2
  exit 1
fi
files="controller/gpu_scheduler.cc controller/switcher.cc controller/bubble_monitor.cc controller/online_fill.cc"
python3 - "$build/compile_commands.json" "$clang" $files <<'PY'
import json, shlex, subprocess, sys
db, clang, files = sys.argv[1], sys.argv[2], sys.argv[3:]
entries = {e["file"]: e for e in json.load(open(db))}
failed = False
for f in files:
    e = next((v for k, v in entries.items() if k.endswith("/" + f)), None)
    if e is None:
        sys.exit(f"thread-safety: {f} is not in {db}")
    args = shlex.split(e["command"])[1:]
    keep, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):
            skip = True
            continue
        keep.append(a)
    # Only the analysis is asked for: GCC's warning set is the build's business.
    keep = [a for a in keep if not a.startswith("-W")]
    cmd = [clang, "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", *keep, e["file"]]
    r = subprocess.run(cmd, cwd=e["directory"], capture_output=True, text=True)
    if r.returncode != 0:
        failed = True
        print(r.stderr, file=sys.stderr)
    print(f"thread-safety: {f}: {'ok' if r.returncode == 0 else 'FAILED'}")
sys.exit(1 if failed else 0)
PY
