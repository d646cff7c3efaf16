// What a registration is asked for (ModelRequest), what it produces (CatalogEntry: a model's
// definition, plan, specs and pinned weights) and what each of its phases took.
#ifndef PSWITCH_REGISTRY_MODEL_ENTRY_H_
#define PSWITCH_REGISTRY_MODEL_ENTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/confined_dir.h"
#include "base/unique_fd.h"
#include "grouping/plan.h"
#include "memdaemon/weight_store.h"
#include "proto/common_generated.h"

namespace pswitch::registry {

// Fill jobs' private models are registered as kFillModelPrefix + job id; clients cannot use it.
inline constexpr char kFillModelPrefix[] = "fill-";

// Largest batch a model is registered with, or a training task asks for.
inline constexpr uint32_t kMaxBatchSize = 4096;

// What a registered model's warm-up at load (worker/warm_up.h) prepares it for.
enum class WarmFor {
  kServing,        // a forward at its batch; a training step if it is trainable
  kFillInference,  // a fill job's inference step, timed (its first bubble is admitted by it)
  kFillTraining,   // a fill job's training step, timed; the job fails if it fails
};

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
  WarmFor warm_for = WarmFor::kServing;
  // A zoo model's precision (models/model_dtype.h); empty: float32. An archive keeps its own.
  std::string dtype;
  // Once its weights are resident on a GPU they are never evicted (the weights cache): the
  // operator's choice for a model that must always answer warm.
  bool pin_resident = false;
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
  TensorSpec input;                                // "input"
  TensorSpec output;                               // "output"
  const memdaemon::StoredModel* stored = nullptr;  // owned by the memdaemon's weight store
  // `stored`'s layer count and bytes, for front ends (which must not read `stored`).
  uint32_t layers = 0;
  uint64_t weight_bytes = 0;
  grouping::GroupPlan plan;                // covers every layout layer
  std::vector<uint32_t> group_last_layer;  // plan as the worker protocol wants it
  // The layout index of each layer a training forward runs, in its order (the inspection's):
  // with the stored layout, what workers bind and gate the model by.
  std::vector<uint32_t> train_order;
  uint64_t optimizer_slot_bytes = 0;       // models::OptimizerSlotBytes of the model
  // A script model's archive as a sealed memory file, passed to every worker that loads it.
  std::shared_ptr<const UniqueFd> archive;
  uint64_t archive_bytes = 0;
  // Whether training tasks may run on it (a script model exported without a loss may not).
  absl::Status trainable;
};

using EntryRef = std::shared_ptr<const CatalogEntry>;

// One phase of a registration and its wall time, in the order they ran: "read" (files read and
// sealed), "inspect" (the model's facts), "profile" (an "auto" plan's layer profile), "plan"
// (the grouping search, or the plan file checked), "pin" (weights into the pinned store), "load"
// (every worker built and bound it, warm-ups included).
struct RegistrationPhase {
  std::string name;
  absl::Duration took;  // a running phase's: so far
  // Empty once the phase has ended; while it runs, how far it has come ("profiling: run 2 of 4").
  std::string detail;
  bool running() const { return !detail.empty(); }
};

}  // namespace pswitch::registry

#endif  // PSWITCH_REGISTRY_MODEL_ENTRY_H_
