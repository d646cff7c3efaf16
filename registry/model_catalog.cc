#include "registry/model_catalog.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"

namespace pswitch::registry {

absl::Status ModelCatalog::Reserve(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("model name must not be empty");
  absl::MutexLock lock(&mu_);
  auto [it, added] = models_.try_emplace(name);
  if (added) return absl::OkStatus();
  if (it->second.state == ModelState::kUnloading) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", name, "' is being unloaded; register it again once that is done"));
  }
  return absl::AlreadyExistsError(absl::StrCat("model '", name, "' already registered"));
}

absl::StatusOr<EntryRef> ModelCatalog::Settle(const std::string& name,
                                              absl::StatusOr<std::unique_ptr<CatalogEntry>> entry) {
  absl::MutexLock lock(&mu_);
  if (!entry.ok()) {
    models_.erase(name);
    return entry.status();
  }
  Slot& slot = models_.at(name);
  slot.state = ModelState::kReady;
  slot.entry = std::move(*entry);
  pinned_bytes_ += slot.entry->weight_bytes;
  return slot.entry;
}

absl::StatusOr<EntryRef> ModelCatalog::Register(const ModelRequest& request,
                                                std::vector<RegistrationPhase>* phases,
                                                PhaseObserver observer) {
  PSWITCH_RETURN_IF_ERROR(Reserve(request.name));
  PhaseClock clock(request.name, std::move(observer));
  absl::StatusOr<std::unique_ptr<CatalogEntry>> entry = pipeline_.Build(request, clock);
  if (phases != nullptr) *phases = clock.phases();
  if (!entry.ok()) {
    entry = absl::Status(entry.status().code(),
                         absl::StrCat("registering '", request.name, "' (", request.zoo_model,
                                      "): ", entry.status().message()));
  }
  return Settle(request.name, std::move(entry));
}

absl::StatusOr<EntryRef> ModelCatalog::RegisterCopy(const CatalogEntry& original,
                                                    const std::string& name,
                                                    const std::string& owner) {
  PSWITCH_RETURN_IF_ERROR(Reserve(name));
  return Settle(name, pipeline_.Copy(original, name, owner));
}

absl::StatusOr<EntryRef> ModelCatalog::Find(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end() || it->second.state != ModelState::kReady) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' is not registered"));
  }
  return it->second.entry;
}

std::vector<EntryRef> ModelCatalog::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<EntryRef> out;
  for (const auto& [name, slot] : models_) {
    if (slot.state == ModelState::kReady) out.push_back(slot.entry);
  }
  return out;
}

absl::StatusOr<EntryRef> ModelCatalog::BeginUnload(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' is not registered"));
  }
  switch (it->second.state) {
    case ModelState::kRegistering:
      return absl::FailedPreconditionError(
          absl::StrCat("model '", name, "' is still being registered"));
    case ModelState::kUnloading:
      return absl::FailedPreconditionError(
          absl::StrCat("model '", name, "' is already being unloaded"));
    case ModelState::kReady:
      break;
  }
  it->second.state = ModelState::kUnloading;
  return it->second.entry;
}

absl::Status ModelCatalog::FinishUnload(const CatalogEntry& entry) {
  absl::Status removed = pipeline_.Release(entry);
  // The store refuses only a name it does not hold: those weights are gone either way, so the
  // name is free and they no longer count as pinned.
  if (absl::IsNotFound(removed)) {
    base::Log(base::LogLevel::kWarn, "unload_weights_already_gone")
        .Field("model", entry.request.name)
        .Field("error", removed);
    removed = absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  models_.erase(entry.request.name);
  if (removed.ok()) pinned_bytes_ -= entry.weight_bytes;
  return removed;
}

uint64_t ModelCatalog::pinned_bytes() const {
  absl::MutexLock lock(&mu_);
  return pinned_bytes_;
}

}  // namespace pswitch::registry
