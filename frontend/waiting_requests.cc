#include "frontend/waiting_requests.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pswitch::frontend {
uint64_t WaitingRequests::Add(HttpRespond respond, std::string what) {
  {
    absl::MutexLock lock(&mu_);
    if (!Stopped()) {
      const uint64_t id = ++next_;
      waiting_.emplace(id, Waiting{std::move(respond), absl::Now() + timeout_, std::move(what)});
      return id;
    }
  }
  respond(JsonError(503, "pswitchd is shutting down"));
  return 0;
}

HttpRespond WaitingRequests::Take(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return nullptr;
  HttpRespond respond = std::move(it->second.respond);
  waiting_.erase(it);
  return respond;
}

bool WaitingRequests::Run(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  return !Stopped() && pool_->Submit(std::move(work));
}

bool WaitingRequests::SweepAndWait(absl::Duration period) {
  std::vector<Waiting> late;
  {
    absl::MutexLock lock(&mu_);
    if (Stopped()) return false;
    const absl::Time now = absl::Now();
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      late.push_back(std::move(it->second));
      it = waiting_.erase(it);
    }
  }
  for (Waiting& w : late) {
    w.respond(JsonError(
        504, absl::StrCat(w.what, " is still going on after ", absl::FormatDuration(timeout_))));
  }
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &WaitingRequests::Stopped), period);
  return !Stopped();
}

void WaitingRequests::Stop() {
  std::map<uint64_t, Waiting> left;
  {
    absl::MutexLock lock(&mu_);
    pool_ = nullptr;
    left.swap(waiting_);
  }
  // Their tasks may still finish; the answer is dropped (Take finds nothing).
  for (auto& [id, w] : left) w.respond(JsonError(503, "pswitchd is shutting down"));
}

}  // namespace pswitch::frontend
