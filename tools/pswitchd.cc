// pswitchd: the per-node pswitch daemon. It takes the GPU's memory as one arena (memdaemon),
// starts the worker processes (1 active + N standby), serves clients over TCP and switches the
// GPU between their models with pipelined transmission. At start it registers the embedded
// default models and runs one inference on each through the whole path, then serves until
// SIGINT/SIGTERM (graceful: in-flight tasks answered, workers reaped).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/confined_dir.h"
#include "base/log.h"
#include "base/private_dir.h"
#include "base/status.h"
#include "controller/bubble_monitor.h"
#include "controller/controller.h"
#include "frontend/byte_budget.h"
#include "frontend/client_server.h"
#include "frontend/fd_budget.h"
#include "frontend/http_server.h"
#include "frontend/memory_return.h"
#include "gpu/activity_page.h"
#include "memdaemon/link_probe.h"
#include "memdaemon/memdaemon.h"
#include "models/model_facts.h"
#include "proto/framing.h"
#include "proto/host_tensor.h"
#include "registry/inspection_child.h"
#include "registry/model_repository.h"
#include "tools/cli.h"
#include "worker/backends.h"

ABSL_FLAG(std::string, backend, "auto",
          "device backend: auto (cuda if a GPU is present), cuda, host");
ABSL_FLAG(int, device, 0, "CUDA device ordinal (the arena's device; workers use it too)");
ABSL_FLAG(uint64_t, arena_reserve_bytes, 4ull << 30,
          "CUDA, with --arena-bytes 0: device memory left outside the arena for the workers' CUDA "
          "contexts, cuBLAS/cuDNN and libtorch");
ABSL_FLAG(uint64_t, arena_bytes, 0,
          "arena size; 0 = almost all free GPU memory (cuda) or 2 GiB (host)");
ABSL_FLAG(
    double, bandwidth_cap, 0,
    "host backend: copy bandwidth cap in bytes/s to model PCIe (12e9 = PCIe 3 x16); 0 = none");
ABSL_FLAG(std::string, listen, "127.0.0.1:7300", "client TCP address (port 0 = any free port)");
ABSL_FLAG(std::string, unix_socket, "auto",
          "client Unix socket (local clients: transfer areas and files passed by fd; the peer's "
          "uid is its principal). auto = pswitchd.sock in $RUNTIME_DIRECTORY (systemd), else "
          "beside the memdaemon socket (/run/pswitch for root, $XDG_RUNTIME_DIR/pswitch, or "
          "pswitchd's /tmp/pswitch-XXXXXX); created 0660, so whoever may enter its directory "
          "and is in pswitchd's group connects; empty = none");
ABSL_FLAG(int, max_regions_per_client, 64,
          "transfer regions (Unix-socket areas, Triton shared-memory regions) one principal may "
          "have registered at once");
ABSL_FLAG(uint64_t, max_region_bytes_per_client, 16ull << 30,
          "bytes of transfer regions one principal may have registered at once");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8300",
          "HTTP/JSON address (Open Inference Protocol; port 0 = any free port; empty = off)");
ABSL_FLAG(std::string, socket, "",
          "memdaemon socket for workers (default: memdaemon.sock in a private 0700 directory: "
          "$XDG_RUNTIME_DIR/pswitch, /run/pswitch for root, else a fresh /tmp/pswitch-XXXXXX)");
ABSL_FLAG(int, standby_workers, 2, "standby workers beside the active one");
ABSL_FLAG(int, cpu_threads, -1,
          "CPU threads each worker and registration child may use for its own compute "
          "(OpenMP, OpenBLAS, MKL pools), so registrations and tasks do not fight over cores; "
          "-1 = auto (cuda: the cores shared by every worker, 1 to 4 each; host: as 0, the "
          "model's compute is on the CPU); 0 = as pswitchd's environment says (the libraries' "
          "default: every core)");
ABSL_FLAG(std::string, warm_up, "auto",
          "what workers run when they load a model, so its first task (and a fill job's first "
          "step) pays no one-off costs: a forward at its registered batch and, for a trainable "
          "model, a training step that writes no weights; a fill job's model also times its "
          "step. auto = on where a first run pays such costs (cuda), off on host; on; off");
ABSL_FLAG(uint64_t, activation_bytes, 256ull << 20,
          "each worker's arena lease for intermediate tensors (a task exceeding it fails alone)");
ABSL_FLAG(std::string, policy, "fcfs", "scheduling policy: fcfs, edf or priority");
ABSL_FLAG(bool, inference_preempts_training, true, "a waiting inference stops a training task");
ABSL_FLAG(std::string, worker_binary, "", "pswitch-worker path (default: beside pswitchd)");
ABSL_FLAG(std::string, profiler_binary, "",
          "the pswitch-worker that inspects (and, for \"auto\" plans, profiles) every model "
          "being registered (default: beside pswitchd)");
ABSL_FLAG(std::string, preload, "resnet18,tiny_cnn",
          "zoo models registered at start under their own names (empty: none)");
ABSL_FLAG(uint64_t, optimizer_state_bytes, 0,
          "the most bytes of preempted training tasks' optimizer state (momentum, Adam moments) "
          "each GPU keeps in its weights pool for their resume; beyond, a stop saves it to host "
          "memory. 0 = no cap but the pool (a kept state is saved when the pool needs its room). "
          "A running task's state takes room in the pool as a model does");
ABSL_FLAG(bool, weights_cache, true,
          "keep every model whose weights fit resident in the GPU's weights pool after it ran, "
          "evicting by --weights-cache-policy when room is needed; false = one model at a time "
          "in one region (PipeSwitch's switch, the benchmarks' baseline)");
ABSL_FLAG(uint64_t, weights_cache_bytes, 0,
          "at most this many bytes of resident weights per GPU; 0 = the whole weights pool "
          "(the arena less activation leases and optimizer state)");
ABSL_FLAG(bool, cut_training_steps, true,
          "a Stop cuts a training step under way at its next layer boundary (the step is "
          "discarded and run again on resume); false = the step runs to its end (the baseline)");
ABSL_FLAG(bool, place_at_arrival, true,
          "place a task that waits while the running one stops at once, on a standby worker "
          "and apart from the stopping tenant's weights, and send its Run, so its copy and its "
          "compute overlap the stop and a slow or silent old tenant does not delay it; false = "
          "placed once the GPU is free (the baseline)");
ABSL_FLAG(bool, keep_preempted_training, true,
          "with the weights cache on, a preempted training task's trained weights stay in its "
          "region and its optimizer state in the arena, unsaved, for its next run (written back "
          "only when evicted or when it ends); false = both are copied to host memory at every "
          "stop and the state copied back at its resume (the baseline)");
