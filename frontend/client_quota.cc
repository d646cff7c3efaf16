#include "frontend/client_quota.h"

#include "absl/strings/str_cat.h"

namespace pswitch::frontend {

absl::Status ClientQuota::Admit(const std::string& client) {
  absl::MutexLock lock(&mu_);
  size_t& count = unfinished_[client];
  if (count >= max_per_client_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "'", client, "' already has ", count,
        " unfinished tasks, the most one client may have (--max-tasks-per-client); wait for "
        "some to finish"));
  }
  ++count;
  return absl::OkStatus();
}

void ClientQuota::Done(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = unfinished_.find(client);
  if (it == unfinished_.end()) return;
  // Entries go with their last task: the map holds only clients with work in flight.
  if (--it->second == 0) unfinished_.erase(it);
}

size_t ClientQuota::unfinished(const std::string& client) const {
  absl::MutexLock lock(&mu_);
  auto it = unfinished_.find(client);
  return it == unfinished_.end() ? 0 : it->second;
}

}  // namespace pswitch::frontend
