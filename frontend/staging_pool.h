// One connection's staging regions for raw TCP payloads (docs/dataplane.md, "TCP raw payload"):
// a request's bytes are received straight into a region pswitchd maps, the worker reads them
// (and writes the outputs) there, and the reply's raw payload is sent from it. Regions are kept
// mapped and reused between requests, so their pages stay faulted in here and the workers, which
// map a region once while anyone holds it, keep their mapping too.
//
// Every byte the pool maps (in use or idle) is charged to the connection's client before it is
// mapped: a connection cannot make pswitchd hold more staging than its share of the byte budget.
// A returned region is reused only once nothing else holds it (the task that used it may end a
// moment after its answer: a worker's late write must never land in another request's bytes),
// and only for the principal it was made for: a region never holds two principals' bytes, so
// nothing one principal's requests left in it (tensors, the gaps between them, outputs) can
// reach another's request, its output room, or the worker running it. A new region is zeros.
#ifndef PSWITCH_FRONTEND_STAGING_POOL_H_
#define PSWITCH_FRONTEND_STAGING_POOL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "frontend/byte_budget.h"
#include "frontend/staging_mapping.h"

namespace pswitch::frontend {

// Thread-safe (leases may end on scheduler threads). Leases keep their pool alive.
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // Regions are owned by `owner` (the principal whose requests fill them) unless Acquire names
  // another holder; `charge` is where their bytes are counted. At most `max_idle` unused regions
  // stay mapped.
  static std::shared_ptr<StagingPool> Create(std::string owner, BudgetCharge charge,
                                             size_t max_idle = 2);
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // One region in use: the request's, until the lease goes (then back to the pool).
  class Lease {
   public:
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    uint8_t* data() const { return mapping_->data(); }
    uint64_t bytes() const { return mapping_->region()->bytes(); }
    const std::shared_ptr<const dataplane::TransferRegion>& region() const {
      return mapping_->region();
    }

   private:
    friend class StagingPool;
    Lease(std::shared_ptr<StagingPool> pool, std::unique_ptr<StagingMapping> mapping)
        : pool_(std::move(pool)), mapping_(std::move(mapping)) {}
    const std::shared_ptr<StagingPool> pool_;
    std::unique_ptr<StagingMapping> mapping_;
  };

  // A mapped region of at least `bytes` (> 0) for the pool's owner: Acquire(bytes, owner()).
  absl::StatusOr<std::shared_ptr<Lease>> Acquire(uint64_t bytes);
  // A mapped region of at least `bytes` (> 0) owned by `holder` (the principal whose request
  // fills it): the smallest idle one of `holder`'s that fits, else a new one (zeros); another principal's idle region is never handed out. ResourceExhausted
  // when its bytes do not fit the client's budget even after idle regions are dropped; the
  // mapping's errors otherwise.
  absl::StatusOr<std::shared_ptr<Lease>> Acquire(uint64_t bytes, const std::string& holder);
  // Drops (unmaps) every idle region: the connection closed.
  void DropIdle();

  const std::string& owner() const { return owner_; }
  // For tests and logs.
  size_t idle() const;
  uint64_t mapped_bytes() const;
  uint64_t created() const;

 private:
  StagingPool(std::string owner, BudgetCharge charge, size_t max_idle)
      : owner_(std::move(owner)), max_idle_(max_idle), charge_(std::move(charge)) {}
  void Return(std::unique_ptr<StagingMapping> mapping);
  // Moves returned regions nothing else holds any more to idle_.
  void SweepReturnedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLocked(std::unique_ptr<StagingMapping> mapping) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string owner_;
  const size_t max_idle_;
  mutable absl::Mutex mu_;
  BudgetCharge charge_ ABSL_GUARDED_BY(mu_);  // every mapped byte, in use or not
  std::deque<std::unique_ptr<StagingMapping>> idle_ ABSL_GUARDED_BY(mu_);  // oldest first
  // Back from their request but still held elsewhere (a task that has not let go yet).
  std::vector<std::unique_ptr<StagingMapping>> returned_ ABSL_GUARDED_BY(mu_);
  uint64_t mapped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t created_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_STAGING_POOL_H_
