#include "frontend/byte_budget.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pswitch::frontend {

size_t ByteBudget::LimitFor(absl::string_view client) const {
  return client == kUnauthenticatedClient ? limits_.unauthenticated_bytes
                                          : limits_.per_client_bytes;
}

absl::Status ByteBudget::TryCharge(absl::string_view client, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (bytes > limits_.total_bytes - std::min(used_, limits_.total_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pswitchd holds ", limits_.total_bytes,
                     " bytes for all clients together (--max-buffered-bytes); try again later"));
  }
  auto it = by_client_.find(client);
  const size_t held = it == by_client_.end() ? 0 : it->second;
  const size_t limit = LimitFor(client);
  if (bytes > limit - std::min(held, limit)) {
    return absl::ResourceExhaustedError(
        client == kUnauthenticatedClient
            ? absl::StrCat("connections that have not authenticated may hold ", limit,
                           " bytes together; authenticate first")
            : absl::StrCat("one client may hold ", limit,
                           " bytes of requests and replies (--max-client-bytes)"));
  }
  if (it == by_client_.end()) it = by_client_.emplace(std::string(client), 0).first;
  it->second += bytes;
  used_ += bytes;
  return absl::OkStatus();
}

void ByteBudget::Release(absl::string_view client, size_t bytes) {
  if (bytes == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = by_client_.find(client);
  if (it == by_client_.end()) return;
  const size_t n = std::min(bytes, it->second);
  it->second -= n;
  used_ -= n;
  if (it->second == 0) by_client_.erase(it);  // the map holds only clients holding bytes
}

size_t ByteBudget::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

size_t ByteBudget::used_by(absl::string_view client) const {
  absl::MutexLock lock(&mu_);
  auto it = by_client_.find(client);
  return it == by_client_.end() ? 0 : it->second;
}

BudgetCharge::BudgetCharge(BudgetCharge&& other) noexcept
    : budget_(std::move(other.budget_)),
      client_(std::move(other.client_)),
      bytes_(std::exchange(other.bytes_, 0)) {}

BudgetCharge& BudgetCharge::operator=(BudgetCharge&& other) noexcept {
  if (this != &other) {
    Reset();
    budget_ = std::move(other.budget_);
    client_ = std::move(other.client_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status BudgetCharge::Resize(size_t bytes) {
  if (budget_ == nullptr) {
    bytes_ = bytes;
    return absl::OkStatus();
  }
  if (bytes > bytes_) {
    if (absl::Status s = budget_->TryCharge(client_, bytes - bytes_); !s.ok()) return s;
  } else {
    budget_->Release(client_, bytes_ - bytes);
  }
  bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status BudgetCharge::Rebind(std::string client) {
  if (client == client_) return absl::OkStatus();
  if (budget_ != nullptr && bytes_ > 0) {
    if (absl::Status s = budget_->TryCharge(client, bytes_); !s.ok()) return s;
    budget_->Release(client_, bytes_);
  }
  client_ = std::move(client);
  return absl::OkStatus();
}

}  // namespace pswitch::frontend
