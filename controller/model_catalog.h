// The registered models: registration builds the model (a zoo architecture, or the user's own
// pswitch.export archive) once in pswitchd, loads its weights
// (safetensors or seeded random), stores them in the memdaemon's pinned weight store in the
// shared layout, and fixes the model's grouping plan (a plan file, or "auto": a quick profile
// and the exact grouping search).
#ifndef PSWITCH_CONTROLLER_MODEL_CATALOG_H_
#define PSWITCH_CONTROLLER_MODEL_CATALOG_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grouping/plan.h"
#include "grouping/profile.h"
#include "proto/common_generated.h"
#include "base/confined_dir.h"
#include "base/unique_fd.h"
#include "memdaemon/memdaemon.h"
#include "models/model_facts.h"

namespace pswitch::models {
class ZooModel;
struct ModelSource;
}

namespace pswitch::controller {

// Largest batch a model is registered with, or a training task asks for.
inline constexpr uint32_t kMaxBatchSize = 4096;

struct ModelRequest {
  std::string name;
  std::string zoo_model;
  std::string weights_path;  // empty: seeded random weights
  uint32_t batch_size = 1;
  std::string plan = "auto";  // a plan JSON path, or "auto"
  // Where weights_path, archive_path and plan resolve: the model's folder in the model
  // repository (relative names, no symlink followed). Null: they are server paths (local use:
  // --allow-client-paths).
  std::shared_ptr<const base::ConfinedDir> files;
  // A pswitch.export archive (the user's own model); zoo_model is then "torchscript".
  std::string archive_path;
  // Set: the archive is this sealed memory file (a registered model's, copied for a fill job),
  // not read from archive_path again.
  std::shared_ptr<const UniqueFd> archive_fd;
  // Set: the weights / the plan are these sealed memory files (copies of files a client passed
  // by fd: frontend/passed_files.h), not read from weights_path / plan, which only name them.
  std::shared_ptr<const UniqueFd> weights_fd;
  std::shared_ptr<const UniqueFd> plan_fd;
  // Principals who may train and unload the model besides admins: the repository config's
  // "trainers", or the registering admin's.
  std::vector<std::string> trainers;
  // Set for a user's own copy (a training task's copy name): only this principal and admins see,
  // serve, train or unload it. Empty: every principal sees it.
  std::string owner;
};

// A model's input or output as clients see it (KServe metadata): -1 marks the batch dimension.
struct TensorSpec {
  std::string name;
  proto::DType dtype = proto::DType::F32;
  std::vector<int64_t> shape;
};

// A registered model. Held by shared pointer so a front end formatting its metadata, or a
// running task, keeps it alive across an unload; `stored` is valid only while the model is in
// the catalog or an unload still waits for its tasks (only the schedulers read it).
struct CatalogEntry {
  ModelRequest request;
  TensorSpec input;   // "input"
  TensorSpec output;  // "output"
  const memdaemon::StoredModel* stored = nullptr;  // owned by the memdaemon's weight store
  // `stored`'s layer count and bytes, for front ends (which must not read `stored`).
  uint32_t layers = 0;
  uint64_t weight_bytes = 0;
  grouping::GroupPlan plan;                        // covers every layout layer
  std::vector<uint32_t> group_last_layer;          // plan as the worker protocol wants it
  uint64_t optimizer_slot_bytes = 0;               // models::OptimizerSlotBytes of the model
  // A script model's archive as a sealed memory file, passed to every worker that loads it.
  std::shared_ptr<const UniqueFd> archive;
  uint64_t archive_bytes = 0;
  // Whether training tasks may run on it (a script model exported without a loss may not).
  absl::Status trainable;
};

using EntryRef = std::shared_ptr<const CatalogEntry>;

// How "auto" plans are profiled: on the device the workers compute on, at the link speed the
// switch sees (CUDA: measured through the memdaemon's copy engine at start-up).
struct AutoPlanProfile {
  std::string device = "cpu";  // "cpu" or "cuda:N"
  double bandwidth_bytes_per_s = 12e9;  // host backend: the configured copy cap, or PCIe 3 x16
  // Profiles zoo model `zoo` (or, when `archive_fd` >= 0, the script model in that sealed memory
  // file) at `batch` on `device` at that bandwidth (pswitchd: in a bounded child process,
  // ProfileInChild). Unset: in this process (library use, tests).
  std::function<absl::StatusOr<grouping::Profile>(const std::string& zoo, int archive_fd,
                                                  uint32_t batch)>
      profiler;
};

// The facts of the archive in sealed memory file `archive_fd` registered as `name`, with the
// checkpoint in sealed memory file `weights_fd` (-1: none; `weights_name` for messages) applied,
// at most `max_bytes` of them (pswitchd: in a bounded child process, InspectInChild). Unset: the
// archive is loaded in this process (library use, tests).
using ArchiveInspector = std::function<absl::StatusOr<models::ModelFacts>(
    const std::string& name, int archive_fd, int weights_fd, const std::string& weights_name,
    uint64_t max_bytes)>;

// Thread-safe. `*daemon` must outlive the catalog.
class ModelCatalog {
 public:
  // With an `inspector`, "auto" plans of archives need `auto_plan.profiler` too: this process
  // never loads an archive then.
  ModelCatalog(memdaemon::MemDaemon* daemon, uint64_t region_bytes, AutoPlanProfile auto_plan,
               ArchiveInspector inspector = nullptr)
      : daemon_(daemon),
        region_bytes_(region_bytes),
        auto_plan_(std::move(auto_plan)),
        inspector_(std::move(inspector)) {}

