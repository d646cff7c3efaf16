#!/usr/bin/env bash
# One-shot GPU validation: takes a bare GPU machine (nvcc, CMake, Ninja, Python with a CUDA
# torch, no package registry; tools/gpu/debs carried along) to a full set of results in two
# commands of under 10 minutes each.
#
# Usage:
#   tools/gpu/validate.sh build OUT    versions; configure + build (Release, all cores) into
#                                      build-gpu/, only the targets validation runs
#   tools/gpu/validate.sh run OUT      every validation step against that build
#   tools/gpu/validate.sh all OUT      both, in one command (where one command may take 20 min)
# The build folder survives between the two while the machine stays up; a `build` cut short by
# its time budget resumes where it stopped when called again. Every step runs under its own
# timeout, clipped to what is left of the phase's budget, and the script goes on when a step
# fails. OUT receives at most 5 flat files:
#   summary.md         the table of every step (result, seconds, figures), GPU memory per process
#                      and the bubble-filling figures; `run` repeats the build's rows
#   build.log          `build`: every step's full output
#   steps.log          `run`: every step's full output
#   gpu-memory.csv     `run`: nvidia-smi per-process GPU memory, sampled while pswitchd serves
#   artifacts.tar.gz   `run`: GPU profiles and plans, pipetrain JSON, daemon logs
# Steps and their timeouts in seconds, each clipped to what is left of the phase's budget less
# 20 s: `build`: versions (45), build (540: build.sh, the daemon and its worker), build-tools
# (540: the other targets, ninja -k 0), binaries (10). `run` (normal, quick): selfcheck (60, 60),
# ctest-cuda (100, 60), transfer (45, 30), vmm (90, 60: the arena in VMM chunks, issue 29 item 2),
# profile (90, 50), switch-resnet152, -inception_v3,
# -bert_base (105, 70 each), place (160, 110), place-resnet152, -inception_v3 (90, 60 each), dataplane (90, 60), register (200, 150), trace (480, 240),
# bubbles (210, 160: with online fill requests, issue 30 item 4), detect (120, 90: the main
# job making no bubble call, its bubbles found from its kernel launches by
# libpswitch_monitor.so and pswitchd --detect-bubbles, issue 30),
# sanitizer (75, 50), rest (120, 90), script (90, 60: your own model's archives through
# run-model and pswitchd on CUDA); a step reached after the budget is spent is recorded as
# SKIPPED.
#
# Environment:
#   PYTHON=python3                  interpreter with the CUDA torch
#   PSWITCH_VALIDATE_QUICK=1        fewer repeats and shorter timeouts (run: about 5 minutes)
#   PSWITCH_VALIDATE_STEPS="a b"    only these steps (names as in the summary table)
#   PSWITCH_VALIDATE_TARGETS="a b"  build only these targets (a short lease: the steps' own)
#   PSWITCH_VALIDATE_BUDGET_S=565   wall-clock budget of one phase (`all`: twice this)
#   PSWITCH_VALIDATE_TRACE_ARMS=…   trace: bench-trace's --arms instead of the mode's
#   PSWITCH_VALIDATE_FILL_FLAGS="…" bubbles: more pswitchd flags for its fill daemons
#   PSWITCH_VALIDATE_MAIN_ARGS="…"  bubbles: pipetrain's compute flags for the main job instead of
#                                   "--simulated-compute --fwd-ms=8 --bwd-ms=16"
set -uo pipefail

self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="$repo/build-gpu"
bin="$build/bin"
work="$build/validate"  # scratch kept with the build: plans, profiles, logs
python="${PYTHON:-python3}"
quick="${PSWITCH_VALIDATE_QUICK:-0}"
only="${PSWITCH_VALIDATE_STEPS:-}"
budget="${PSWITCH_VALIDATE_BUDGET_S:-565}"
reserve=20  # seconds kept back at the end of a phase: kill grace, summary, artifacts
models=(resnet152 inception_v3 bert_base)
default_targets="pswitchd pswitch-worker pswitchctl run-model profile-model find-grouping
  bench-transfer bench-switch bench-dataplane bench-register bench-trace pipetrain gpu_test
  memdaemon_ipc_test pswitch_monitor
  worker_cuda_test half_precision_e2e_test"
# shellcheck disable=SC2206  # a list of target names
targets=(${PSWITCH_VALIDATE_TARGETS:-$default_targets})
export PYTHONUNBUFFERED=1

say() { echo "validate: $*"; }

# ---------------------------------------------------------------------------------------------
# Step commands: each runs as its own process (`validate.sh _NAME ...`) under `timeout`, prints
# its headline figures as lines starting with "FIG ", and exits 77 to mean "skipped".
# ---------------------------------------------------------------------------------------------

need() {
  local b
  for b in "$@"; do
    if [ ! -x "$bin/$b" ]; then
      echo "SKIP: $bin/$b was not built"
      exit 77
    fi
  done
}

# gpu_query FIELDS: nvidia-smi's value(s) for the first GPU, no header.
gpu_query() { nvidia-smi --query-gpu="$1" --format=csv,noheader 2>/dev/null | head -1; }

nvcc_bin() {
  if command -v nvcc >/dev/null; then command -v nvcc; else echo /usr/local/cuda/bin/nvcc; fi
}

cmd_versions() {
  local gpu nvcc_version torch
  nvidia-smi
  local link=pcie.link.gen.max,pcie.link.width.max,pcie.link.gen.gpucurrent,pcie.link.width.current
  nvidia-smi --query-gpu="name,driver_version,memory.total,$link" --format=csv
  "$(nvcc_bin)" --version
  cmake --version | head -1
  ninja --version
  c++ --version | head -1
  nproc
  free -g
  torch="$("$python" -c 'import torch as t; print(t.__version__, "cuda", t.version.cuda, "cudnn",
    t.backends.cudnn.version(), "gpu", t.cuda.is_available())' 2>&1 | tail -1)"
  echo "torch: $torch"
  gpu="$(gpu_query name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max)"
  nvcc_version="$("$(nvcc_bin)" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "FIG GPU ${gpu:-none} (name, driver, memory, PCIe gen, width);" \
    "nvcc ${nvcc_version:-none}; torch ${torch}"
}

