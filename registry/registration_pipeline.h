// How a registration makes a model's entry, phase by phase (each timed: PhaseClock): read and
// seal its files; inspect it, and profile it for an "auto" plan (pswitchd: both in one bounded
// child, InspectInChild); fix its grouping plan (a plan file, or "auto": the exact grouping
// search over that profile); check its weights' layout against the weights region; pin its weights
// in the memdaemon's store. Names and states are the catalog's (registry/model_catalog.h).
#ifndef PSWITCH_REGISTRY_REGISTRATION_PIPELINE_H_
#define PSWITCH_REGISTRY_REGISTRATION_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grouping/plan.h"
#include "grouping/profile.h"
#include "memdaemon/memdaemon.h"
#include "models/model_facts.h"
#include "registry/inspection_child.h"
#include "registry/model_entry.h"
#include "registry/phase_clock.h"

namespace pswitch::registry {

// A registration's one look at a model: its facts, with its profile when the request asks for
// one. pswitchd's runs in a bounded child (InspectInChild) and pswitchd never links libtorch;
// library use and tests may look in their own process (models::InspectInProcess).
using ModelInspector =
    std::function<absl::StatusOr<models::ModelFacts>(const InspectionRequest& request)>;

// Thread-safe (const): registrations of different names may run at once. `*daemon` must
// outlive it.
class RegistrationPipeline {
 public:
  // This process never builds a model: `inspector` looks at it (Build fails without one).
  RegistrationPipeline(memdaemon::MemDaemon* daemon, uint64_t region_bytes,
                       ModelInspector inspector)
      : daemon_(daemon), region_bytes_(region_bytes), inspector_(std::move(inspector)) {}

  // The entry `request` describes, its weights pinned under request.name, each phase ended on
  // `clock`. InvalidArgument for a bad request (bad weights, archive or plan), NotFound for an
  // unknown zoo model, ResourceExhausted when the model exceeds the weights region or the
  // inspection's memory bound. Nothing stays pinned on error.
  absl::StatusOr<std::unique_ptr<CatalogEntry>> Build(const ModelRequest& request,
                                                      PhaseClock& clock) const;
  // `original` as `name`, owned by `owner`: the same definition, archive and plan, and the
  // weights its pinned store holds now, pinned again under `name` (in the same layout, so its
  // plan carries over). Call where `original` cannot be unloaded meanwhile.
  absl::StatusOr<std::unique_ptr<CatalogEntry>> Copy(const CatalogEntry& original,
                                                     const std::string& name,
                                                     const std::string& owner) const;
  // Frees `entry`'s pinned weights (its tasks and copies are over).
  absl::Status Release(const CatalogEntry& entry) const;

 private:
  // The request's plan file, or "auto": the exact search over the inspector's profile
  // (`profile_json`, untrusted text).
  absl::StatusOr<grouping::GroupPlan> MakePlan(const ModelRequest& request,
                                               const std::string& profile_json, int layout_layers,
                                               int executed_layers, PhaseClock& clock) const;

  memdaemon::MemDaemon* const daemon_;
  const uint64_t region_bytes_;
  const ModelInspector inspector_;
};

}  // namespace pswitch::registry

#endif  // PSWITCH_REGISTRY_REGISTRATION_PIPELINE_H_