ABSL_FLAG(bool, cuda_vmm_arena, false,
          "CUDA backend: the arena is 2 MiB chunks of physical memory (the VMM API), of which "
          "each worker maps only what its task needs (its activations, the model it runs, "
          "read-only when it infers), so a model that escapes its tensors faults instead of "
          "reading another tenant's weights (a worker running native code could still ask for "
          "any chunk); false = cudaMalloc shared by IPC handle, which every worker maps whole. "
          "Off by default until validated on a GPU (tools/gpu/validate.sh's vmm step)");
ABSL_FLAG(bool, weights_cache_compaction, true,
          "with the weights cache on, while the GPU is idle, a resident model moves by a copy on "
          "the device into a free hole when that merges the free space, so a later model finds "
          "room without an eviction; false = free space stays where evictions left it");
ABSL_FLAG(std::string, weights_cache_policy, "cost",
          "which resident models make room: cost (the least request rate times the reload time "
          "their compute cannot hide) or lru (the least recently used)");
ABSL_FLAG(int, gpus, 1,
          "GPUs this daemon schedules, each with its own arena, copy engine and workers (CUDA: "
          "devices --device .. --device+N-1; host: simulated devices, e.g. one per pipeline "
          "stage for fill tasks)");
ABSL_FLAG(std::string, fill_policy, "fifo", "fill-job policy: fifo, sjf, makespan or deadline");
ABSL_FLAG(int, drain_timeout_ms, 30000,
          "a worker told to stop that has not drained this long into a switch is killed and "
          "replaced, and the switch fails (its stream may wait on a flag no one will write)");
ABSL_FLAG(int, inputs_hold_ms, 100,
          "a task placed while its raw TCP payload still arrives gives the GPU back (to the "
          "queue's head, its payload still arriving) this long after its placement when another "
          "task could run at once; 0 = at once");
ABSL_FLAG(int, fill_grace_ms, 20,
          "a fill task not paused this long after its bubble ends is SIGKILLed");
ABSL_FLAG(bool, fill_resident_runs, true,
          "a fill job's run lives across bubbles: its worker keeps the model, its state and its "
          "outputs, and is woken at each bubble by a word in shared memory rather than a Run "
          "message; false: one run per bubble");
ABSL_FLAG(bool, fill_suspend_steps, true,
          "with --fill-resident-runs (and --cut-training-steps), a training fill step still under "
          "way at its bubble's end waits there (at a layer boundary) for the next bubble and goes "
          "on, rather than being cut and lost: a step longer than every bubble still ends; false: "
          "cut, as a preempted step is. Host backend only for now (logged on CUDA)");
ABSL_FLAG(bool, fill_device_lock, true,
          "host backend: fill steps hold the simulated device's compute lock (as pipetrain "
          "--simulated-compute stages do), modelling a time-sliced GPU");
ABSL_FLAG(bool, inference_device_lock, false,
          "host backend only: inference tasks too hold their GPU's simulated compute lock while "
          "they compute, so they delay a simulated main job as on a time-sliced GPU (online "
          "fill's benchmarks and tests); off, they compute beside it");
ABSL_FLAG(std::string, online_fill_overflow, "refuse",
          "an online fill request (an inference with a latency objective) that no bubble of the "
          "main job can serve in time: 'refuse' answers it DeadlineExceeded with the reason, so "
          "the main job is never slowed; 'run' runs it at once, preempting the main job, its "
          "time counted in pswitch_online_fill_overflow_seconds_total");
ABSL_FLAG(uint32_t, online_fill_queue, 1024,
          "online fill requests waiting for bubbles, all GPUs together; beyond, they are "
          "refused");
ABSL_FLAG(bool, detect_bubbles, false,
          "find main jobs' bubbles from their device activity, the jobs making no bubble calls "
          "(SpecInF's bubble monitor): host backend, pipetrain's holds of each GPU's compute "
          "lock; CUDA, the kernel launches libpswitch_monitor.so counts when preloaded into a "
          "job (LD_PRELOAD, PSWITCH_ACTIVITY_FILE=<--activity-dir>/activity-gpu<N>)");
ABSL_FLAG(std::string, activity_dir, "",
          "CUDA with --detect-bubbles: the directory of the jobs' activity pages, "
          "activity-gpu<N> for GPU N (required there: only those who may write it can make "
          "pswitchd see bubbles)");
ABSL_FLAG(double, detect_window_ms, 2,
          "--detect-bubbles: the window activity is counted in (SpecInF: 2 ms); a bubble is "
          "found a window or so late, and one shorter than two windows is not learnt");
ABSL_FLAG(uint64_t, detected_bubble_free_bytes, uint64_t{1} << 40,
          "--detect-bubbles: the device memory each found bubble announces as free to fill jobs "
          "(the job's own memory is not seen; fill work runs in pswitchd's arena)");
ABSL_FLAG(int, worker_silence_timeout_ms, 10000,
          "a worker that sends no heartbeat this long (stopped, wedged) is killed and replaced; "
          "the task it ran fails with the reason");
ABSL_FLAG(std::string, data_root, "",
          "the directory fill jobs' datasets and outputs are named under over TCP (relative "
          "names only, symlinks never followed, outputs never replace a file); empty = only "
          "fill jobs that pass their files over the Unix socket may read or write files");
ABSL_FLAG(std::string, model_repository, "",
          "a directory of models, one folder per model with a config.json (see "
          "docs/operations.md); all are loaded at start (see --load-repository), and clients "
          "register them by name");
ABSL_FLAG(bool, load_repository, true,
          "load every model of --model-repository at start; false: only those a client loads "
          "(POST /v2/repository/models/NAME/load, Triton's explicit model control)");
ABSL_FLAG(std::string, allow_client_paths, "auto",
          "true: admins' registrations may name weights, archive and plan files on this server, "
          "opened with pswitchd's privileges (local use; files passed by fd over the Unix socket "
          "need no such flag); auto: true only when --listen is a loopback address");
ABSL_FLAG(std::string, auth_tokens, "",
          "file of bearer tokens, one \"TOKEN NAME ROLE [UID]\" per line (role admin or user; "
          "UID: the local uid that is this principal on the Unix socket and on loopback), mode "
          "0600: every TCP and HTTP connection must present one; empty = no authentication "
          "(then local peers are who the kernel says: pswitchd's own uid an admin, others "
          "users)");
ABSL_FLAG(int, max_connections, 256,
          "TCP client connections beyond this many are closed on accept (with --auth-tokens: "
          "authenticated ones, refused when they authenticate)");
ABSL_FLAG(int, max_unauthenticated_connections, 32,
          "with --auth-tokens: TCP connections still to authenticate, beside --max-connections; "
          "a newcomer beyond them closes the oldest");