  // Slow (builds and profiles the model): call off the scheduling thread. InvalidArgument for a
  // bad request (unknown zoo model, bad weights or plan), AlreadyExists, ResourceExhausted when
  // the model exceeds the weights region. Nothing is registered on error.
  absl::StatusOr<EntryRef> Register(const ModelRequest& request);
  // Registers `name`, a copy of registered model `original` owned by `owner`: the same definition,
  // archive and plan, and the weights `original`'s pinned store holds now. Call where `original`
  // cannot be unloaded meanwhile (the registration thread). AlreadyExists, ResourceExhausted as
  // Register; nothing is registered on error.
  absl::StatusOr<EntryRef> RegisterCopy(const CatalogEntry& original, const std::string& name,
                                        const std::string& owner);
  absl::StatusOr<EntryRef> Find(absl::string_view name) const;
  std::vector<EntryRef> List() const;

  // Unload, in two steps. BeginUnload takes the model out (Find and List no longer see it, new
  // tasks on it are refused) while its name stays reserved, so it cannot be registered again
  // before its weights are gone. NotFound for an unknown model; FailedPrecondition while it is
  // still being registered or already being unloaded.
  absl::StatusOr<EntryRef> BeginUnload(absl::string_view name);
  // Once nothing runs or copies it any more: frees its pinned weights and releases the name.
  absl::Status FinishUnload(const CatalogEntry& entry);
  // Pinned bytes of every registered model's weights (GET /metrics).
  uint64_t pinned_bytes() const;

 private:
  // The request's plan file, or "auto": a quick profile (in the profiler child; without one, of
  // `model` on the CPU or a fresh instance on a GPU) and the exact search. `model` is null when
  // the archive was inspected in a child.
  absl::StatusOr<grouping::GroupPlan> MakePlan(const ModelRequest& request,
                                               const models::ModelSource& source, int archive_fd,
                                               models::ZooModel* model, int layout_layers,
                                               int executed_layers);

  memdaemon::MemDaemon* const daemon_;
  const uint64_t region_bytes_;
  const AutoPlanProfile auto_plan_;
  const ArchiveInspector inspector_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<CatalogEntry>, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
  // Names being registered (false) or unloaded (true): neither registrable nor unloadable.
  std::map<std::string, bool, std::less<>> in_progress_ ABSL_GUARDED_BY(mu_);
  uint64_t pinned_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_MODEL_CATALOG_H_
