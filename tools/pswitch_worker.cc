// pswitch-worker: a worker process, spawned by pswitchd (never by hand): it inherits its control
// socket and attaches to the memdaemon's socket. With --inspect-name it is instead pswitchd's
// inspector of a model being registered (registry/inspection_child.h): it builds the zoo model
// or loads and checks the archive, applies the weights checkpoint, profiles it for an "auto"
// plan, and writes the model's facts (models/model_facts.h) to stdout, or a refusal with exit
// status 3, so neither a model's build and profile nor a hostile archive ever run in pswitchd.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "models/inspection_wire.h"
#include "models/model_facts.h"
#include "models/model_inspection.h"
#include "tools/cli.h"
#include "worker/worker.h"

ABSL_FLAG(uint32_t, worker_id, 0, "worker slot id");
ABSL_FLAG(int, control_fd, -1, "inherited control socket fd");
ABSL_FLAG(std::string, memdaemon_socket, "", "memdaemon Unix socket");
ABSL_FLAG(int, attach_secret_fd, -1,
          "inherited pipe holding the one-time secret with which this worker attaches the arena "
          "(set by pswitchd)");
ABSL_FLAG(std::string, backend, "host", "device backend: host or cuda");
ABSL_FLAG(uint64_t, activation_bytes, 0, "arena lease for intermediate tensors; 0 = none");
ABSL_FLAG(bool, cut_training_steps, true,
          "a Stop cuts a training step under way at its next layer; false = at its end");
ABSL_FLAG(int, device, 0, "CUDA device ordinal (the memdaemon's arena device)");
ABSL_FLAG(std::string, profile_device, "cpu",
          "where --inspect-profile-batch profiles: cpu or cuda:N");
ABSL_FLAG(double, profile_bandwidth, 12e9, "the link the plan is made for, bytes/s");

ABSL_FLAG(std::string, inspect_name, "",
          "inspect --inspect-zoo or the archive of --inspect-archive-fd as this model and exit "
          "(pswitchd's inspector)");
ABSL_FLAG(std::string, inspect_zoo, "", "the zoo architecture to inspect");
ABSL_FLAG(int, inspect_archive_fd, -1, "the inherited sealed memory file holding the archive");
ABSL_FLAG(int, inspect_weights_fd, -1,
          "an inherited sealed memory file holding a safetensors checkpoint to apply (-1: none)");
ABSL_FLAG(std::string, inspect_weights_name, "weights", "the checkpoint's name in messages");
ABSL_FLAG(std::string, inspect_dtype, "",
          "convert the zoo model to this precision (float16, bfloat16) after its checkpoint");
ABSL_FLAG(uint32_t, inspect_profile_batch, 0,
          "also profile the model at this batch on --profile-device (an \"auto\" plan); 0: no");
ABSL_FLAG(bool, inspect_prepare, false,
          "with --inspect-request-fd: prepare (--profile-device's context) before the request "
          "comes (a standby; a child started for a waiting request does not)");
ABSL_FLAG(int, inspect_request_fd, -1,
          "pswitchd's inspector: inspect the one request that comes on this inherited socket "
          "(reporting progress on it) and exit");