cmd_binaries() {
  local t present=() missing=()
  for t in "${targets[@]}"; do
    if [ -x "$bin/$t" ] || [ -x "$build/tests/$t" ] || [ -f "$build/lib/lib$t.so" ]; then
      present+=("$t")
    else
      missing+=("$t")
    fi
  done
  echo "FIG built: ${present[*]:-none}${missing[*]:+; MISSING: ${missing[*]}}"
  [ ${#missing[@]} -eq 0 ]
}

cmd_selfcheck() {
  need pswitchd pswitch-worker
  local log="$work/selfcheck.log" rc
  "$bin/pswitchd" --backend=cuda --listen=127.0.0.1:0 --http-listen=127.0.0.1:0 --exit-after-demo \
    --socket="/tmp/pswitch-validate-$$-selfcheck.sock" 2>"$log"
  rc=$?
  cat "$log"
  sed -n 's/.*event=started device="\([^"]*\)".*arena_bytes=\([0-9]*\).*/FIG device \1, arena \2 bytes/p' "$log"
  sed -n 's/.*event=self_check model=\([^ ]*\) .*latency_ms=\([0-9.]*\).*/FIG self-check \1: \2 ms/p' "$log"
  # Issue 29 item 2: each worker maps only its task's part of the arena (CUDA VMM).
  if grep -q 'arena_access_not_restricted\|arena_read_only_unsupported' "$log"; then
    echo "FIG workers' arena access: $(grep -o 'event=arena_[a-z_]*.*' "$log" | head -1 | cut -c1-200)"
  else
    echo "FIG workers' arena access: restricted to each task's grants"
  fi
  return "$rc"
}

cmd_ctest() {
  # OnTheGpu: the end-to-end tests that skip without a GPU (half precision's float16 model).
  local regex='Cuda|MemDaemonIpc|OnTheGpu' rc
  [ "$quick" = 1 ] && regex='Cuda|OnTheGpu'
  (cd "$build" && ctest --output-on-failure -R "$regex" --timeout 30) | tee "$work/ctest.out"
  rc=${PIPESTATUS[0]}
  grep -E 'tests passed' "$work/ctest.out" | sed 's/^/FIG ctest -R '"$regex"': /'
  # Issue 27: what clearing another owner's lease blocks costs on the device (cudaMemsetAsync).
  local lease_test="$build/tests/worker_cuda_test"
  if [ -x "$lease_test" ]; then
    "$lease_test" --gtest_filter='*ComeBackZeroedOnTheDevice*' 2>&1 | tee -a "$work/ctest.out" |
      grep -E '^lease clear' | sed 's/^/FIG /'
  fi
  return "$rc"
}

# bench-transfer, and its memcpy bandwidth against the link's peak (per direction, after the
# 128b/130b encoding: 0.985 GB/s per lane for PCIe 3, doubling with each generation).
cmd_transfer() {
  need bench-transfer
  local repeats=5 rc gen width
  [ "$quick" = 1 ] && repeats=3
  "$bin/bench-transfer" --backend=cuda --repeats="$repeats" | tee "$work/transfer.out"
  rc=${PIPESTATUS[0]}
  gen="$(gpu_query pcie.link.gen.max | tr -dc '0-9')"
  width="$(gpu_query pcie.link.width.max | tr -dc '0-9')"
  if ! grep -q '^FIG ' "$work/transfer.out"; then
    awk -v gen="${gen:-0}" -v width="${width:-0}" '
      /^baseline memcpy/ { gbs = $0; sub(/.*\(/, "", gbs); sub(/ GB\/s.*/, "", gbs) }
      /^(single|per-layer|20 groups) / {
        n = split($0, f, " +"); name = f[1]; if (name == "20") name = "20 groups"
        plans = plans sprintf(", %s first %s ms last %s ms", name, f[n - 2], f[n - 1])
      }
      END {
        lane = 0; if (gen >= 3) lane = 0.985 * 2 ^ (gen - 3); else if (gen > 0) lane = 0.25 * gen
        peak = lane * width
        if (gbs == "") exit
        if (peak > 0)
          printf "FIG transfer: memcpy H2D %s GB/s = %.0f%% of PCIe %d x%d peak %.1f GB/s%s\n",
            gbs, 100 * gbs / peak, gen, width, peak, plans
        else printf "FIG transfer: memcpy H2D %s GB/s (link unknown)%s\n", gbs, plans
      }' "$work/transfer.out"
  fi
  # Issue 28: a half-precision model's transmission against float32's, same run.
  awk '/^half precision/ { sub(/^half precision /, ""); print "FIG transfer half precision " $0 }' \
    "$work/transfer.out"
  return "$rc"
}

# --- vmm: issue 29 item 2 on CUDA, the arena in VMM chunks (pswitchd --cuda-vmm-arena, off by
# default until this passes): its CUDA tests, the start-up self-check with every worker mapping
# only its grants, and what a grant costs against the region's copy (bench-transfer) ---
cmd_vmm() {
  need pswitchd pswitch-worker
  local log="$work/vmm-selfcheck.log" rc=0
  if [ -x "$build/tests/gpu_test" ]; then
    "$build/tests/gpu_test" --gtest_filter='CudaVmm*' 2>&1 | tee "$work/vmm-tests.out" | tail -20
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    grep -E '^\[  (PASSED|FAILED) ' "$work/vmm-tests.out" | sed 's/^/FIG vmm tests: /'
  fi
  "$bin/pswitchd" --backend=cuda --cuda-vmm-arena --listen=127.0.0.1:0 --http-listen=127.0.0.1:0 \
    --exit-after-demo --socket="/tmp/pswitch-validate-$$-vmm.sock" 2>"$log" || rc=1
  tail -20 "$log"
  sed -n 's/.*event=started .*arena_bytes=\([0-9]*\) arena_create_ms=\([0-9.]*\) arena_access_unit=\([0-9]*\).*/FIG vmm arena: \1 bytes made in \2 ms, access unit \3 bytes/p' "$log"
  sed -n 's/.*event=self_check model=\([^ ]*\) .*latency_ms=\([0-9.]*\).*/FIG vmm self-check \1: \2 ms/p' "$log"
  if grep -q 'event=arena_' "$log"; then
    echo "FIG vmm workers: $(grep -o 'event=arena_[a-z_]*.*' "$log" | head -1 | cut -c1-200)"
  fi
  if [ -x "$bin/bench-transfer" ]; then
    "$bin/bench-transfer" --backend=cuda --cuda_vmm_arena --repeats=3 2>&1 |
      tee "$work/vmm-transfer.out" | grep -E '^FIG arena-access|per-task arena' | sed 's/^FIG //;s/^/FIG vmm /'
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  fi
  return "$rc"
}

# profile-model on the GPU (per-layer compute, H2D bandwidth) and find-grouping's optimal plan
# beside one group and per-layer groups, for each model at batch 8; bench-switch uses the plans.
cmd_profile() {
  need profile-model find-grouping
  local runs=10 m rc=0
  [ "$quick" = 1 ] && runs=3
  for m in "${models[@]}"; do
    rm -f "$work/$m.plan.json"
    if ! "$bin/profile-model" --model="$m" --batch=8 --device=cuda --runs="$runs" --warmup=2 \
      --out="$work/$m.profile.json"; then
      rc=1
      continue
    fi
    if ! "$bin/find-grouping" --profile "$work/$m.profile.json" --out "$work/$m.plan.json"; then
      rc=1
      continue
    fi
    "$bin/find-grouping" --profile "$work/$m.profile.json" --algorithm single \
      --out "$work/$m.single.json"
    "$bin/find-grouping" --profile "$work/$m.profile.json" --algorithm per-layer \
      --out "$work/$m.per-layer.json"
    "$python" - "$m" "$work/$m" <<'PY' || rc=1
import json, sys
m, base = sys.argv[1], sys.argv[2]
profile, plan = json.load(open(base + ".profile.json")), json.load(open(base + ".plan.json"))
def total_ms(kind):
    try:
        return f"{1e3 * json.load(open(f'{base}.{kind}.json'))['total_s']:.2f} ms"
    except (OSError, ValueError, KeyError):
        return "n/a"
layers = profile["layers"]
compute_ms = 1e3 * sum(l["exec_s"] for l in layers)
mb = sum(l["param_bytes"] for l in layers) / 1e6
print(f"FIG plan {m} b8: {len(layers)} layers, {mb:.0f} MB, compute {compute_ms:.2f} ms, "
      f"H2D {profile['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; optimal {len(plan['groups'])} groups "
      f"{1e3 * plan['total_s']:.2f} ms (search {1e3 * plan['search_s']:.1f} ms), one group "
      f"{total_ms('single')}, per-layer {total_ms('per-layer')}")
PY
  done
  return "$rc"
}

# Samples every GPU process's memory once a second into gpu-memory.csv, labelled `step`.
sample_memory() {
  local step="$1" t
  while true; do
    t="$(date +%s.%N)"
    {
      nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits
      # The device's total too: where processes are not listed (a container's PID namespace).
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sed 's/^/0, gpu-total, /'
    } 2>/dev/null | sed "s|^|$step,$t,|" >>"$out/gpu-memory.csv"
    sleep 1
  done
}

cmd_switch() {
  local m="$1" repeats=10 plan=() rc sampler
  need bench-switch pswitchd pswitch-worker run-model
  [ "$quick" = 1 ] && repeats=3
  # The GPU plan of the profile step; without one bench-switch profiles on the GPU itself.
  [ -s "$work/$m.plan.json" ] && plan=(--plan="$work/$m.plan.json"
    --profile="$work/$m.profile.json")
  sample_memory "switch-$m" &
  sampler=$!
  "$bin/bench-switch" --backend=cuda --model="$m" --batch=8 --repeats="$repeats" \
    --arena-bytes=$((8 << 30)) --placement=false ${plan[@]+"${plan[@]}"}
  rc=$?
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  return "$rc"
}

# --- place: issue 29, items 4 and 5. A ResNet-50 training task (batch 8) preempted by BERT-base
# batch-8 requests, four daemons in one run: a Stop that waits for the step's end and placement
# once the GPU is free (the baseline), a Stop that cuts the step at a layer, placement at
# arrival too (the copy starts while the trainer stops), and the same preemption of a resident
# model (the reference). Targets: the trainer stops within about
# one layer's compute; the copy starts at the Stop, not after the old tenant's answer. Then
# (item 6, two more daemons) a ResNet-50 trainer's way back after each preemption with its
# weights and momentum kept resident against copied to host memory and back (FIG resume) ---
cmd_place() {
  local repeats=10
  need bench-switch pswitchd pswitch-worker
  [ "$quick" = 1 ] && repeats=4
  "$bin/bench-switch" --backend=cuda --model=bert_base --trainer=resnet50 --batch=8 \
    --repeats="$repeats" --arena-bytes=$((8 << 30)) --rows=false --resume-trainer=resnet50
}

# --- place-resnet152, place-inception_v3: issue 29's switch target for the models whose copy
# compute can hide: a request copied at arrival within 1 ms of the same request on a resident
# (ready) model, a ResNet-50 trainer preempted in both (the placement table's last two arms) ---
cmd_place_model() {
  local m="$1" repeats=10 plan=()
  need bench-switch pswitchd pswitch-worker
  [ "$quick" = 1 ] && repeats=4
  # The profile step's GPU plan, where it ran (the daemon's own plan is profiled on its CPU).
  [ -s "$work/$m.plan.json" ] && plan=(--plan="$work/$m.plan.json")
  "$bin/bench-switch" --backend=cuda --model="$m" --trainer=resnet50 --batch=8 \
    --repeats="$repeats" --arena-bytes=$((8 << 30)) --rows=false --resume=false ${plan[@]+"${plan[@]}"}
}

# --- trace: the weights cache under a Poisson/Zipf trace (issue 29): 40 models (ResNets, BERT,
# archives), the cache with each policy at two sizes against --weights-cache=off and a warm
# reference, same run. Targets: models that fit: p99 <= 1.2x warm, no copy after a model's first
# request; a third fitting: misses within the cost model's bound, cost-aware hit rate >= LRU's ---
cmd_trace() {
  need bench-trace pswitchd pswitch-worker run-model
  # Each arm registers every model in a fresh pswitchd (about 2-3 s a model on the H100): quick
  # mode keeps 12 models and the arms the targets need.
  local requests=400 models=40 arms=warm,cost,lru,off,cost-third,lru-third,stop-and-start
  [ "$quick" = 1 ] && requests=200 models=12 arms=warm,cost,off,cost-third,lru-third
  arms="${PSWITCH_VALIDATE_TRACE_ARMS:-$arms}"
  "$bin/bench-trace" --backend=cuda --models="$models" --requests="$requests" --rate=40 \
    --arms="$arms" \
    --clients=4 --arena-bytes=$((40 << 30)) \
    --kinds=resnet50,resnet18,bert_base,archive:residual_cnn,resnet152,archive:tiny_transformer \
    | tee "$work/trace.out"
  return "${PIPESTATUS[0]}"
}

# --- dataplane: a request's tensors per data path (Unix area, Triton shm, TCP payload, HTTP
# binary, the framed baseline) on the CUDA backend, against memcpy in the same run (issue 26) ---
cmd_dataplane() {
  need bench-dataplane pswitchd pswitch-worker
  local requests=20
  [ "$quick" = 1 ] && requests=6
  "$bin/bench-dataplane" --backend=cuda --requests="$requests" \
    --archive="$repo/tests/data/archives/corner_probe.pswitch.pt" | tee "$work/dataplane.out"
  local rc=${PIPESTATUS[0]}
  # One figure per size and path: p50 ms, GB/s, ratio to memcpy + 0.2 ms, and where the C++
  # client's breakdown tells it, the first layer's start after the request's first byte (the
  # issue's target on CUDA: the input's host-to-device copy queued ahead of it, <= 0.5 ms).
  awk '$1 ~ /^[0-9.]+$/ && NF >= 5 { printf "FIG dataplane %s MB %s: p50 %s ms, %s GB/s%s%s\n", $1, $2, $3, $5, (NF >= 6 ? ", " $6 " x memcpy+0.2ms" : ""), (NF >= 9 && $9 != "-" ? ", first layer " $9 " ms after arrival" : "") }' \
    "$work/dataplane.out"
  return "$rc"
}

# --- register: registration time per phase (ResNet-152, BERT-base, an archive) against building
# the model and loading its checkpoint in a plain process, same run (issue 28: ResNet-152 <= 2 s
# on an H100) ---
cmd_register() {
  need bench-register pswitchd pswitch-worker
  local rounds=3
  [ "$quick" = 1 ] && rounds=1
  "$bin/bench-register" --backend=cuda --rounds="$rounds" | tee "$work/register.out"
  local rc=${PIPESTATUS[0]}
  awk 'NF == 13 && $1 != "model" { printf "FIG register %s: %s s (read %s, inspect %s, profile %s, plan %s, pin %s, load %s), baseline %s s, %s x\n", $1, $8, $2, $3, $4, $5, $6, $7, $9, $10 }' \
    "$work/register.out"
  # Where the inspect phase goes (pswitchd's inspection_step lines).
  awk '$1 == "inspection-step" {
      m = $2; sub(/-[0-9]+$/, "", m)
      if (!(m in seen)) { seen[m] = 1; models[++k] = m }
      if (!((m, $3) in c)) steps[m] = steps[m] " " $3
      c[m, $3]++; t[m, $3] += $4 }
    END { for (i = 1; i <= k; i++) {
        m = models[i]; ns = split(substr(steps[m], 2), s, " "); line = ""
        for (j = 1; j <= ns; j++) line = line (j > 1 ? ", " : "") s[j] " " sprintf("%.0f", t[m, s[j]] / c[m, s[j]])
        printf "FIG inspection %s (ms, mean over rounds; profile up to the facts arrival): %s\n", m, line } }' \
    "$work/register.out"
  # The standby inspector (on above) against a child started per registration, same machine.
  "$bin/bench-register" --backend=cuda --models=resnet152 --rounds="$rounds" \
    --inspector_standby=false | tee "$work/register-nostandby.out" || rc=1
  awk 'NF == 13 && $1 != "model" { printf "FIG register %s, inspector standby off: %s s (inspect %s)\n", $1, $8, $3 }' \
    "$work/register-nostandby.out"
  # A worker's build and bind by name against the two recordings it no longer runs per load.
  awk '$1 == "worker-load" { printf "FIG worker-load %s: bind %s s, recordings no longer run %s s\n", $2, $4, $6 }' \
    "$work/register.out"
  # The first request at the registered batch against the next (issue 28: within 10 % with
  # warm-ups), with warm-ups off as the baseline, same machine.
  local w
  for w in off on; do
    "$bin/bench-register" --backend=cuda --models=resnet152,bert_base --batch=8 --rounds="$rounds" \
      --warm-up="$w" | tee "$work/register-first-$w.out" || rc=1
    awk -v w="$w" 'NF == 13 && $1 != "model" { printf "FIG first-request %s batch 8, warm-up %s: first %s ms, next %s ms, %s x (load %s s)\n", $1, w, $11, $12, $13, $7 }' \
      "$work/register-first-$w.out"
  done
  # Half precision on the GPU (issue 28 item 5): float16 registration and serving at batch 8.
  "$bin/bench-register" --backend=cuda --models=resnet152,bert_base --batch=8 --rounds="$rounds" \
    --dtype=float16 | tee "$work/register-f16.out" || rc=1
  awk 'NF == 13 && $1 != "model" { printf "FIG register float16 %s batch 8: %s s (pin %s, load %s), first %s ms, next %s ms\n", $1, $8, $6, $7, $11, $12 }' \
    "$work/register-f16.out"
  return "$rc"
}

# --- rest: the HTTP port on CUDA (switches, /metrics, /v1/trace, unload), under Nsight Systems
# when the machine has it, whose NVTX summary then shows pswitch's own ranges ---
cmd_rest() {
  need pswitchd pswitch-worker
  local log="$work/rest.log" nsys="" prefix=() pid port rc=0
  nsys="$(command -v nsys || true)"
  for c in /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys; do
    if [ -z "$nsys" ] && [ -x "$c" ]; then nsys="$c"; fi
  done
  if [ -n "$nsys" ]; then
    prefix=("$nsys" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none
      --output="$work/rest" --force-overwrite=true)
  else
    echo "FIG no nsys on this machine: NVTX ranges not observed"
  fi
  "${prefix[@]}" "$bin/pswitchd" --backend=cuda --listen=127.0.0.1:0 --http-listen=127.0.0.1:0 \
    --preload=resnet18,tiny_cnn --arena-bytes=$((8 << 30)) \
    --socket="/tmp/pswitch-validate-$$-rest.sock" 2>"$log" &
  pid=$!
  port=""
  for _ in $(seq 1 600); do
    port="$(sed -n 's/.*event=started.* http_port=\([0-9]*\).*/\1/p' "$log" | head -1)"
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if [ -z "$port" ]; then
    tail -20 "$log"
    kill -KILL "$pid" 2>/dev/null
    return 1
  fi
  "$python" "$repo/tools/gpu/rest_check.py" "http://127.0.0.1:$port" "$work" || rc=$?
  # SIGTERM to pswitchd itself (under nsys, the profiler then writes its report).
  pkill -TERM -f -- "--socket=/tmp/pswitch-validate-$$-rest.sock" 2>/dev/null
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  grep -E 'event=(model_unload|workers_unload|worker_model_unloaded)' "$log" | head -5
  if [ -n "$nsys" ] && [ -f "$work/rest.nsys-rep" ]; then
    "$nsys" stats --report nvtx_sum --format csv --output - "$work/rest.nsys-rep" 2>&1 |
      tee "$work/nvtx.csv" | head -40
    echo "FIG NVTX ranges in the pswitch domain: $(grep -c 'pswitch' "$work/nvtx.csv" || true)" \
      "distinct names (of them: $(grep -oE '(copy group|group|infer|bubble)[^,]*' \
      "$work/nvtx.csv" | cut -d' ' -f1 | sort | uniq -c | tr '\n' ' '))"
  fi
  return "$rc"
}

cmd_sanitizer() {
  need bench-transfer
  local cs c
  cs="$(command -v compute-sanitizer || true)"
  for c in "$(dirname "$(nvcc_bin)")/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer; do
    if [ -z "$cs" ] && [ -x "$c" ]; then cs="$c"; fi
  done
  if [ -z "$cs" ]; then
    echo "SKIP: no compute-sanitizer"
    exit 77
  fi
  # One pipelined switch's transmission (group copies, ready flags, stream waits), smaller model.
  "$cs" --tool memcheck --error-exitcode 9 --print-limit 20 "$bin/bench-transfer" --backend=cuda \
    --repeats=1 --layers=40 --model-bytes=$((64 << 20)) 2>&1 | tee "$work/sanitizer.out"
  local rc=${PIPESTATUS[0]}
  grep -E 'ERROR SUMMARY' "$work/sanitizer.out" | tail -1 | sed 's/^=* */FIG memcheck bench-transfer: /'
  return "$rc"
}

# --- bubbles: the main job's stage 0 on this GPU, fill jobs switched in at its bubble starts ---

daemon_pid=""
daemon_port=""
daemon_http_port=""
sampler_pid=""
stop_daemon() {
  [ -n "$daemon_pid" ] || return 0
  kill -TERM "$daemon_pid" 2>/dev/null
  for _ in $(seq 1 40); do
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=""
}

# start_daemon LOG [FLAGS...]: pswitchd on the GPU (FLAGS added); sets daemon_pid, and daemon_port once it
# serves (empty when it did not start).
start_daemon() {
  local log="$1"
  shift
  daemon_port=""
  daemon_http_port=""
  "$bin/pswitchd" --backend=cuda --listen=127.0.0.1:0 --http-listen=127.0.0.1:0 --gpus=1 --preload= --standby-workers=1 \
    --arena-bytes=$((24 << 30)) --activation-bytes=$((6 << 30)) \
    --data-root="$work/bubbles" --socket="/tmp/pswitch-validate-$$-bubbles.sock" "$@" 2>"$log" &
  daemon_pid=$!
  for _ in $(seq 1 300); do
    if grep -q 'event=serving' "$log" 2>/dev/null; then
      daemon_port="$(sed -n 's/.*event=started.* port=\([0-9]*\).*/\1/p' "$log" | head -1)"
      daemon_http_port="$(sed -n 's/.*event=started.* http_port=\([0-9]*\).*/\1/p' "$log" | head -1)"
      break
    fi
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.3
  done
}

# Your own model on the GPU: the exported archives of tests/data/archives (made by Debian's torch
# 1.13) run once through run-model on CUDA, then are registered with a GPU-profiled plan, served
# through pswitchd (gates as stream waits) and trained; every output is checked against the
# Python output stored beside the archive.
script_cleanup() { stop_daemon; }
cmd_script() {
  need pswitchd pswitch-worker pswitchctl run-model
  local a="$repo/tests/data/archives" d="$work/script" m rc=0 ctl
  rm -rf "$d"
  mkdir -p "$d"
  trap script_cleanup EXIT
  compare() {  # compare OUT.safetensors EXPECTED.safetensors LABEL: max |diff| of key "output"
    "$python" - "$@" <<'PY'
import json, struct, sys, torch
def output(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    meta = json.loads(raw[8:8 + n])["output"]
    lo, hi = meta["data_offsets"]
    assert meta["dtype"] == "F32", meta
    return torch.frombuffer(bytearray(raw[8 + n + lo:8 + n + hi]), dtype=torch.float32).reshape(meta["shape"])
got, want = output(sys.argv[1]), output(sys.argv[2])
diff = (got - want).abs().max().item()
print(f"FIG {sys.argv[3]}: max |diff| vs Python {diff:.2e}")
sys.exit(0 if diff <= 1e-3 else 1)
PY
  }
  for m in residual_cnn tiny_transformer masked_classifier; do
    # The inputs alone (pswitchctl sends every tensor of its file).
    "$python" - "$a/$m.io.safetensors" "$d/$m.in.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
out_header, blobs, offset = {}, [], 0
for name, meta in header.items():
    if name in ("__metadata__", "output"):
        continue
    lo, hi = meta["data_offsets"]
    out_header[name] = dict(meta, data_offsets=[offset, offset + hi - lo])
    blobs.append(data[lo:hi])
    offset += hi - lo
text = json.dumps(out_header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
PY
    "$bin/run-model" --archive "$a/$m.pswitch.pt" --input "$d/$m.in.safetensors" \
      --output "$d/$m.run.safetensors" --device cuda || { rc=1; continue; }
    compare "$d/$m.run.safetensors" "$a/$m.io.safetensors" "$m run-model cuda" || rc=1
  done
  mkdir -p "$work/bubbles"  # the daemon's data root
  start_daemon "$d/pswitchd.log" --allow-client-paths=true
  if [ -z "$daemon_port" ]; then
    tail -20 "$d/pswitchd.log"
    return 1
  fi
  ctl=("$bin/pswitchctl" --server="127.0.0.1:$daemon_port")
  for m in residual_cnn tiny_transformer masked_classifier; do
    local t0=$SECONDS
    "${ctl[@]}" register --name "$m" --archive "$a/$m.pswitch.pt" --batch 2 --plan auto || { rc=1; continue; }
    echo "FIG $m registered with a GPU-profiled plan in $((SECONDS - t0)) s"
    local i
    for i in 1 2 3; do  # the first call loads the model; the others switch back to a warm one
      "${ctl[@]}" infer --name "$m" --input "$d/$m.in.safetensors" --output "$d/$m.serve$i.safetensors" \
        || { rc=1; continue; }
    done
    compare "$d/$m.serve3.safetensors" "$a/$m.io.safetensors" "$m served by pswitchd cuda" || rc=1
    "${ctl[@]}" train --name "$m" --iterations 5 --batch 2 || rc=1
  done
  "${ctl[@]}" models || true
  grep -E 'event=(model_registered|task_done|task_failed)' "$d/pswitchd.log" | tail -12
  return "$rc"
}

bubbles_cleanup() {
  stop_daemon
  if [ -n "$sampler_pid" ]; then
    kill "$sampler_pid" 2>/dev/null
    wait "$sampler_pid" 2>/dev/null
  fi
}

# Online fill (issue 30 item 4), in the bubbles step's daemon once its fill job is cancelled:
# BERT-base requests (batch 1, 128 tokens) sent one after another while the main job runs (with
# --server: it announces its bubbles), as online fill work (an objective of 200 ms) and as plain
# requests co-executing with it; each answer's latency as pswitchd measured it (arrival to
# answer) goes to online-<mode>.txt, a refusal to online-<mode>-refused.txt.
online_requests() {
  local d=$1 mode main
  shift
  local ctl=("$@")
  "${ctl[@]}" register --name bert-online --model bert_base --batch 1 >/dev/null ||
    { echo "online: bert_base did not register"; return 0; }
  "$python" - "$d/bert-one.safetensors" <<'PY'
import array, json, struct, sys
data = array.array("q", (1000 + (i * 7919) % 20000 for i in range(128))).tobytes()
header = json.dumps({"input": {"dtype": "I64", "shape": [1, 128], "data_offsets": [0, len(data)]}})
header += " " * ((8 - len(header) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header.encode() + data)
PY
  for mode in online co-exec; do
    local slo=()
    [ "$mode" = online ] && slo=(--online-slo-ms=200)
    : >"$d/online-$mode.txt"
    : >"$d/online-$mode-refused.txt"
    timeout 90 "$bin/pipetrain" "${main_args[@]}" --server="127.0.0.1:$daemon_port" \
      --json="$d/online-$mode.json" >"$d/online-$mode.out" 2>&1 &
    main=$!
    sleep 3  # its start-up and warm-up: the requests meet it iterating
    local failures=0
    while kill -0 "$main" 2>/dev/null && [ "$failures" -lt 5 ]; do
      if "${ctl[@]}" infer --name bert-online --input "$d/bert-one.safetensors" \
        --output "$d/bert-one-out.safetensors" ${slo[@]+"${slo[@]}"} >"$d/online-last.txt" 2>&1; then
        failures=0
      elif grep -q DEADLINE_EXCEEDED "$d/online-last.txt"; then
        echo 1 >>"$d/online-$mode-refused.txt"
      else
        failures=$((failures + 1))
        cat "$d/online-last.txt"
        sleep 0.2
      fi
      sed -n 's/^task [0-9]*: latency \([0-9.]*\) ms.*/\1/p' "$d/online-last.txt" \
        >>"$d/online-$mode.txt"
    done
    wait "$main" || { echo "online: pipetrain ($mode) failed:"; tail -5 "$d/online-$mode.out"; }
  done
}

online_figures() {
  "$python" - "$1" <<'PY'
import json, statistics, sys
d = sys.argv[1]
def lat(mode):
    try:
        return sorted(float(x) for x in open(f"{d}/online-{mode}.txt").read().split())
    except OSError:
        return []
def refused(mode):
    try:
        return len(open(f"{d}/online-{mode}-refused.txt").read().split())
    except OSError:
        return 0
def pct(v, p):
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else float("nan")
def iteration(mode):
    try:
        walls = [it["wall_ms"] for it in json.load(open(f"{d}/online-{mode}.json"))["iterations"]
                 if not it.get("warmup")]
        return statistics.median(walls)
    except (OSError, ValueError, KeyError, statistics.StatisticsError):
        return float("nan")
on, co = lat("online"), lat("co-exec")
if not on or not co:
    print("FIG online bert_base b1: no requests answered (see online-*.txt)")
    sys.exit(0)
ratio = pct(on, 95) / pct(co, 95)
print(f"FIG online bert_base b1: online p50 {pct(on, 50):.2f} p95 {pct(on, 95):.2f} ms "
      f"({len(on)} served, {refused('online')} refused; objective 200 ms), co-execution p50 "
      f"{pct(co, 50):.2f} p95 {pct(co, 95):.2f} ms ({len(co)}); p95 ratio {ratio:.2f} (target "
      f"<= 0.33: {'met' if ratio <= 1 / 3 else 'NOT met'}); main job iteration "
      f"{iteration('online'):.2f} ms online, {iteration('co-exec'):.2f} ms co-executing")
PY
}

# bubble_use KIND TRACE: where the bubble time went, by the bubbles' length: how many, their time
# and the share of it the resident fill run completed steps in (the trace's "bubbles" track, whose
# events carry fill_ms), from the daemon started last.
bubble_use() {
  [ -n "${daemon_http_port:-}" ] || return 0
  "$bin/pswitchctl" trace --http="127.0.0.1:$daemon_http_port" --seconds=600 --out="$2" \
    >/dev/null || { echo "no trace: bubble use not shown"; return 0; }
  "$python" - "$2" "$1" <<'PY'
import json, sys
trace, kind = json.load(open(sys.argv[1])), sys.argv[2]
classes = [(0, 5), (5, 15), (15, 30), (30, 60), (60, float("inf"))]
rows = {c: [0, 0.0, 0.0, 0] for c in classes}  # bubbles, ms, fill ms, with no use known
for e in trace["traceEvents"]:
    if e.get("cat") != "bubble" or e.get("ph") != "X" or e.get("pid") != 0:
        continue
    ms = e["dur"] / 1e3
    row = next(rows[c] for c in classes if c[0] <= ms < c[1])
    row[0] += 1
    row[1] += ms
    fill = e.get("args", {}).get("fill_ms")
    if fill is None:
        row[3] += 1
    else:
        row[2] += float(fill)
parts = []
for (lo, hi), (n, ms, fill, unknown) in rows.items():
    if n:
        span = f"{lo}-{hi:g} ms" if hi != float("inf") else f">= {lo} ms"
        parts.append(f"{span}: {n} bubbles, {ms:.0f} ms, {100 * fill / ms:.1f} % used"
                     + (f" ({unknown} with no use known)" if unknown else ""))
print(f"FIG bubble use {kind} by length: " + ("; ".join(parts) if parts else "no bubbles traced"))
PY
}

cmd_bubbles() {
  need pswitchd pswitch-worker pipetrain pswitchctl
  local d="$work/bubbles" rounds=2 iters=20 fwd=8 bwd=16 mb=8 stages=4
  [ "$quick" = 1 ] && rounds=1 iters=10
  local free=$((8 << 30))
  rm -rf "$d"
  mkdir -p "$d"
  trap bubbles_cleanup EXIT
  sample_memory bubbles &
  sampler_pid=$!
  # The main job: stage 0 computes its GPT-2 stage on this GPU; the other stages simulate theirs
  # (timed waits at their profiled costs), so the GPU really idles in stage 0's bubbles and only
  # fill work runs on it then. 24 layers give bubbles of about 30 ms on the H100, so a ResNet-50
  # training step at batch 8 (15 ms) fits one (8 layers: 10 ms, and only the first, declared
  # bubble ran a step). PSWITCH_VALIDATE_MAIN_ARGS replaces these flags.
  local mode_args
  read -r -a mode_args <<<"${PSWITCH_VALIDATE_MAIN_ARGS:---simulated-compute --real-stages=0 --device=cuda --n-layer=24 --n-embd=1024 --n-head=16 --seq-len=256 --microbatch-size=8}"
  local main_args=(--stages="$stages" --microbatches="$mb" --schedule=gpipe --warmup=3
    --iterations="$iters" --bubble-free-bytes="$free" "${mode_args[@]}")
  echo "main job: pipetrain ${main_args[*]}"
  # A first guess at stage 0's GPipe cycle, so the fill job can be placed before the main job
  # starts: forward M*f, one bubble of (S-1)(f+b), backward; period (M+S-1)(f+b). pipetrain
  # replaces it with the cycle it measures over its warm-up.
  local us=1000000
  printf '{"period_ns": %d, "bubbles": [{"offset_ns": %d, "duration_ns": %d, "free_bytes": %d}]}\n' \
    $(((mb + stages - 1) * (fwd + bwd) * us)) $((mb * fwd * us)) $(((stages - 1) * (fwd + bwd) * us)) \
    "$free" >"$d/cycle.json"
  # BERT-base's dataset: token ids, 128 per row.
  "$python" - "$d/bert-dataset.safetensors" 4096 <<'PY'
import array, json, struct, sys
path, rows, seq = sys.argv[1], int(sys.argv[2]), 128
data = array.array("q", (1000 + (i * 7919) % 20000 for i in range(rows * seq))).tobytes()
header = json.dumps({"input": {"dtype": "I64", "shape": [rows, seq], "data_offsets": [0, len(data)]}})
header += " " * ((8 - len(header) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header.encode() + data)
PY

  local kind job ctl r
  # PSWITCH_VALIDATE_FILL_FLAGS: more pswitchd flags for the fill daemons (e.g.
  # --fill-resident-runs=false, one Run message per bubble, to compare).
  local fill_flags
  read -r -a fill_flags <<<"${PSWITCH_VALIDATE_FILL_FLAGS:-}"
  for kind in resnet50-training bert_base-inference; do
    echo "=== $kind"
    start_daemon "$d/pswitchd-$kind.log" "${fill_flags[@]}"
    if [ -z "$daemon_port" ]; then
      echo "pswitchd did not start:"
      tail -20 "$d/pswitchd-$kind.log"
      stop_daemon
      continue
    fi
    ctl=("$bin/pswitchctl" --server="127.0.0.1:$daemon_port" --timeout-s=60)
    "${ctl[@]}" bubble-cycle --gpu 0 --cycle "$d/cycle.json"
    if [ "$kind" = resnet50-training ]; then
      job="$("${ctl[@]}" fill submit --kind training --model resnet50 --batch 8 --steps 1000000 \
        --step-us 20000 --memory-bytes $((5 << 30)))"
    else
      job="$("${ctl[@]}" fill submit --kind inference --model bert_base --batch 8 \
        --dataset bert-dataset.safetensors --output bert-output.safetensors \
        --step-us 10000 --memory-bytes $((2 << 30)))"
    fi
    echo "$job"
    job="$(sed -n 's/^fill job \([0-9]*\) .*/\1/p' <<<"$job")"
    if [ -z "$job" ]; then
      stop_daemon
      continue
    fi
    # Its model is registered (CREATED -> PAUSED) before the main job starts.
    for _ in $(seq 1 120); do
      "${ctl[@]}" fill status "$job" | grep -qE 'state=(PAUSED|STOPPED)' && break
      sleep 0.5
    done
    "${ctl[@]}" fill status "$job"
    for r in $(seq 1 "$rounds"); do
      timeout 90 "$bin/pipetrain" "${main_args[@]}" --json="$d/$kind-alone-$r.json" \
        >"$d/$kind-alone-$r.out" 2>&1 ||
        { echo "pipetrain alone failed:"; tail -5 "$d/$kind-alone-$r.out"; }
      timeout 90 "$bin/pipetrain" "${main_args[@]}" --server="127.0.0.1:$daemon_port" \
        --json="$d/$kind-fill-$r.json" >"$d/$kind-fill-$r.out" 2>&1 ||
        { echo "pipetrain with fill failed:"; tail -5 "$d/$kind-fill-$r.out"; }
      grep -h 'iteration' "$d/$kind-alone-$r.out" "$d/$kind-fill-$r.out" | head -4
    done
    "${ctl[@]}" fill status "$job" | tee "$d/$kind-job.txt"
    "${ctl[@]}" fill stats | tee "$d/$kind-stats.txt"
    bubble_use "$kind" "$d/$kind-trace.json"
    "${ctl[@]}" fill cancel "$job" >/dev/null 2>&1
    stop_daemon
  done

  "$python" - "$d" "$rounds" "${PSWITCH_VALIDATE_MAIN_ARGS:+custom main job}" <<'PY'
import json, os, re, statistics, sys
d, rounds, custom = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def iteration_ms(path):
    try:
        report = json.load(open(path))
    except (OSError, ValueError):
        return None
    walls = [it["wall_ms"] for it in report.get("iterations", []) if not it.get("warmup")]
    return statistics.median(walls) if walls else None

def first_run(kind, resident):
    """A fill job's warm measurement and its first step's time, as pswitchd logged them: for a
    run of one bubble its first run from placement to result (task_switch is logged for a run
    that switched models: the first); a resident run lives across bubbles, so there the first
    training step the worker timed (its step alone, no switch)."""
    try:
        log = open(f"{d}/pswitchd-{kind}.log").read()
    except OSError:
        return None, None
    measured = re.search(r"event=fill_job_step_measured .*?measured_ms=([0-9.]+)", log)
    if resident:
        first = re.search(r"event=training_step_parts .*?total_ms=(-?[0-9.]+)", log)
    else:
        first = re.search(r"event=task_switch .*?model=fill-[0-9]+ .*?result_ms=(-?[0-9.]+)", log)
    first_ms = float(first.group(1)) if first else None
    if first_ms is not None and first_ms < 0:
        print(f"FIG first fill step {kind}: the first run has no result time in pswitchd's log")
        first_ms = None
    return (float(measured.group(1)) if measured else None), first_ms

ok = True
for kind in ("resnet50-training", "bert_base-inference"):
    stats = {}
    if os.path.exists(f"{d}/{kind}-stats.txt"):
        stats = dict(re.findall(r"(\w+)=([0-9.]+)", open(f"{d}/{kind}-stats.txt").read()))
    resident = float(stats.get("bell_wakes", 0)) > 0
    measured, first = first_run(kind, resident and kind.endswith("training"))
    steps, step_ms = float(stats.get("steps", 0)), float(stats.get("fill_step_ms", 0))
    mean = step_ms / steps if steps else float("nan")
    if measured and first and kind.endswith("training"):
        # A training fill run is one step: the first against the warm-up's measured step (issue
        # 28: <= 1.2x), the mean of all steps beside them.
        ratio = first / measured
        what = "the worker's first step (resident run)" if resident else "placement to result"
        print(f"FIG first fill step {kind} b8: {first:.2f} ms {what}, warm "
              f"measurement {measured:.2f} ms, {ratio:.2f}x (issue 28: <= 1.2x: "
              f"{'met' if ratio <= 1.2 else 'NOT met'}); mean step {mean:.2f} ms over {int(steps)}")
    elif measured and first:
        # An inference fill run packs as many batches as the bubble holds: its first run is not
        # one step.
        print(f"FIG fill steps {kind} b8: warm measurement {measured:.2f} ms, mean step "
              f"{mean:.2f} ms over {int(steps)}; first run {first:.2f} ms placement to result"
              f"{' (resident: every bubble it lived through)' if resident else ''}")
    else:
        print(f"FIG first fill step {kind}: no measurement or no run in pswitchd's log")
    # The first training steps of the fill model on each worker, by part (training_step_parts).
    try:
        log = open(f"{d}/pswitchd-{kind}.log").read()
    except OSError:
        log = ""
    for line in re.findall(r"event=training_step_parts .*", log)[:6]:
        f = dict(re.findall(r"(\w+)=([^ ]+)", line))
        print(f"FIG training step parts {kind} task {f.get('task')} step {f.get('step')}: total "
              f"{f.get('total_ms')} ms = issuing the batch {f.get('batch_issue_ms')}, forward "
              f"and backward {f.get('forward_backward_issue_ms')}, update "
              f"{f.get('update_issue_ms')}, then waiting for the loss {f.get('loss_wait_ms')} "
              f"(measured warm {f.get('measured_ms')})")
    pairs = [(iteration_ms(f"{d}/{kind}-alone-{r}.json"), iteration_ms(f"{d}/{kind}-fill-{r}.json"))
             for r in range(1, rounds + 1)]
    pairs = [(a, f) for a, f in pairs if a and f]
    if not pairs or not stats:
        print(f"FIG bubbles {kind}: not measured (see steps.log)")
        ok = False
        continue
    increases = [100 * (f / a - 1) for a, f in pairs]
    inc = statistics.median(increases)
    alone = statistics.median(a for a, _ in pairs)
    used = float(stats.get("used", 0))
    p50, p99 = float(stats.get("pause_p50_ms", 0)), float(stats.get("pause_p99_ms", 0))
    # GPipe's stage 0 has one bubble per iteration: a fill step still running after the bubble's
    # end delays stage 0's backward by about the pause latency.
    bound = 100 * p99 / alone
    met = inc <= 1 and used >= 80
    main = "custom main job" if custom else "stage 0 real GPT-2 on the GPU, others simulated"
    print(f"FIG bubbles gpipe-8 stage 0 + {kind} b8 ({main}): iteration {alone:.1f} ms alone, "
          f"{inc:+.2f} % with fill (rounds {', '.join(f'{i:+.2f}' for i in increases)} %), "
          f"bubble time used {used:.1f} %, {int(float(stats.get('steps', 0)))} steps, "
          f"pause p50 {p50:.2f} ms p99 {p99:.2f} ms (p99 / iteration {bound:.2f} %), "
          f"killed {int(float(stats.get('killed', 0)))}, runs started "
          f"{int(float(stats.get('runs', 0)))}, bells rung {int(float(stats.get('bell_wakes', 0)))}"
          f"; target <= 1 % at >= 80 %: {'met' if met else 'NOT met'}")
sys.exit(0 if ok else 1)
PY
  local rc=$?
  # Online fill, in a daemon of its own, once the fill figures are out (a step timeout here
  # loses only these).
  start_daemon "$d/pswitchd-online.log"
  if [ -n "$daemon_port" ]; then
    ctl=("$bin/pswitchctl" --server="127.0.0.1:$daemon_port" --timeout-s=60)
    "${ctl[@]}" bubble-cycle --gpu 0 --cycle "$d/cycle.json"
    online_requests "$d" "${ctl[@]}"
    stop_daemon
    online_figures "$d"
  else
    echo "online: pswitchd did not start"
    tail -20 "$d/pswitchd-online.log"
    stop_daemon
  fi
  return "$rc"
}

# --- detect: the main job makes no bubble call; its kernel launches find its bubbles ---------
# Stage 0 of pipetrain computes on this GPU (the others simulated) with libpswitch_monitor.so
# preloaded, counting its launches into an activity page; pswitchd --detect-bubbles reads the
# page, finds stage 0's cycle and bubbles, and places a synthetic fill job in them. Alone and
# with detection, alternated: the main job's increase, the share of its idle time filled (its
# own measure), how long detection took, and whether any fill step had to be killed.
detect_cleanup() { stop_daemon; }
cmd_detect() {
  need pswitchd pswitch-worker pipetrain pswitchctl
  local d="$work/detect" rounds=2 iters=30 mb=8 stages=4 r ctl job
  [ "$quick" = 1 ] && rounds=1 iters=20
  local monitor="$build/lib/libpswitch_monitor.so"
  [ -f "$monitor" ] || { echo "no $monitor: build the pswitch_monitor target"; return 1; }
  rm -rf "$d"
  mkdir -p "$d/pages" "$work/bubbles"
  chmod 0755 "$d/pages"
  trap detect_cleanup EXIT
  local mode_args
  read -r -a mode_args <<<"${PSWITCH_VALIDATE_MAIN_ARGS:---simulated-compute --real-stages=0 --device=cuda --n-layer=24 --n-embd=1024 --n-head=16 --seq-len=256 --microbatch-size=8}"
  local main_args=(--stages="$stages" --microbatches="$mb" --schedule=gpipe --warmup=3
    --iterations="$iters" "${mode_args[@]}")
  start_daemon "$d/pswitchd.log" --detect-bubbles --activity-dir="$d/pages" \
    --detected-bubble-free-bytes=$((8 << 30))
  if [ -z "$daemon_port" ]; then
    tail -20 "$d/pswitchd.log"
    return 1
  fi
  ctl=("$bin/pswitchctl" --server="127.0.0.1:$daemon_port" --timeout-s=60)
  for r in $(seq 1 "$rounds"); do
    timeout 90 "$bin/pipetrain" "${main_args[@]}" --json="$d/alone-$r.json" >"$d/alone-$r.out" 2>&1 ||
      { echo "pipetrain alone failed:"; tail -5 "$d/alone-$r.out"; }
    # The fill job goes in once a cycle is found (placement needs one): submitted as the job runs.
    ( for _ in $(seq 1 200); do
        grep -q 'event=bubble_cycle_detected gpu=0' "$d/pswitchd.log" && break
        sleep 0.1
      done
      [ "$r" = 1 ] && "${ctl[@]}" fill submit --kind synthetic --steps 100000000 --synthetic-step-us 2000 \
        --memory-bytes $((1 << 20)) >"$d/job.txt" 2>&1 ) &
    local submitter=$!
    LD_PRELOAD="$monitor" PSWITCH_ACTIVITY_FILE="$d/pages/activity-gpu0" \
      timeout 90 "$bin/pipetrain" "${main_args[@]}" --json="$d/detect-$r.json" \
      --bubble-log="$d/truth.txt" >"$d/detect-$r.out" 2>&1 ||
      { echo "pipetrain with detection failed:"; tail -5 "$d/detect-$r.out"; }
    wait "$submitter"
  done
  # What the monitor counted: few launches means the job's launches went around it.
  "$python" -c 'import struct, sys
magic, launches, busy = struct.unpack("<QQQ", open(sys.argv[1], "rb").read(24))
print(f"FIG detect page: {launches} launches counted, {busy} holds under way at the end")' \
    "$d/pages/activity-gpu0" || echo "no activity page"
  # The bubbles found (the trace's "detected" track), to score against the job's own.
  if [ -n "${daemon_http_port:-}" ]; then
    "$bin/pswitchctl" trace --http="127.0.0.1:$daemon_http_port" --seconds=600 \
      --out="$d/trace.json" >/dev/null || echo "no trace: detection not scored"
  fi
  cat "$d/job.txt" 2>/dev/null
  "${ctl[@]}" fill stats | tee "$d/stats.txt"
  grep -E 'event=(bubble_cycle_detected|bubble_monitor_page)' "$d/pswitchd.log" | head -6
  stop_daemon
  "$python" - "$d" "$rounds" "$stages" <<'PY'
import json, re, statistics, sys
d, rounds, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def report(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
pairs, idle_s = [], 0.0
for r in range(1, rounds + 1):
    a, f = report(f"{d}/alone-{r}.json"), report(f"{d}/detect-{r}.json")
    if not a or not f:
        continue
    walls = lambda rep: [it["wall_ms"] for it in rep.get("iterations", []) if not it.get("warmup")]
    pairs.append((statistics.median(walls(a)), statistics.median(walls(f))))
    # Stage 0's own idle time over the run (the GPU's bubbles: the other stages are simulated).
    idle_s += f["measured"]["bubble_ratio"] * sum(it["wall_ms"] for it in f["iterations"]) / 1000
stats = dict(re.findall(r"(\w+)=([0-9.]+)", open(f"{d}/stats.txt").read())) if pairs else {}
log = open(f"{d}/pswitchd.log").read()
found = re.search(r"event=bubble_cycle_detected gpu=0 period_ms=([0-9.]+) bubbles=([0-9]+)", log)
if not pairs or not stats:
    print("FIG detect: not measured (see steps.log)")
    sys.exit(1)
inc = statistics.median(100 * (f / a - 1) for a, f in pairs)
used = 100 * float(stats.get("fill_step_ms", 0)) / 1000 / idle_s if idle_s else 0
met = inc <= 1.5 and used >= 70
# Found against the job's own bubbles (stage 0 = GPU 0): shares of time inside them, and the
# announcement's delay after a true bubble's start.
truth, found_b = [], []
try:
    for line in open(f"{d}/truth.txt"):
        s, b, e = line.split()
        if s == "0":
            truth.append((int(b), int(e)))
except (OSError, ValueError) as err:
    print(f"no truth (pipetrain --bubble-log): {err}")
try:
    trace = json.load(open(f"{d}/trace.json"))
    origin = trace["otherData"]["origin_ns"]
    for e in trace["traceEvents"]:
        if e.get("cat") == "detected" and e.get("ph") == "X" and e.get("pid") == 0:
            began = origin + e["ts"] * 1e3
            found_b.append((began, began + float(e["args"]["announced_ms"]) * 1e6,
                            began + float(e["args"]["expected_ms"]) * 1e6, began + e["dur"] * 1e3))
except (OSError, ValueError, KeyError) as err:
    print(f"no found bubbles (GET /v1/trace): {err}")
# Only what lies within the rounds that wrote their truth (a round killed by its timeout wrote
# none).
if truth:
    lo, hi = min(b for b, _ in truth), max(e for _, e in truth)
    found_b = [f for f in found_b if lo <= f[0] <= hi]
truth.sort()
def inside(b, e):
    return sum(max(0, min(e, te) - max(b, tb)) for tb, te in truth)
if truth and found_b:
    first = min(f[0] for f in found_b)
    truth_ns = sum(e - b for b, e in truth if e > first)
    given = [(a, min(g, end)) for _, a, g, end in found_b if min(g, end) > a]
    given_ns = sum(e - b for b, e in given)
    given_true = sum(inside(b, e) for b, e in given)
    delays = sorted((a - tb) / 1e6 for a, _ in given for tb, te in truth if tb <= a < te)
    print(f"FIG detect-score stage 0: given precision {100 * given_true / max(given_ns, 1):.1f} %, "
          f"recall {100 * given_true / max(truth_ns, 1):.1f} % (truth from the first found "
          f"bubble), delay p50 {delays[len(delays) // 2] if delays else float('nan'):.2f} ms "
          f"over {len(given)} bubbles")
print(f"FIG detect gpipe-8 stage 0 (real GPT-2 on the GPU, no bubble calls): iteration "
      f"{statistics.median(a for a, _ in pairs):.1f} ms alone, {inc:+.2f} % with detected fill, "
      f"{used:.1f} % of stage 0's idle time filled, cycle found: "
      f"{'period ' + found.group(1) + ' ms, ' + found.group(2) + ' bubbles' if found else 'none'}, "
      f"steps {int(float(stats.get('steps', 0)))}, killed {int(float(stats.get('killed', 0)))}; "
      f"target <= 1.5 % at >= 70 %: {'met' if met else 'NOT met'}")
PY
}

# ---------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------

case "${1:-}" in
  _*)
    # A step command, run by `step` below with the phase's settings in the environment.
    out="${PSWITCH_VALIDATE_OUT:?}"
    mkdir -p "$work"
    name="${1#_}"
    shift
    "cmd_$name" "$@"
    exit $?
    ;;
esac

phase="${1:-}"
out="${2:-}"
if [ -z "$out" ] || ! [[ "$phase" =~ ^(build|run|all)$ ]]; then
  echo "usage: tools/gpu/validate.sh build|run|all OUT" >&2
  exit 2
fi
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
export PSWITCH_VALIDATE_OUT="$out"
summary="$out/summary.md"
build_rows="$build/validate-build-rows.md"  # the build's rows, repeated in run's summary
deadline=$((SECONDS + budget))
[ "$phase" = all ] && deadline=$((SECONDS + 2 * budget))

# step NAME TIMEOUT_S COMMAND...: runs COMMAND under its own timeout (clipped to the phase's
# budget), appends its output to $log and a row to the summary: the lines the command printed
# starting with "FIG ", or its last lines when it failed without any.
step() {
  local name="$1" limit="$2"
  shift 2
  if [ -n "$only" ] && ! [[ " $only " == *" $name "* ]]; then return 0; fi
  local left=$((deadline - SECONDS - reserve))
  if [ "$left" -lt 10 ]; then
    say "$name: skipped, the phase's time budget is spent"
    row "$name" "SKIPPED" 0 "time budget spent"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start rc tmp result figs
  tmp="$(mktemp)"
  say "$name (timeout ${limit}s)..."
  echo "===== step $name (timeout ${limit}s): $*" >>"$log"
  start=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >"$tmp" 2>&1 </dev/null
  rc=$?
  cat "$tmp" >>"$log"
  echo "===== step $name: rc=$rc after $((SECONDS - start))s" >>"$log"
  case "$rc" in
    0) result="ok" ;;
    77) result="SKIPPED" ;;
    124 | 137) result="TIMEOUT" ;;
    *) result="FAILED rc=$rc" ;;
  esac
  figs="$(awk '/^FIG / { sub(/^FIG /, ""); gsub(/\|/, "\\|"); printf "%s%s", (n++ ? "<br>" : ""), $0 }' "$tmp")"
  if [ -z "$figs" ] && [ "$result" != ok ]; then
    figs="$(grep -v '^FIG ' "$tmp" | tail -3 | tr '\n' ' ' | cut -c1-300 | sed 's/|/\\|/g')"
  fi
  row "$name" "$result" "$((SECONDS - start))" "$figs"
  say "$name: $result after $((SECONDS - start))s"
  rm -f "$tmp"
  return 0
}

row() {
  printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" >>"$summary"
  if [ "$phase" != run ]; then
    printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" >>"$build_rows"
  fi
}

start_summary() {
  {
    printf '# pswitch GPU validation (%s%s, %s)\n\n' "$phase" \
      "$([ "$quick" = 1 ] && echo ', quick')" "$(date -u '+%Y-%m-%d %H:%M UTC')"
    printf '| step | result | seconds | figures |\n|---|---|---|---|\n'
    if [ "$phase" = run ] && [ -f "$build_rows" ]; then cat "$build_rows"; fi
  } >"$summary"
}

do_build() {
  log="$out/build.log"
  : >"$log"
  mkdir -p "$build"
  : >"$build_rows"
  step versions 45 "$self" _versions
  # build.sh unpacks the .debs, configures build-gpu/ (Release) and builds the daemon with its
  # worker; then every other target on all cores, going on past a target that fails to compile.
  step build 540 env PSWITCH_GPU_TEST=0 CMAKE_BUILD_TYPE=Release PYTHON="$python" \
    PSWITCH_GPU_TARGETS="pswitchd pswitch-worker" "$repo/tools/gpu/build.sh" "$build"
  if [ -f "$build/build.ninja" ]; then
    local known=() t
    for t in "${targets[@]}"; do
      if ninja -C "$build" -t query "$t" >/dev/null 2>&1; then known+=("$t"); fi
    done
    step build-tools 540 cmake --build "$build" -j "$(nproc)" --target "${known[@]}" -- -k 0
  fi
  step binaries 10 "$self" _binaries
}

do_run() {
  log="$out/steps.log"
  : >"$log"
  rm -rf "$work"
  mkdir -p "$work"
  printf 'step,time_s,pid,process_name,used_mib\n' >"$out/gpu-memory.csv"
  if [ ! -x "$bin/pswitchd" ]; then
    row run "SKIPPED" 0 "no pswitchd in $build: run 'tools/gpu/validate.sh build OUT' first"
    return
  fi
  local q=0 m
  [ "$quick" = 1 ] && q=1
  step selfcheck 60 "$self" _selfcheck
  step ctest-cuda $((q ? 60 : 100)) "$self" _ctest
  step transfer $((q ? 30 : 45)) "$self" _transfer
  step vmm $((q ? 60 : 90)) "$self" _vmm
  step profile $((q ? 50 : 90)) "$self" _profile
  for m in "${models[@]}"; do
    step "switch-$m" $((q ? 70 : 105)) "$self" _switch "$m"
  done
  step place $((q ? 110 : 160)) "$self" _place
  for m in resnet152 inception_v3; do
    step "place-$m" $((q ? 60 : 90)) "$self" _place_model "$m"
  done
  step dataplane $((q ? 60 : 90)) "$self" _dataplane
  step register $((q ? 150 : 200)) "$self" _register
  step trace $((q ? 240 : 480)) "$self" _trace
  step bubbles $((q ? 160 : 210)) "$self" _bubbles
  step detect $((q ? 90 : 120)) "$self" _detect
  step sanitizer $((q ? 50 : 75)) "$self" _sanitizer
  step rest $((q ? 90 : 120)) "$self" _rest
  step script $((q ? 60 : 90)) "$self" _script
  memory_summary
  tar -czf "$out/artifacts.tar.gz" -C "$work" --exclude='*.safetensors' --exclude='*.sock' . \
    2>>"$log"
}

# Per-process GPU memory from the samples: each process kind's peak, and the peak total.
memory_summary() {
  [ -s "$out/gpu-memory.csv" ] || return 0
  "$python" - "$out/gpu-memory.csv" >>"$summary" 2>>"$log" <<'PY'
import collections, csv, os, sys
rows = list(csv.DictReader(open(sys.argv[1]), skipinitialspace=True))
steps = collections.OrderedDict()
for r in rows:
    try:
        used = int(r["used_mib"].strip())
        name = os.path.basename(r["process_name"].strip())
        pid = r["pid"].strip()
    except (KeyError, ValueError, AttributeError):
        continue
    s = steps.setdefault(r["step"], {"procs": {}, "device": 0})
    if name == "gpu-total":  # the device's own count, processes listed or not
        s["device"] = max(s["device"], used)
    else:
        s["procs"][(name, pid)] = max(s["procs"].get((name, pid), 0), used)
if steps:
    print("\n## GPU memory per process (nvidia-smi, peak MiB while the step ran)\n")
    print("| step | per process: peak MiB of each | device peak MiB |\n|---|---|---|")
    for step, s in steps.items():
        kinds = collections.defaultdict(list)
        for (name, _), used in s["procs"].items():
            kinds[name].append(used)
        parts = [f"{name} x{len(v)}: {', '.join(str(u) for u in sorted(v, reverse=True))}"
                 for name, v in sorted(kinds.items())]
        print(f"| {step} | {'<br>'.join(parts) or 'no processes listed'} | {s['device']} |")
PY
}

start_summary
case "$phase" in
  build) do_build ;;
  run) do_run ;;
  all)
    do_build
    phase=run
    do_run
    ;;
esac
ls -la "$out"
cat "$summary"
