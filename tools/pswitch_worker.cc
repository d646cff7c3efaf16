// pswitch-worker: a worker process, spawned by pswitchd (never by hand): it inherits its control
// socket and attaches to the memdaemon's socket. With --profile-model it is instead pswitchd's
// profiler for "auto" plans: it profiles a fresh instance of the model and writes the profile
// JSON to stdout, so the profile's time and memory are never pswitchd's own. With --inspect-name
// it is pswitchd's inspector of a pswitch.export archive: it loads and checks the archive, applies
// the weights checkpoint, and writes the model's facts (models/model_facts.h) to stdout, or a
// refusal with exit status 3, so a hostile archive meets libtorch's loader outside pswitchd.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "absl/flags/flag.h"
#include "base/files.h"
#include "base/log.h"
#include "base/status.h"
#include "models/layer_profiler.h"
#include "models/model_facts.h"
#include "models/registry.h"
#include "models/safetensors.h"
#include "models/script_model.h"
#include "models/weights.h"
#include "models/zoo_model.h"
#include "tools/cli.h"
#include "worker/model_inspection.h"
#include "worker/worker.h"

ABSL_FLAG(uint32_t, worker_id, 0, "worker slot id");
ABSL_FLAG(int, control_fd, -1, "inherited control socket fd");
ABSL_FLAG(std::string, memdaemon_socket, "", "memdaemon Unix socket");
ABSL_FLAG(int, attach_secret_fd, -1,
          "inherited pipe holding the one-time secret with which this worker attaches the arena "
          "(set by pswitchd)");
ABSL_FLAG(std::string, backend, "host", "device backend: host or cuda");
ABSL_FLAG(uint64_t, activation_bytes, 0, "arena lease for intermediate tensors; 0 = none");
ABSL_FLAG(int, device, 0, "CUDA device ordinal (the memdaemon's arena device)");
ABSL_FLAG(std::string, profile_model, "", "profile this zoo model and exit (pswitchd's profiler)");
ABSL_FLAG(uint32_t, profile_batch, 1, "the profile's batch");
ABSL_FLAG(std::string, profile_device, "cpu", "cpu or cuda:N");
ABSL_FLAG(double, profile_bandwidth, 12e9, "the link the plan is made for, bytes/s");
ABSL_FLAG(int, profile_archive_fd, -1,
          "profile the script model in this inherited sealed memory file (--profile_model names "
          "it in messages)");

ABSL_FLAG(std::string, inspect_name, "",
          "inspect the archive of --inspect-archive-fd as this model and exit (pswitchd's "
          "inspector)");
ABSL_FLAG(int, inspect_archive_fd, -1, "the inherited sealed memory file holding the archive");
ABSL_FLAG(int, inspect_weights_fd, -1,
          "an inherited sealed memory file holding a safetensors checkpoint to apply (-1: none)");
ABSL_FLAG(std::string, inspect_weights_name, "weights", "the checkpoint's name in messages");

namespace {

// Exit status of an inspection that refused the archive; its stdout holds the refusal.
constexpr int kRefused = 3;

// The profile pswitchd's ModelCatalog made in its own process before: a fresh, seeded instance
// (layer times do not depend on the weights), 1 warm-up run, 3 measured.
absl::Status Profile() {
  using namespace pswitch;  // NOLINT: a tool's entry point
  PSWITCH_ASSIGN_OR_RETURN(c10::Device device,
                           models::ResolveDevice(absl::GetFlag(FLAGS_profile_device)));
  models::ModelSource source{absl::GetFlag(FLAGS_profile_model), nullptr,
                            absl::GetFlag(FLAGS_profile_model)};
  if (const int fd = absl::GetFlag(FLAGS_profile_archive_fd); fd >= 0) {
    UniqueFd archive(fd);
    PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                             base::ReadSealedMemoryFile(archive, "the archive to profile",
                                                        std::numeric_limits<uint64_t>::max()));
    source.archive = std::make_shared<const std::string>(std::move(bytes));
  }
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<models::ZooModel> model,
                           models::CreateModelFrom(source, absl::GetFlag(FLAGS_profile_model)));
  PSWITCH_RETURN_IF_ERROR(models::CatchTorch("moving the model", [&] { model->to(device); }));
  models::ProfileOptions options;
  options.batch = absl::GetFlag(FLAGS_profile_batch);
  options.warmup_runs = 1;
  options.measured_runs = 3;
  options.bandwidth_cap_bytes_per_s = absl::GetFlag(FLAGS_profile_bandwidth);
  options.measured_bandwidth_bytes_per_s = absl::GetFlag(FLAGS_profile_bandwidth);
  PSWITCH_ASSIGN_OR_RETURN(models::ModelProfile profile,
                           models::ProfileModel(*model, device, options));
  const std::string json = models::ProfileToJson(profile).dump();
  if (std::fwrite(json.data(), 1, json.size(), stdout) != json.size() || std::fflush(stdout) != 0) {
    return absl::InternalError("writing the profile to stdout failed");
  }
  return absl::OkStatus();
}

bool WriteStdout(const std::string& bytes) {
  return std::fwrite(bytes.data(), 1, bytes.size(), stdout) == bytes.size() &&
         std::fflush(stdout) == 0;
}

absl::StatusOr<std::string> Inspect() {
  using namespace pswitch;  // NOLINT: a tool's entry point
  const std::string name = absl::GetFlag(FLAGS_inspect_name);
  if (absl::GetFlag(FLAGS_inspect_archive_fd) < 0) {
    return absl::InvalidArgumentError("--inspect-name needs --inspect-archive-fd");
  }
  UniqueFd archive_fd(absl::GetFlag(FLAGS_inspect_archive_fd));
  PSWITCH_ASSIGN_OR_RETURN(std::string archive,
                           base::ReadSealedMemoryFile(archive_fd, "the archive to inspect",
                                                      std::numeric_limits<uint64_t>::max()));
  models::ModelSource source{"", std::make_shared<const std::string>(std::move(archive)), name};
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<models::ZooModel> model,
                           models::CreateModelFrom(source, name));
  source.archive.reset();
  if (const int fd = absl::GetFlag(FLAGS_inspect_weights_fd); fd >= 0) {
    UniqueFd weights_fd(fd);
    PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                             base::ReadSealedMemoryFile(weights_fd, "the weights checkpoint",
                                                        std::numeric_limits<uint64_t>::max()));
    PSWITCH_ASSIGN_OR_RETURN(models::SafetensorsFile file,
                             models::SafetensorsFile::Parse(std::move(bytes),
                                                            absl::GetFlag(FLAGS_inspect_weights_name)));
    PSWITCH_RETURN_IF_ERROR(models::LoadWeights(*model, file));
  }
  PSWITCH_ASSIGN_OR_RETURN(models::ModelFacts facts, worker::InspectModel(*model));
  return models::EncodeModelFacts(facts);
}

}  // namespace

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv, "pswitch worker process (spawned by pswitchd).");
  if (!absl::GetFlag(FLAGS_inspect_name).empty()) {
    absl::StatusOr<std::string> facts = Inspect();
    if (!facts.ok()) return WriteStdout(pswitch::models::EncodeRefusal(facts.status())) ? kRefused : 1;
    return WriteStdout(*facts) ? 0 : 1;
  }
  if (!absl::GetFlag(FLAGS_profile_model).empty()) {
    absl::Status profiled = Profile();
    if (!profiled.ok()) {
      pswitch::base::Log(pswitch::base::LogLevel::kError, "profile_failed")
          .Field("model", absl::GetFlag(FLAGS_profile_model))
          .Field("error", profiled);
      return 1;
    }
    return 0;
  }
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
