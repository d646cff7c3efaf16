// The registered models by name, each in an explicit state: kRegistering while its pipeline
// runs (the name is taken, the model not yet served), kReady, kUnloading while its tasks finish
// (the name still taken, so it cannot be registered again before its weights are gone). How an
// entry is made is the RegistrationPipeline's.
#ifndef PSWITCH_REGISTRY_MODEL_CATALOG_H_
#define PSWITCH_REGISTRY_MODEL_CATALOG_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "memdaemon/memdaemon.h"
#include "registry/model_entry.h"
#include "registry/registration_pipeline.h"

namespace pswitch::registry {

enum class ModelState { kRegistering, kReady, kUnloading };

// Thread-safe. `*daemon` must outlive the catalog.
class ModelCatalog {
 public:
  // `inspector` looks at every model registered (RegistrationPipeline).
  ModelCatalog(memdaemon::MemDaemon* daemon, uint64_t region_bytes, ModelInspector inspector)
      : pipeline_(daemon, region_bytes, std::move(inspector)) {}

  // Slow (its inspector builds and profiles the model): call off the scheduling thread. Takes the
  // name, runs the pipeline (its phases appended to `*phases` when set), and makes the model ready.
  // The pipeline's errors, AlreadyExists for a name taken, FailedPrecondition for one being
  // unloaded; nothing is registered on error and the name is free again.
  absl::StatusOr<EntryRef> Register(const ModelRequest& request,
                                    std::vector<RegistrationPhase>* phases = nullptr,
                                    PhaseObserver observer = nullptr);
  // Registers `name`, a copy of registered model `original` owned by `owner`
  // (RegistrationPipeline::Copy). Call where `original` cannot be unloaded meanwhile (the
  // registration thread). AlreadyExists, ResourceExhausted as Register.
  absl::StatusOr<EntryRef> RegisterCopy(const CatalogEntry& original, const std::string& name,
                                        const std::string& owner);
  // A ready model; NotFound otherwise.
  absl::StatusOr<EntryRef> Find(absl::string_view name) const;
  std::vector<EntryRef> List() const;  // the ready ones

  // Unload, in two steps. BeginUnload takes the model out (Find and List no longer see it, new
  // tasks on it are refused) while its name stays taken (kUnloading). NotFound for an unknown
  // model; FailedPrecondition while it is still being registered or already being unloaded.
  absl::StatusOr<EntryRef> BeginUnload(absl::string_view name);
  // Once nothing runs or copies it any more: frees its pinned weights and releases the name
  // (weights already gone from the store count as freed, with a warning).
  absl::Status FinishUnload(const CatalogEntry& entry);
  // Pinned bytes of every registered model's weights (GET /metrics).
  uint64_t pinned_bytes() const;

 private:
  struct Slot {
    ModelState state = ModelState::kRegistering;
    std::shared_ptr<const CatalogEntry> entry;  // set once ready
  };
  // Takes `name` for a registration (kRegistering).
  absl::Status Reserve(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the registration of `name`: ready with `entry`, or (an error) the name freed.
  absl::StatusOr<EntryRef> Settle(const std::string& name,
                                  absl::StatusOr<std::unique_ptr<CatalogEntry>> entry)
      ABSL_LOCKS_EXCLUDED(mu_);

  const RegistrationPipeline pipeline_;
  mutable absl::Mutex mu_;
  std::map<std::string, Slot, std::less<>> models_ ABSL_GUARDED_BY(mu_);
  uint64_t pinned_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pswitch::registry

#endif  // PSWITCH_REGISTRY_MODEL_CATALOG_H_