ABSL_FLAG(int, http_max_connections, 256,
          "HTTP connections; at the cap a newcomer closes the one waiting longest for its headers");
ABSL_FLAG(int, http_header_timeout_ms, 10000,
          "HTTP: a request's headers must arrive whole within this (also the keep-alive idle limit)");
ABSL_FLAG(int, http_request_timeout_ms, 60000,
          "HTTP: a request's headers and body together must arrive within this");
ABSL_FLAG(uint32_t, http_max_header_bytes, 16u << 10, "HTTP: request line and headers, bytes");
ABSL_FLAG(int, http_handler_threads, 4, "HTTP: threads running handlers (not connections)");
ABSL_FLAG(uint32_t, max_frame_bytes, 64u << 20, "largest client frame (request) accepted");
ABSL_FLAG(uint64_t, max_buffered_bytes, 1ull << 30,
          "bytes pswitchd holds for all clients together, both ports: incomplete frames, queued "
          "replies, HTTP bodies and their decoded tensors");
ABSL_FLAG(uint64_t, max_client_bytes, 256ull << 20,
          "of --max-buffered-bytes, what one client may hold (its token's name; without "
          "--auth-tokens, one connection); beyond, its request or reply fails and that "
          "connection is closed");
ABSL_FLAG(uint64_t, max_unauthenticated_bytes, 16ull << 20,
          "of --max-buffered-bytes, what all connections that have not authenticated yet may "
          "hold together");
ABSL_FLAG(uint64_t, max_queued_reply_bytes, 256ull << 20,
          "replies held for one TCP connection that does not read them; beyond, it is "
          "disconnected");
ABSL_FLAG(int, frame_timeout_ms, 30000, "a request frame begun must be complete within this");
ABSL_FLAG(int, idle_timeout_s, 600,
          "a connection with no request and no answer owed for this long is closed (0 = never)");
ABSL_FLAG(int, auth_timeout_ms, 10000, "with --auth-tokens: time to authenticate after connecting");
ABSL_FLAG(int, max_tasks_per_client, 256,
          "unfinished tasks one client (its token's name; without tokens, one connection) may have");
ABSL_FLAG(int, max_queued_tasks, 4096, "unfinished tasks the GPU accepts from all clients");
ABSL_FLAG(uint32_t, max_batch, 256,
          "largest batch: registration, training, and an inference input's first dimension");
ABSL_FLAG(uint64_t, max_input_bytes, 48ull << 20, "largest inference input, bytes");
ABSL_FLAG(uint64_t, max_dataset_bytes, 2ull << 30, "largest fill-job dataset file, bytes");
ABSL_FLAG(uint64_t, max_total_dataset_bytes, 8ull << 30,
          "fill jobs' dataset copies held at once, all jobs together, bytes");
ABSL_FLAG(int, max_fill_loads, 8,
          "fill submissions and estimates handled at once (queued or loading their dataset); "
          "more are refused");
ABSL_FLAG(uint64_t, profile_memory_bytes, 4ull << 30,
          "every model being registered is built, checked and (\"auto\" plans) profiled in a "
          "child process: its resident memory bound (an archive's check may use four times the "
          "archive's size more, and the weights file's)");
ABSL_FLAG(int, profile_timeout_s, 120,
          "the registration child's time bound (build, check and \"auto\" plans' profile)");
ABSL_FLAG(bool, inspector_standby, true,
          "keep the next registration's child started ahead (libtorch loaded, the profile "
          "device's context created: about a GPU context's memory while it waits); each child "
          "still inspects one registration only");
ABSL_FLAG(int, max_task_time_s, 86400,
          "every task's deadline: a client's own is capped by it, a task without one gets it");
ABSL_FLAG(bool, insecure, false,
          "allow --listen beyond loopback without --auth-tokens (anyone who can reach the port "
          "controls pswitchd)");
ABSL_FLAG(bool, exit_after_demo, false, "exit after the start-up self-check instead of serving");

