#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, with clang-14: coverage, ASan, UBSan) into build-fuzz/ and
# runs each for SECONDS_PER_TARGET (default 10: about a minute for all seven, what CI runs) over a copy
# of its seed corpus. Exits non-zero if any target crashes, leaks, hits UB, times out or runs out
# of memory; the input that did it is kept under build-fuzz/crashes/<target>/.
#
#   tools/fuzz.sh              # CI: 10 s per target
#   tools/fuzz.sh 600          # locally: 10 minutes per target
#   FUZZ_TARGETS="fuzz_frames" tools/fuzz.sh 300   # some targets only
#
# The working corpora (build-fuzz/corpus/<target>/) keep what earlier runs found, so repeated
# local runs build on each other; delete them to start from the seeds again.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-10}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: tools/fuzz.sh [SECONDS_PER_TARGET]" >&2
  exit 2
fi
build=build-fuzz
jobs=$(nproc)

for tool in clang-14 clang++-14; do
  if ! command -v "$tool" >/dev/null; then
    echo "fuzz: $tool not found (tools/install-deps.sh installs it)" >&2
    exit 1
  fi
done

start=$(date +%s)
if [ ! -f "$build/build.ninja" ]; then
  mkdir -p "$build"
  CC=clang-14 CXX=clang++-14 cmake -S fuzz -B "$build" -G Ninja >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; exit 1; }
fi
cmake --build "$build" -j "$jobs"
echo "fuzz: built in $(($(date +%s) - start)) s"

# Stack traces with UBSan reports too (ASan prints them anyway).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
targets=${FUZZ_TARGETS:-$(cat "$build/fuzz_targets.txt")}
mkdir -p "$build/logs"
failed=()
for target in $targets; do
  corpus="$build/corpus/$target"
  crashes="$build/crashes/$target"
  log="$build/logs/$target.log"
  mkdir -p "$corpus" "$crashes"
  if [ -d "fuzz/corpus/$target" ]; then
    cp -n fuzz/corpus/"$target"/* "$corpus"/ 2>/dev/null || true
  else
    echo "fuzz: $target has no seeds (fuzz/corpus/$target/): starting from nothing"
  fi
  seeds=$(find "$corpus" -type f | wc -l)
  dict=()
  if [ -f "fuzz/dicts/$target.dict" ]; then dict=(-dict="fuzz/dicts/$target.dict"); fi
  before=$(find "$crashes" -type f | sort)
  echo "fuzz: $target for ${seconds} s over $seeds inputs ..."
  rc=0
  "$build/$target" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$crashes/" -print_final_stats=1 "${dict[@]}" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 | sed -E 's/^#[0-9]+[[:space:]]+[A-Z]+[[:space:]]+//' ||
    true)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz: $target ok: ${runs:-?} runs; $last"
    continue
  fi
  failed+=("$target")
  echo "fuzz: $target FAILED (exit $rc); the end of $log:"
  tail -n 60 "$log" | sed 's/^/    /'
  new=$(comm -13 <(echo "$before") <(find "$crashes" -type f | sort) | sed '/^$/d')
  for input in $new; do
    echo "fuzz: $target: input kept as $input (reproduce: $build/$target $input)"
  done
done

echo "fuzz: ${#failed[@]} of $(echo $targets | wc -w) targets failed; $(($(date +%s) - start)) s in all"
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: failed: ${failed[*]}"
  exit 1
fi
