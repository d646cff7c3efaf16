// One budget for every byte a client can make pswitchd hold: incomplete TCP frames, queued
// replies, HTTP request bodies and the tensors decoded from them, across every connection of
// both ports. Each client may hold at most a share of it, and connections that have not
// authenticated yet draw on a small pool of their own, so they can never crowd out the clients
// that have.
#ifndef PSWITCH_FRONTEND_BYTE_BUDGET_H_
#define PSWITCH_FRONTEND_BYTE_BUDGET_H_

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace pswitch::frontend {

// The client that connections before authentication charge.
inline constexpr absl::string_view kUnauthenticatedClient = "";

struct ByteBudgetLimits {
  size_t total_bytes = size_t{1} << 30;
  size_t per_client_bytes = size_t{512} << 20;
  // Every unauthenticated connection together (both ports).
  size_t unauthenticated_bytes = size_t{16} << 20;
};

// Thread-safe.
class ByteBudget {
 public:
  explicit ByteBudget(ByteBudgetLimits limits) : limits_(limits) {}
  ByteBudget(const ByteBudget&) = delete;
  ByteBudget& operator=(const ByteBudget&) = delete;

  // Charges `bytes` to `client` (kUnauthenticatedClient before authentication). On
  // ResourceExhausted (naming the limit reached) nothing is charged.
  absl::Status TryCharge(absl::string_view client, size_t bytes);
  // Returns bytes charged to `client` earlier (never more than it holds).
  void Release(absl::string_view client, size_t bytes);

  size_t used() const;
  size_t used_by(absl::string_view client) const;
  const ByteBudgetLimits& limits() const { return limits_; }

 private:
  size_t LimitFor(absl::string_view client) const;

  const ByteBudgetLimits limits_;
  mutable absl::Mutex mu_;
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, size_t, std::less<>> by_client_ ABSL_GUARDED_BY(mu_);
};

// What one holder (a connection's buffer, a request body) has charged to one client, released
// exactly once when it goes. Not thread-safe: one owner.
class BudgetCharge {
 public:
  BudgetCharge() = default;  // charges nothing, to no budget
  // `budget` may be null (no bound).
  BudgetCharge(std::shared_ptr<ByteBudget> budget, std::string client)
      : budget_(std::move(budget)), client_(std::move(client)) {}
  ~BudgetCharge() { Reset(); }
  BudgetCharge(BudgetCharge&& other) noexcept;
  BudgetCharge& operator=(BudgetCharge&& other) noexcept;
  BudgetCharge(const BudgetCharge&) = delete;
  BudgetCharge& operator=(const BudgetCharge&) = delete;

  // Holds exactly `bytes` from now on (growing or shrinking); on error the holding is unchanged.
  absl::Status Resize(size_t bytes);
  // Adds `bytes` to what is held.
  absl::Status Grow(size_t bytes) { return Resize(bytes_ + bytes); }
  // Moves what is held to `client` (a connection that authenticated); on error nothing moves.
  absl::Status Rebind(std::string client);
  void Reset() { (void)Resize(0); }

  size_t bytes() const { return bytes_; }
  const std::string& client() const { return client_; }

 private:
  std::shared_ptr<ByteBudget> budget_;
  std::string client_;
  size_t bytes_ = 0;
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_BYTE_BUDGET_H_