namespace pswitch {
namespace {

using base::Log;
using base::LogLevel;

// Every way start-up can fail ends in this one line (and a non-zero exit).
void StartFailed(absl::string_view error) {
  Log(LogLevel::kError, "start_failed").Field("error", error);
}

absl::StatusOr<gpu::DeviceOptions> ChooseDevice() {
  gpu::DeviceOptions options;
  options.device_ordinal = absl::GetFlag(FLAGS_device);
  options.copy_bandwidth_bytes_per_s = absl::GetFlag(FLAGS_bandwidth_cap);
  options.cuda_vmm_arena = absl::GetFlag(FLAGS_cuda_vmm_arena);
  std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "auto") {
    auto parsed = gpu::ParseBackend(backend);
    if (!parsed.ok()) return parsed.status();
    if (auto supported = worker::CheckWorkerBackend(*parsed); !supported.ok()) return supported;
    options.backend = *parsed;
    return options;
  }
  options.backend = gpu::Backend::kCuda;
  // No GPU is the usual reason; a GPU with no CUDA worker path in this build the other.
  absl::Status usable = gpu::Device::Open(options).status();
  if (usable.ok()) usable = worker::CheckWorkerBackend(options.backend);
  if (usable.ok()) return options;
  Log(LogLevel::kInfo, "backend_auto").Field("chosen", "host").Field("reason", usable.message());
  options.backend = gpu::Backend::kHost;
  return options;
}

// Loads every model of the repository; one that fails is logged and skipped (the others serve).
void LoadRepository(controller::Controller& controller, const registry::ModelRepository& repo) {
  absl::StatusOr<std::vector<std::string>> index = repo.Index();
  if (!index.ok()) {
    Log(LogLevel::kError, "model_repository_unreadable").Field("error", index.status());
    return;
  }
  for (const std::string& name : *index) {
    std::promise<absl::Status> registered;
    controller.Register([&repo, name] { return repo.Request(name); },
                        [&](const auto& outcome) { registered.set_value(outcome.status()); });
    // The controller logs the registration and its phases (model_registered).
    if (absl::Status status = registered.get_future().get(); !status.ok()) {
      Log(LogLevel::kError, "model_load_failed").Field("model", name).Field("error", status);
    }
  }
}

// A deterministic batch-1 input for a registered model's input spec, made without libtorch:
// floats in [0, 1), integers zero (a valid token id in every zoo vocabulary).
absl::StatusOr<proto::HostTensor> SelfCheckInput(const registry::TensorSpec& spec) {
  proto::HostTensor tensor;
  tensor.name = spec.name;
  tensor.dtype = spec.dtype;
  tensor.shape = spec.shape;
  if (!tensor.shape.empty()) tensor.shape[0] = 1;
  PSWITCH_ASSIGN_OR_RETURN(uint64_t bytes, proto::ShapeBytes(tensor.dtype, tensor.shape));
  tensor.data.assign(bytes, 0);
  if (tensor.dtype == proto::DType::F32) {
    uint32_t state = 1;
    for (uint64_t i = 0; i < bytes / sizeof(float); ++i) {
      state = state * 1664525u + 1013904223u;  // an LCG: the same input on every start
      const float value = static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
      std::memcpy(tensor.data.data() + i * sizeof(float), &value, sizeof(float));
    }
  }
  return tensor;
}

// Registers the preloaded models and runs one inference on each through the full path.
absl::Status Preload(controller::Controller& controller) {
  std::string list = absl::GetFlag(FLAGS_preload);
  if (list.empty()) return absl::OkStatus();
  std::vector<registry::EntryRef> entries;
  for (absl::string_view name : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    registry::ModelRequest request;
    request.name = std::string(name);
    request.zoo_model = std::string(name);
    std::promise<absl::StatusOr<controller::Controller::Registered>> registered;
    controller.Register(request, [&](const auto& outcome) { registered.set_value(outcome); });
    // The controller logs the registration and its phases (model_registered).
    PSWITCH_ASSIGN_OR_RETURN(controller::Controller::Registered done,
                             registered.get_future().get());
    entries.push_back(std::move(done.entry));
  }
  for (const registry::EntryRef& entry : entries) {
    const std::string& name = entry->request.name;
    PSWITCH_ASSIGN_OR_RETURN(proto::HostTensor input, SelfCheckInput(entry->input));
    controller::TaskSpec spec;
    spec.model = name;
    spec.inputs.push_back(std::move(input));
    std::promise<absl::StatusOr<controller::TaskOutcome>> done;
    auto id = controller.Submit(std::move(spec), [&](const auto& out) { done.set_value(out); });
    if (!id.ok()) return id.status();
    auto outcome = done.get_future().get();
    if (!outcome.ok()) return outcome.status();
    // copy_ms is the model's transmission, not the switch's cost (see event=task_switch for
    // the parts, and bench-switch for overhead against a ready model).
    const controller::SwitchTimeline& t = outcome->timeline;
    Log(LogLevel::kInfo, "self_check")
        .Field("model", name)
        .Field("task", outcome->task_id)
        .FieldMs("latency_ms", outcome->latency)
        .FieldMs("copy_ms", outcome->switch_time)
        .Field("first_layer_start_ms",
               t.first_layer_start_ns == 0 ? -1.0 : (t.first_layer_start_ns - t.arrival_ns) / 1e6);
  }
  return absl::OkStatus();
}

// A runtime directory pswitchd made for itself (a fresh /tmp/pswitch-XXXXXX), removed on exit
// once the sockets in it are gone.
struct OwnedRuntimeDir {
  std::string path;
  ~OwnedRuntimeDir() {
    if (!path.empty()) ::rmdir(path.c_str());
  }
};

// The Unix socket --unix-socket names: systemd's runtime directory (the unit chooses its mode),
// else the directory of the memdaemon socket (private to pswitchd's user unless the operator
// made it otherwise).
std::string UnixSocketPath(const std::string& memdaemon_socket) {
  const std::string flag = absl::GetFlag(FLAGS_unix_socket);
  if (flag != "auto") return flag;
  if (const char* runtime = ::getenv("RUNTIME_DIRECTORY"); runtime != nullptr && runtime[0] == '/') {
    // systemd lists one directory per RuntimeDirectory= entry, ':'-separated: the first.
    return absl::StrCat(std::string(absl::string_view(runtime).substr(
                            0, absl::string_view(runtime).find(':'))),
                        "/pswitchd.sock");
  }
  return (std::filesystem::path(memdaemon_socket).parent_path() / "pswitchd.sock").string();
}

// The bounds on what clients may ask for and hold (issue 14's resource limits), from the flags.
absl::Status ApplyLimits(controller::ControllerOptions& controller,
                         frontend::ClientServerOptions& server) {
  auto positive = [](int value, absl::string_view flag) {
    return value >= 1 ? absl::OkStatus()
                      : absl::InvalidArgumentError(absl::StrCat("--", flag, " must be >= 1"));
  };
  PSWITCH_RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_max_connections), "max-connections"));
  PSWITCH_RETURN_IF_ERROR(
      positive(absl::GetFlag(FLAGS_max_regions_per_client), "max-regions-per-client"));
  if (absl::GetFlag(FLAGS_max_region_bytes_per_client) == 0) {
    return absl::InvalidArgumentError("--max-region-bytes-per-client must be > 0");
  }
  PSWITCH_RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_frame_timeout_ms), "frame-timeout-ms"));
  PSWITCH_RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_auth_timeout_ms), "auth-timeout-ms"));
  PSWITCH_RETURN_IF_ERROR(
      positive(absl::GetFlag(FLAGS_max_tasks_per_client), "max-tasks-per-client"));
  PSWITCH_RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_max_queued_tasks), "max-queued-tasks"));
  PSWITCH_RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_max_task_time_s), "max-task-time-s"));
  if (absl::GetFlag(FLAGS_idle_timeout_s) < 0) {
    return absl::InvalidArgumentError("--idle-timeout-s must be >= 0 (0 = never)");
  }
  const uint32_t frame = absl::GetFlag(FLAGS_max_frame_bytes);
  if (frame < 4096 || frame > proto::kMaxFrameBytesLimit) {
    return absl::InvalidArgumentError(absl::StrCat("--max-frame-bytes must be in [4096, ",
                                                   proto::kMaxFrameBytesLimit, "]"));
  }
  const uint64_t total = absl::GetFlag(FLAGS_max_buffered_bytes);
  // A client's share is at most the total: a small total bounds everyone.
  const uint64_t per_client = std::min(absl::GetFlag(FLAGS_max_client_bytes), total);
  if (per_client < frame) {
    return absl::InvalidArgumentError(
        "--max-buffered-bytes and --max-client-bytes must hold at least one frame of "
        "--max-frame-bytes");
  }
  const uint64_t unauthenticated = absl::GetFlag(FLAGS_max_unauthenticated_bytes);
  if (unauthenticated < (64u << 10) || unauthenticated > total) {
    return absl::InvalidArgumentError(
        "--max-unauthenticated-bytes must be in [65536, --max-buffered-bytes]");
  }
  PSWITCH_RETURN_IF_ERROR(positive(absl::GetFlag(FLAGS_max_unauthenticated_connections),
                                   "max-unauthenticated-connections"));
  PSWITCH_RETURN_IF_ERROR(
      positive(absl::GetFlag(FLAGS_http_max_connections), "http-max-connections"));
  if (absl::GetFlag(FLAGS_max_queued_reply_bytes) < 2ull * frame) {
    // A client reading promptly may still have two large results in flight.
    return absl::InvalidArgumentError(
        "--max-queued-reply-bytes must hold at least two frames of --max-frame-bytes");
  }
  const uint32_t batch = absl::GetFlag(FLAGS_max_batch);
  if (batch < 1 || batch > registry::kMaxBatchSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-batch must be in [1, ", registry::kMaxBatchSize, "]"));
  }
  server.max_connections = static_cast<size_t>(absl::GetFlag(FLAGS_max_connections));
  server.max_frame_bytes = frame;
  // One budget for both ports (the HTTP server is given the same object).
  server.budget = std::make_shared<frontend::ByteBudget>(
      frontend::ByteBudgetLimits{.total_bytes = total,
                                 .per_client_bytes = per_client,
                                 .unauthenticated_bytes = unauthenticated});
  server.max_unauthenticated_connections =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_unauthenticated_connections));
  server.max_queued_reply_bytes = absl::GetFlag(FLAGS_max_queued_reply_bytes);
  server.frame_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_frame_timeout_ms));
  server.idle_timeout = absl::GetFlag(FLAGS_idle_timeout_s) == 0
                            ? absl::InfiniteDuration()
                            : absl::Seconds(absl::GetFlag(FLAGS_idle_timeout_s));
  server.auth_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_auth_timeout_ms));
  server.max_tasks_per_client = static_cast<size_t>(absl::GetFlag(FLAGS_max_tasks_per_client));
  controller.scheduler.max_queued_tasks = static_cast<size_t>(absl::GetFlag(FLAGS_max_queued_tasks));
  controller.max_batch = batch;
  controller.max_input_bytes = absl::GetFlag(FLAGS_max_input_bytes);
  controller.max_task_time = absl::Seconds(absl::GetFlag(FLAGS_max_task_time_s));
  return absl::OkStatus();
}