namespace {

// Exit status of an inspection that refused the model; its stdout holds the refusal.
constexpr int kRefused = 3;

bool WriteStdout(const std::string& bytes) {
  return std::fwrite(bytes.data(), 1, bytes.size(), stdout) == bytes.size() &&
         std::fflush(stdout) == 0;
}

// A registration's one look at the model (models/model_inspection.h), as the flags ask. The
// inherited descriptors are this process's: closed when it is done.
absl::StatusOr<pswitch::models::ModelFacts> Inspect() {
  using namespace pswitch;  // NOLINT: a tool's entry point
  const UniqueFd archive_fd(absl::GetFlag(FLAGS_inspect_archive_fd));
  const UniqueFd weights_fd(absl::GetFlag(FLAGS_inspect_weights_fd));
  if (absl::GetFlag(FLAGS_inspect_zoo).empty() && !archive_fd.valid()) {
    return absl::InvalidArgumentError("--inspect-name needs --inspect-zoo or --inspect-archive-fd");
  }
  const models::InspectionRequest request{
      .name = absl::GetFlag(FLAGS_inspect_name),
      .zoo = absl::GetFlag(FLAGS_inspect_zoo),
      .archive_fd = archive_fd.get(),
      .weights_fd = weights_fd.get(),
      .weights_name = absl::GetFlag(FLAGS_inspect_weights_name),
      .dtype = absl::GetFlag(FLAGS_inspect_dtype),
      .profile_batch = absl::GetFlag(FLAGS_inspect_profile_batch)};
  return models::Inspect(
      request, {absl::GetFlag(FLAGS_profile_device), absl::GetFlag(FLAGS_profile_bandwidth)});
}

// The inspector's answer on stdout and its exit status (registry/inspection_child.cc reads both).
int Report(const absl::StatusOr<pswitch::models::ModelFacts>& facts) {
  if (!facts.ok())
    return WriteStdout(pswitch::models::EncodeRefusal(facts.status())) ? kRefused : 1;
  // Written as it is encoded, the weights straight from the model: no copy of them all.
  absl::Status written = pswitch::models::WriteModelFacts(*facts, STDOUT_FILENO, "stdout");
  if (!written.ok()) {
    pswitch::base::Log(pswitch::base::LogLevel::kError, "inspection_output_failed")
        .Field("error", written);
    return 1;
  }
  return 0;
}

// A standby: ready before its registration, which then pays only for its own model.
int InspectOnRequest() {
  using namespace pswitch;  // NOLINT: a tool's entry point
  const UniqueFd requests(absl::GetFlag(FLAGS_inspect_request_fd));
  const models::AutoPlanProfile profile{absl::GetFlag(FLAGS_profile_device),
                                        absl::GetFlag(FLAGS_profile_bandwidth)};
  // A device that fails here fails the inspection's profile again, which says so to the client.
  if (absl::GetFlag(FLAGS_inspect_prepare)) {
    if (absl::Status prepared = models::PrepareInspection(profile); !prepared.ok()) {
      base::Log(base::LogLevel::kWarn, "inspector_prepare_failed").Field("error", prepared);
    }
  }
  absl::StatusOr<models::ReceivedInspection> received =
      models::ReceiveInspectionRequest(requests.get());
  if (absl::IsCancelled(received.status())) return 0;  // not needed any more
  if (!received.ok()) return Report(received.status());
  // Each step and profile run back to pswitchd as it is reached: a registration's progress.
  received->request.on_progress = [fd = requests.get()](const models::InspectionProgress& p) {
    models::SendInspectionProgress(fd, p);
  };
  return Report(models::Inspect(received->request, profile));
}

}  // namespace

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv, "pswitch worker process (spawned by pswitchd).");
  if (absl::GetFlag(FLAGS_inspect_request_fd) >= 0) return InspectOnRequest();
  if (!absl::GetFlag(FLAGS_inspect_name).empty()) return Report(Inspect());
  auto backend = pswitch::gpu::ParseBackend(absl::GetFlag(FLAGS_backend));
  if (!backend.ok() || absl::GetFlag(FLAGS_control_fd) < 0 ||
      absl::GetFlag(FLAGS_memdaemon_socket).empty()) {
    std::fprintf(stderr,
                 "pswitch-worker: needs --control-fd, --memdaemon-socket and a valid "
                 "--backend; it is started by pswitchd\n");
    return 2;
  }
  pswitch::worker::WorkerOptions options;
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  options.backend = *backend;
  options.control_fd = absl::GetFlag(FLAGS_control_fd);
  options.memdaemon_socket = absl::GetFlag(FLAGS_memdaemon_socket);
  if (const int fd = absl::GetFlag(FLAGS_attach_secret_fd); fd >= 0) {
    // Read once and closed: nothing this process runs later can find it again.
    char secret[64];
    ssize_t n;
    do {
      n = ::read(fd, secret, sizeof(secret));
    } while (n < 0 && errno == EINTR);
    ::close(fd);
    if (n > 0) options.attach_secret.assign(secret, static_cast<size_t>(n));
    std::memset(secret, 0, sizeof(secret));
  }
  options.activation_bytes = absl::GetFlag(FLAGS_activation_bytes);
  options.cut_training_steps = absl::GetFlag(FLAGS_cut_training_steps);
  options.device_ordinal = absl::GetFlag(FLAGS_device);
  auto worker = pswitch::worker::Worker::Start(options);
  if (!worker.ok()) {
    pswitch::base::Log(pswitch::base::LogLevel::kError, "worker_start_failed")
        .Field("worker", options.worker_id)
        .Field("pid", ::getpid())
        .Field("error", worker.status());
    return 1;
  }
  absl::Status served = (*worker)->Serve();
  if (!served.ok()) {
    pswitch::base::Log(pswitch::base::LogLevel::kError, "worker_stopped")
        .Field("worker", options.worker_id)
        .Field("pid", ::getpid())
        .Field("error", served);
    return 1;
  }
  return 0;
}
