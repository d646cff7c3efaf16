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
#include <limits>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/files.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "base/status.h"
#include "models/layer_profiler.h"
#include "models/model_facts.h"
#include "models/registry.h"
#include "models/safetensors.h"
#include "models/script_model.h"
#include "models/weight_init.h"
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
ABSL_FLAG(uint32_t, inspect_profile_batch, 0,
          "also profile the model at this batch on --profile-device (an \"auto\" plan); 0: no");

namespace {

// Exit status of an inspection that refused the model; its stdout holds the refusal.
constexpr int kRefused = 3;

bool WriteStdout(const std::string& bytes) {
  return std::fwrite(bytes.data(), 1, bytes.size(), stdout) == bytes.size() &&
         std::fflush(stdout) == 0;
}

// The layer profile of `model` at `batch` on --profile-device (1 warm-up run, 3 measured; layer
// times do not depend on the weights), as profile JSON.
absl::StatusOr<std::string> Profile(pswitch::models::ZooModel& model, uint32_t batch) {
  using namespace pswitch;  // NOLINT: a tool's entry point
  PSWITCH_ASSIGN_OR_RETURN(c10::Device device,
                           models::ResolveDevice(absl::GetFlag(FLAGS_profile_device)));
  PSWITCH_RETURN_IF_ERROR(models::CatchTorch("moving the model", [&] { model.to(device); }));
  models::ProfileOptions options;
  options.batch = batch;
  // On the CPU the inspection's forward at this batch was the warm-up (Inspect).
  options.warmup_runs = device.is_cpu() ? 0 : 1;
  options.measured_runs = 3;
  options.bandwidth_cap_bytes_per_s = absl::GetFlag(FLAGS_profile_bandwidth);
  options.measured_bandwidth_bytes_per_s = absl::GetFlag(FLAGS_profile_bandwidth);
  PSWITCH_ASSIGN_OR_RETURN(models::ModelProfile profile,
                           models::ProfileModel(model, device, options));
  return models::ProfileToJson(profile).dump();
}

// A registration's one look at the model: built once (a zoo architecture with seeded random
// weights, or the archive), the checkpoint applied, its facts collected and, for an "auto" plan,
// its layers profiled.
absl::StatusOr<pswitch::models::ModelFacts> Inspect() {
  using namespace pswitch;  // NOLINT: a tool's entry point
  const std::string name = absl::GetFlag(FLAGS_inspect_name);
  const std::string zoo = absl::GetFlag(FLAGS_inspect_zoo);
  models::ModelSource source{zoo, nullptr, name};
  if (zoo.empty()) {
    if (absl::GetFlag(FLAGS_inspect_archive_fd) < 0) {
      return absl::InvalidArgumentError(
          "--inspect-name needs --inspect-zoo or --inspect-archive-fd");
    }
    UniqueFd archive_fd(absl::GetFlag(FLAGS_inspect_archive_fd));
    PSWITCH_ASSIGN_OR_RETURN(std::string archive,
                             base::ReadSealedMemoryFile(archive_fd, "the archive to inspect",
                                                        std::numeric_limits<uint64_t>::max()));
    source.archive = std::make_shared<const std::string>(std::move(archive));
  }
  std::shared_ptr<models::ZooModel> model;
  {
    // A checkpoint replaces every parameter and buffer (LoadWeights refuses one that misses
    // any): the seeded draw would be wasted.
    std::optional<models::SkipWeightInit> skip;
    if (absl::GetFlag(FLAGS_inspect_weights_fd) >= 0) skip.emplace();
    PSWITCH_ASSIGN_OR_RETURN(model, models::CreateModelFrom(source, name));
  }
  source.archive.reset();
  if (const int fd = absl::GetFlag(FLAGS_inspect_weights_fd); fd >= 0) {
    UniqueFd weights_fd(fd);
    // Mapped, not read: the checkpoint's bytes go once, into the model's tensors.
    PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<const base::MappedFile> mapped,
                             base::MappedFile::MapSealed(weights_fd, "the weights checkpoint",
                                                         std::numeric_limits<uint64_t>::max()));
    const absl::string_view bytes = mapped->bytes();
    PSWITCH_ASSIGN_OR_RETURN(
        models::SafetensorsFile file,
        models::SafetensorsFile::ParseShared(std::move(mapped), bytes,
                                             absl::GetFlag(FLAGS_inspect_weights_name)));
    PSWITCH_RETURN_IF_ERROR(models::LoadWeights(*model, file));
  }
  const uint32_t batch = absl::GetFlag(FLAGS_inspect_profile_batch);
  // A CPU profile's warm-up is the inspection's own forward pass, at the profile's batch; a GPU
  // profile warms up there, and the CPU pass stays at batch 1.
  const bool cpu_profile = absl::GetFlag(FLAGS_profile_device) == "cpu";
  PSWITCH_ASSIGN_OR_RETURN(models::ModelFacts facts,
                           worker::InspectModel(*model, batch > 0 && cpu_profile ? batch : 1));
  if (batch > 0) {
    // The facts hold their own references to the weights' host bytes: moving the model to the
    // device for the profile leaves them as they were collected.
    const absl::Time start = absl::Now();
    PSWITCH_ASSIGN_OR_RETURN(facts.profile_json, Profile(*model, batch));
    facts.profile_us = static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - start));
  }
  return facts;
}

}  // namespace

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv, "pswitch worker process (spawned by pswitchd).");
  if (!absl::GetFlag(FLAGS_inspect_name).empty()) {
    absl::StatusOr<pswitch::models::ModelFacts> facts = Inspect();
    if (!facts.ok()) return WriteStdout(pswitch::models::EncodeRefusal(facts.status())) ? kRefused : 1;
    // Written as it is encoded, the weights straight from the model: no copy of them all.
    absl::Status written = pswitch::models::WriteModelFacts(*facts, STDOUT_FILENO, "stdout");
    if (!written.ok()) {
      pswitch::base::Log(pswitch::base::LogLevel::kError, "inspection_output_failed")
          .Field("error", written);
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