// Raises the soft RLIMIT_NOFILE to the hard limit and checks it covers every connection the
// caps admit, the workers and files: better refused at start than "Too many open files" for
// the next client or a worker's respawn under load.
absl::Status CheckFileDescriptors(bool with_tokens) {
  PSWITCH_ASSIGN_OR_RETURN(frontend::FdLimit limit, frontend::RaiseFdLimit());
  frontend::FdDemand demand;
  demand.tcp_connections = static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_max_connections)));
  if (with_tokens) {
    demand.unauthenticated_connections =
        static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_max_unauthenticated_connections)));
  }
  if (!absl::GetFlag(FLAGS_http_listen).empty()) {
    demand.http_connections =
        static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_http_max_connections)));
  }
  demand.gpus = static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_gpus)));
  demand.workers_per_gpu =
      1 + static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_standby_workers)));
  PSWITCH_RETURN_IF_ERROR(frontend::CheckFdBudget(demand, limit.soft));
  Log(LogLevel::kInfo, "fd_limit")
      .Field("soft", limit.soft)
      .Field("hard", limit.hard)
      .Field("needed", frontend::FdsNeeded(demand));
  return absl::OkStatus();
}

// --warm-up as the schedulers take it.
absl::StatusOr<bool> WarmUps(gpu::Backend backend) {
  const std::string flag = absl::GetFlag(FLAGS_warm_up);
  if (flag == "auto") return backend == gpu::Backend::kCuda;
  if (flag == "on") return true;
  if (flag == "off") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("--warm-up must be auto, on or off, not '", flag, "'"));
}

// --cpu-threads as the workers and registration children get it (0: every core).
int CpuThreads(gpu::Backend backend, int workers) {
  const int flag = absl::GetFlag(FLAGS_cpu_threads);
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  int threads = flag;
  if (flag < 0) {
    // A GPU node's workers compute on their GPUs: CPU threads serve model set-up and small host
    // ops, and many workers share the cores. The host backend's one running worker computes on
    // the CPU and wants every core.
    threads = backend == gpu::Backend::kCuda ? std::clamp(cores / std::max(1, workers), 1, 4) : 0;
  }
  Log(LogLevel::kInfo, "cpu_threads")
      .Field("per_process", threads)
      .Field("cores", cores)
      .Field("source", flag < 0 ? "auto" : "flag");
  return threads;
}

int Main() {
  // A fixed mmap threshold: a client's large frame buffer goes back to the kernel when freed,
  // instead of raising glibc's dynamic threshold and staying in the heap after the connection.
  frontend::FixMmapThreshold(1 << 20);
  OwnedRuntimeDir runtime_dir;  // outlives the memory daemons and their sockets
  // Block the stop signals before any thread starts, so only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // Who may connect is settled before anything is set up: a misconfigured exposure fails fast.
  std::unique_ptr<frontend::TokenTable> tokens;
  if (!absl::GetFlag(FLAGS_auth_tokens).empty()) {
    auto table = frontend::TokenTable::Load(absl::GetFlag(FLAGS_auth_tokens));
    if (!table.ok()) {
      StartFailed(table.status().ToString());
      return 2;
    }
    tokens = std::make_unique<frontend::TokenTable>(std::move(*table));
  } else if (!frontend::IsLoopbackListen(absl::GetFlag(FLAGS_listen)) ||
             (!absl::GetFlag(FLAGS_http_listen).empty() &&
              !frontend::IsLoopbackListen(absl::GetFlag(FLAGS_http_listen)))) {
    if (!absl::GetFlag(FLAGS_insecure)) {
      StartFailed(absl::StrCat("--listen ", absl::GetFlag(FLAGS_listen), " / --http-listen ",
                               absl::GetFlag(FLAGS_http_listen),
                               " reaches beyond this machine: give --auth-tokens FILE (or "
                               "--insecure to run without authentication)"));
      return 2;
    }
    Log(LogLevel::kWarn, "insecure")
        .Field("detail", "listening beyond loopback without --auth-tokens: anyone who can reach "
                         "the port can register models, train and cancel any task");
  }
  if (absl::Status fds = CheckFileDescriptors(tokens != nullptr); !fds.ok()) {
    StartFailed(fds.ToString());
    return 2;
  }
  auto device_options = ChooseDevice();
  auto policy = controller::ParsePolicy(absl::GetFlag(FLAGS_policy));
  int standby = absl::GetFlag(FLAGS_standby_workers);
  if (!device_options.ok() || !policy.ok() || standby < 0 || standby > 64) {
    absl::Status bad = !device_options.ok() ? device_options.status()
                       : !policy.ok()
                           ? policy.status()
                           : absl::InvalidArgumentError("--standby-workers must be in [0, 64]");
    StartFailed(bad.ToString());
    return 2;
  }
  memdaemon::MemDaemonOptions options;
  options.device = *device_options;
  options.arena_bytes = absl::GetFlag(FLAGS_arena_bytes);
  options.arena_reserve_bytes = absl::GetFlag(FLAGS_arena_reserve_bytes);
  options.socket_path = absl::GetFlag(FLAGS_socket);
  if (options.socket_path.empty()) {
    bool created_temp = false;
    absl::StatusOr<std::string> dir = base::DefaultRuntimeDir(&created_temp);
    if (!dir.ok()) {
      StartFailed(dir.status().ToString());
      return 1;
    }
    if (created_temp) runtime_dir.path = *dir;
    options.socket_path = *dir + "/memdaemon.sock";
  } else if (absl::Status private_dir = base::EnsurePrivateDir(
                 std::filesystem::path(options.socket_path).parent_path().string());
             !private_dir.ok()) {
    // The socket itself is 0600 and checks its peers; a private directory is the first wall.
    Log(LogLevel::kWarn, "socket_dir_not_private").Field("detail", private_dir.message());
  }
  const int gpus = absl::GetFlag(FLAGS_gpus);
  if (gpus < 1 || gpus > controller::kMaxGpus) {
    StartFailed(absl::StrCat("--gpus must be in [1, ", controller::kMaxGpus, "], got ", gpus));
    return 2;
  }
  // One memory daemon per GPU: its own arena, flags, copy engine and worker socket (GPU g > 0
  // gets SOCKET.g). On CUDA, GPU g is device --device + g.
  std::vector<std::unique_ptr<memdaemon::MemDaemon>> daemons;
  for (int g = 0; g < gpus; ++g) {
    memdaemon::MemDaemonOptions gpu_options = options;
    gpu_options.device.device_ordinal = options.device.device_ordinal + g;
    if (g > 0) gpu_options.socket_path = absl::StrCat(options.socket_path, ".", g);
    auto daemon = memdaemon::MemDaemon::Create(gpu_options);
    if (!daemon.ok()) {
      StartFailed(absl::StrCat("GPU ", g, ": ", daemon.status().ToString()));
      return 1;
    }
    daemons.push_back(std::move(*daemon));
  }
  std::vector<memdaemon::MemDaemon*> daemon_list;
  for (const auto& d : daemons) daemon_list.push_back(d.get());
  memdaemon::MemDaemon* const first = daemons.front().get();
  controller::ControllerOptions controller_options;
  // One set of counters for every GPU, the fill side and GET /metrics.
  auto telemetry = std::make_shared<controller::Telemetry>();
  controller_options.scheduler.telemetry = telemetry;
  for (int g = 0; g < absl::GetFlag(FLAGS_gpus); ++g) telemetry->AddGpu(g);
  controller_options.scheduler.policy = *policy;
  controller_options.scheduler.inference_preempts_training =
      absl::GetFlag(FLAGS_inference_preempts_training);
  controller_options.scheduler.workers = 1 + standby;
  controller_options.scheduler.spawn.binary = absl::GetFlag(FLAGS_worker_binary).empty()
                                                  ? tools::SiblingBinary("pswitch-worker")
                                                  : absl::GetFlag(FLAGS_worker_binary);
  controller_options.scheduler.spawn.backend =
      std::string(gpu::BackendName(options.device.backend));
  controller_options.scheduler.spawn.activation_bytes = absl::GetFlag(FLAGS_activation_bytes);
  controller_options.scheduler.spawn.cut_training_steps = absl::GetFlag(FLAGS_cut_training_steps);
  absl::StatusOr<bool> warm_ups = WarmUps(options.device.backend);
  if (!warm_ups.ok()) {
    StartFailed(warm_ups.status().ToString());
    return 2;
  }
  controller_options.scheduler.warm_ups = *warm_ups;
  const int cpu_threads = CpuThreads(options.device.backend, gpus * (1 + standby));
  controller_options.scheduler.spawn.cpu_threads = cpu_threads;
  std::shared_ptr<const base::ConfinedDir> data_root;
  if (!absl::GetFlag(FLAGS_data_root).empty()) {
    absl::StatusOr<base::ConfinedDir> root = base::ConfinedDir::Open(absl::GetFlag(FLAGS_data_root));
    if (!root.ok()) {
      StartFailed(root.status().ToString());
      return 2;
    }
    data_root = std::make_shared<const base::ConfinedDir>(std::move(*root));
  }
  controller_options.optimizer_state_bytes = absl::GetFlag(FLAGS_optimizer_state_bytes);
  absl::StatusOr<controller::EvictionPolicy> eviction =
      controller::ParseEvictionPolicy(absl::GetFlag(FLAGS_weights_cache_policy));
  if (!eviction.ok()) {
    StartFailed(absl::StrCat("--weights-cache-policy: ", eviction.status().message()));
    return 2;
  }
  controller_options.scheduler.weights_cache = absl::GetFlag(FLAGS_weights_cache);
  controller_options.scheduler.weights_cache_bytes = absl::GetFlag(FLAGS_weights_cache_bytes);
  controller_options.scheduler.eviction_policy = *eviction;
  controller_options.scheduler.place_at_arrival = absl::GetFlag(FLAGS_place_at_arrival);
  controller_options.scheduler.compact_weights = absl::GetFlag(FLAGS_weights_cache_compaction);
  controller_options.scheduler.keep_preempted_training =
      absl::GetFlag(FLAGS_keep_preempted_training);
  auto fill_policy = fill::ParseFillPolicy(absl::GetFlag(FLAGS_fill_policy));
  auto online_overflow = controller::ParseOnlineOverflow(absl::GetFlag(FLAGS_online_fill_overflow));
  if (!online_overflow.ok()) {
    StartFailed(online_overflow.status().ToString());
    return 2;
  }
  if (absl::GetFlag(FLAGS_inference_device_lock) && options.device.backend != gpu::Backend::kHost) {
    StartFailed("--inference-device-lock is for the host backend (a simulated device)");
    return 2;
  }
  controller_options.inference_holds_device_lock = absl::GetFlag(FLAGS_inference_device_lock);
  if (!fill_policy.ok() || absl::GetFlag(FLAGS_fill_grace_ms) < 1 ||
      absl::GetFlag(FLAGS_drain_timeout_ms) < 1) {
    StartFailed(!fill_policy.ok()                        ? fill_policy.status().ToString()
                : absl::GetFlag(FLAGS_fill_grace_ms) < 1 ? "--fill-grace-ms must be >= 1"
                                                         : "--drain-timeout-ms must be >= 1");
    return 2;
  }
  controller_options.scheduler.drain_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms));
  if (absl::GetFlag(FLAGS_inputs_hold_ms) < 0) {
    StartFailed("--inputs-hold-ms must be >= 0");
    return 2;
  }
  controller_options.scheduler.inputs_hold =
      absl::Milliseconds(absl::GetFlag(FLAGS_inputs_hold_ms));
  if (absl::GetFlag(FLAGS_worker_silence_timeout_ms) < 1000) {
    StartFailed("--worker-silence-timeout-ms must be >= 1000 (workers beat every 500 ms)");
    return 2;
  }
  controller_options.scheduler.worker_silence_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_worker_silence_timeout_ms));
  // Where and for which link "auto" plans are profiled.
  models::AutoPlanProfile auto_plan;
  if (options.device.backend == gpu::Backend::kCuda) {
    // Auto plans are made for the link the switch really uses, measured once, and for the
    // GPU's layer times.
    memdaemon::LinkProbeOptions probe;
    // GPU 0's link stands for all: one plan per model serves every GPU.
    probe.bytes = std::min<uint64_t>(probe.bytes, first->leases().largest_free_bytes() / 2);
    absl::StatusOr<double> link = memdaemon::MeasureLinkBandwidth(*first, probe);
    if (!link.ok()) {
      StartFailed(absl::StrCat("measuring the host-to-device link: ", link.status().ToString()));
      return 1;
    }
    Log(LogLevel::kInfo, "link_measured")
        .Field("bandwidth_gb_per_s", *link / 1e9, 2)
        .Field("probe_bytes", probe.bytes);
    auto_plan.bandwidth_bytes_per_s = *link;
    for (int g = 0; g < gpus; ++g) telemetry->LinkMeasured(g, *link);  // GPU 0's stands for all
    auto_plan.device = absl::StrCat("cuda:", options.device.device_ordinal);
  } else if (options.device.copy_bandwidth_bytes_per_s > 0) {
    auto_plan.bandwidth_bytes_per_s = options.device.copy_bandwidth_bytes_per_s;
  }
  if (absl::GetFlag(FLAGS_profile_timeout_s) < 1 || absl::GetFlag(FLAGS_profile_memory_bytes) == 0) {
    StartFailed("--profile-timeout-s and --profile-memory-bytes must be positive");
    return 2;
  }
  registry::InspectionChildOptions profiling;
  profiling.binary = absl::GetFlag(FLAGS_profiler_binary).empty()
                         ? tools::SiblingBinary("pswitch-worker")
                         : absl::GetFlag(FLAGS_profiler_binary);
  profiling.auto_plan = auto_plan;
  profiling.memory_bytes = absl::GetFlag(FLAGS_profile_memory_bytes);
  profiling.timeout = absl::Seconds(absl::GetFlag(FLAGS_profile_timeout_s));
  profiling.cpu_threads = cpu_threads;
  profiling.standby = absl::GetFlag(FLAGS_inspector_standby);
  // pswitchd never builds a model itself: a model's build and profile take seconds and hundreds
  // of MiB, and libtorch's loader is not hardened against a crafted archive.
  auto inspector = std::make_shared<registry::Inspector>(profiling);
  controller_options.inspector = [inspector](const registry::InspectionRequest& request) {
    return inspector->Inspect(request);
  };
  frontend::ClientServerOptions server_options;
  if (absl::Status limits = ApplyLimits(controller_options, server_options); !limits.ok()) {
    StartFailed(limits.ToString());
    return 2;
  }
  auto controller = controller::Controller::Create(controller_options, daemon_list);
  if (!controller.ok()) {
    StartFailed(controller.status().ToString());
    return 1;
  }
  controller::FillManagerOptions fill_options;
  fill_options.policy = *fill_policy;
  fill_options.online.overflow = *online_overflow;
  fill_options.online.max_queued = std::max<uint32_t>(1, absl::GetFlag(FLAGS_online_fill_queue));
  fill_options.online.max_batch_rows = controller_options.max_batch;
  fill_options.online.max_batch_bytes = controller_options.max_input_bytes;
  fill_options.grace = absl::Milliseconds(absl::GetFlag(FLAGS_fill_grace_ms));
  fill_options.resident_runs = absl::GetFlag(FLAGS_fill_resident_runs);
  // A step suspends at its cut points, so without them it cannot. On CUDA the host issues a step's
  // kernels ahead of the device, so a point reached on time may leave a step's work queued past
  // the bubble's end: suspension needs the host paced to the device there first (not built), and
  // is off, said at start; a training step is cut at a bubble's end as before.
  const bool suspend_steps =
      absl::GetFlag(FLAGS_fill_suspend_steps) && absl::GetFlag(FLAGS_cut_training_steps);
  fill_options.suspend_steps = suspend_steps && options.device.backend == gpu::Backend::kHost;
  if (suspend_steps && !fill_options.suspend_steps) {
    base::Log(base::LogLevel::kWarn, "fill_suspend_steps_unavailable")
        .Field("backend", "cuda")
        .Field("detail",
               "training fill steps are cut at a bubble's end: suspending them needs the host "
               "paced to the device (its kernels run ahead), not built yet");
  }
  fill_options.data_root = data_root;
  fill_options.max_dataset_bytes = absl::GetFlag(FLAGS_max_dataset_bytes);
  fill_options.max_total_dataset_bytes = absl::GetFlag(FLAGS_max_total_dataset_bytes);
  fill_options.max_loads_in_flight = std::max(1, absl::GetFlag(FLAGS_max_fill_loads));
  fill_options.telemetry = telemetry;
  fill_options.host_compute_lock =
      absl::GetFlag(FLAGS_fill_device_lock) && options.device.backend == gpu::Backend::kHost;
  auto fill = std::make_unique<controller::FillManager>(controller->get(), fill_options);
  // Bubbles of jobs that make no bubble calls, found from their activity (issue 30 item 3).
  std::unique_ptr<controller::BubbleSink> bubble_sink;
  std::unique_ptr<controller::BubbleMonitor> bubble_monitor;
  if (absl::GetFlag(FLAGS_detect_bubbles)) {
    controller::BubbleMonitorOptions monitor;
    monitor.free_bytes = absl::GetFlag(FLAGS_detected_bubble_free_bytes);
    monitor.telemetry = telemetry.get();
    const double window_ms = absl::GetFlag(FLAGS_detect_window_ms);
    if (!(window_ms > 0 && window_ms <= 100)) {
      StartFailed("--detect-window-ms must be in (0, 100]");
      return 2;
    }
    monitor.detector.window = absl::Microseconds(std::llround(window_ms * 1000));
    // Stretches of one window are found as one or two by turns, and keep the phase from
    // stable: two windows (the default's 4 ms at 2 ms).
    monitor.detector.min_bubble = 2 * monitor.detector.window;
    const std::string dir = absl::GetFlag(FLAGS_activity_dir);
    if (options.device.backend == gpu::Backend::kCuda && dir.empty()) {
      StartFailed("--detect-bubbles on CUDA needs --activity-dir (where jobs' monitors write)");
      return 2;
    }
    // Whoever may create a page there decides what pswitchd takes for bubbles.
    struct stat dir_stat {};
    if (!dir.empty() && (::stat(dir.c_str(), &dir_stat) != 0 || !S_ISDIR(dir_stat.st_mode) ||
                         (dir_stat.st_mode & S_IWOTH) != 0)) {
      StartFailed(absl::StrCat("--activity-dir '", dir,
                               "' must be a directory that other users cannot write"));
      return 2;
    }
    for (int g = 0; g < gpus; ++g) {
      monitor.pages.emplace_back(
          g, dir.empty() ? gpu::HostActivityPath(g) : absl::StrCat(dir, "/activity-gpu", g));
    }
    bubble_sink = controller::FillBubbleSink(fill.get());
    auto started = controller::BubbleMonitor::Start(std::move(monitor), bubble_sink.get());
    if (!started.ok()) {
      StartFailed(started.status().ToString());
      return 2;
    }
    bubble_monitor = std::move(*started);
  }
  std::unique_ptr<registry::ModelRepository> repository;
  if (!absl::GetFlag(FLAGS_model_repository).empty()) {
    auto repo = registry::ModelRepository::Open(absl::GetFlag(FLAGS_model_repository));
    if (!repo.ok()) {
      StartFailed(repo.status().ToString());
      return 2;
    }
    repository = std::make_unique<registry::ModelRepository>(std::move(*repo));
  }
  server_options.repository = repository.get();
  server_options.tokens = tokens.get();
  // One table of transfer regions for every port: Unix-socket areas and Triton's regions, each
  // principal bounded across both.
  dataplane::RegionTable regions(dataplane::RegionLimits{
      .max_regions_per_principal = static_cast<size_t>(absl::GetFlag(FLAGS_max_regions_per_client)),
      .max_bytes_per_principal = absl::GetFlag(FLAGS_max_region_bytes_per_client)});
  server_options.regions = &regions;
  server_options.unix_socket = UnixSocketPath(options.socket_path);
  const std::string client_paths = absl::GetFlag(FLAGS_allow_client_paths);
  if (client_paths != "auto" && client_paths != "true" && client_paths != "false") {
    StartFailed("--allow-client-paths must be auto, true or false");
    return 2;
  }
  server_options.allow_client_paths =
      client_paths == "true" ||
      (client_paths == "auto" && frontend::IsLoopbackListen(absl::GetFlag(FLAGS_listen)));
  auto server = frontend::ClientServer::Start(absl::GetFlag(FLAGS_listen), controller->get(),
                                                fill.get(), server_options);
  if (!server.ok()) {
    StartFailed(server.status().ToString());
    return 1;
  }
  std::unique_ptr<frontend::HttpServer> http;
  if (!absl::GetFlag(FLAGS_http_listen).empty()) {
    frontend::HttpServerOptions http_options;
    http_options.tokens = tokens.get();
    http_options.owners = &(*server)->owners();
    http_options.quota = &(*server)->quota();
    http_options.admission = &(*server)->admission();
    http_options.regions = &regions;
    // Triton's CUDA shared memory (a client's IPC handle) needs a device to open it on.
    http_options.cuda_shared_memory = options.device.backend == gpu::Backend::kCuda;
    http_options.limits.max_body_bytes = server_options.max_frame_bytes;
    http_options.limits.max_connections =
        static_cast<size_t>(absl::GetFlag(FLAGS_http_max_connections));
    http_options.limits.budget = server_options.budget;  // one budget for both ports
    http_options.limits.header_timeout =
        absl::Milliseconds(std::max(1, absl::GetFlag(FLAGS_http_header_timeout_ms)));
    http_options.limits.request_timeout =
        absl::Milliseconds(std::max(1, absl::GetFlag(FLAGS_http_request_timeout_ms)));
    http_options.limits.max_header_bytes = std::max<uint32_t>(
        absl::GetFlag(FLAGS_http_max_header_bytes), 1024);
    http_options.handler_threads =
        static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_http_handler_threads)));
    http_options.telemetry = telemetry.get();
    http_options.fill = fill.get();
    http_options.repository = repository.get();
    auto started = frontend::HttpServer::Start(absl::GetFlag(FLAGS_http_listen),
                                                 controller->get(), http_options);
    if (!started.ok()) {
      StartFailed(started.status().ToString());
      return 1;
    }
    http = std::move(*started);
  }
  Log(LogLevel::kInfo, "started")
      .Field("device", first->device().description())
      .Field("gpus", gpus)
      .Field("arena_bytes", first->arena().size_bytes())
      .FieldMs("arena_create_ms", first->arena_create_time())
      .Field("arena_access_unit", first->leases().alignment())
      .Field("workers", 1 + standby)
      .Field("policy", controller::PolicyName(*policy))
      .Field("port", (*server)->port())
      .Field("unix_socket", (*server)->unix_socket())
      .Field("http_port", http != nullptr ? http->port() : 0)
      .Field("client_paths", server_options.allow_client_paths)
      .Field("auth_tokens", tokens != nullptr ? tokens->size() : 0);
  absl::Status preload = Preload(**controller);
  if (!preload.ok()) {
    Log(LogLevel::kError, "preload_failed").Field("error", preload);
    return 1;
  }
  if (repository != nullptr && absl::GetFlag(FLAGS_load_repository)) {
    LoadRepository(**controller, *repository);
  }
  int exit_code = 0;
  if (absl::GetFlag(FLAGS_exit_after_demo)) {
    Log(LogLevel::kInfo, "stopping").Field("reason", "exit_after_demo");
  } else {
    Log(LogLevel::kInfo, "serving")
        .Field("listen", absl::GetFlag(FLAGS_listen))
        .Field("hint", "Ctrl-C or SIGTERM to stop");
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    Log(LogLevel::kInfo, "stopping").Field("signal", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  }
  // New requests are refused first; the controller then answers every task still queued or
  // running (its schedulers' last callbacks reach the fill manager), and the server delivers
  // those answers before it closes the connections.
  (*server)->StopServing();
  http.reset();  // its waiting requests answered 503; nothing of it reaches the controller after
  // No found bubble reaches the fill manager once it starts going.
  bubble_monitor.reset();
  bubble_sink.reset();
  fill->Shutdown();  // no fill submission reaches the controller once it starts going
  controller->reset();
  fill.reset();
  server->reset();
  daemons.clear();
  Log(LogLevel::kInfo, "stopped").Field("exit_code", exit_code);
  return exit_code;
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv, "pswitch per-node daemon.");
  return pswitch::Main();
}
