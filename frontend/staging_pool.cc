#include "frontend/staging_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pswitch::frontend {
namespace {

// Sizes are rounded up to this, so requests of about one size share a region.
constexpr uint64_t kGranuleBytes = 64 << 10;

uint64_t RoundUp(uint64_t bytes) { return (bytes + kGranuleBytes - 1) / kGranuleBytes * kGranuleBytes; }

}  // namespace

std::shared_ptr<StagingPool> StagingPool::Create(std::string owner, BudgetCharge charge,
                                                 size_t max_idle) {
  return std::shared_ptr<StagingPool>(new StagingPool(std::move(owner), std::move(charge), max_idle));
}

StagingPool::Lease::~Lease() { pool_->Return(std::move(mapping_)); }

absl::StatusOr<std::shared_ptr<StagingPool::Lease>> StagingPool::Acquire(uint64_t bytes) {
  return Acquire(bytes, owner_);
}

absl::StatusOr<std::shared_ptr<StagingPool::Lease>> StagingPool::Acquire(
    uint64_t bytes, const std::string& holder) {
  if (bytes == 0 || bytes > UINT64_MAX - kGranuleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a staging region of ", bytes, " bytes"));
  }
  const uint64_t size = RoundUp(bytes);
  absl::MutexLock lock(&mu_);
  SweepReturnedLocked();
  // The smallest idle region of the holder's that fits, however much larger: it is mapped here
  // and in the workers and charged already, while a new one costs a memory file, page faults on
  // both sides and, for the one it replaces, unmapping in both (milliseconds at tens of MB, for a
  // client whose sizes vary paid on every request). Never another principal's: its bytes (and
  // the slack between its tensors) are still there; a fresh region's pages are zeros.
  auto best = idle_.end();
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    if ((*it)->region()->owner() != holder) continue;
    const uint64_t have = (*it)->region()->bytes();
    if (have < size) continue;
    if (best == idle_.end() || have < (*best)->region()->bytes()) best = it;
  }
  if (best != idle_.end()) {
    std::unique_ptr<StagingMapping> mapping = std::move(*best);
    idle_.erase(best);
    return std::shared_ptr<Lease>(new Lease(shared_from_this(), std::move(mapping)));
  }
  // A new region: charged first; idle ones that do not fit this request make room.
  absl::Status charged = charge_.Resize(mapped_ + size);
  while (!charged.ok() && !idle_.empty()) {
    DropLocked(std::move(idle_.front()));
    idle_.pop_front();
    charged = charge_.Resize(mapped_ + size);
  }
  if (!charged.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a raw payload's staging of ", size, " bytes does not fit: ",
                     charged.message()));
  }
  absl::StatusOr<std::unique_ptr<StagingMapping>> mapping = StagingMapping::Create(size, holder);
  if (!mapping.ok()) {
    (void)charge_.Resize(mapped_);
    return mapping.status();
  }
  mapped_ += size;
  ++created_;
  return std::shared_ptr<Lease>(new Lease(shared_from_this(), *std::move(mapping)));
}

void StagingPool::Return(std::unique_ptr<StagingMapping> mapping) {
  absl::MutexLock lock(&mu_);
  returned_.push_back(std::move(mapping));
  SweepReturnedLocked();
}

void StagingPool::SweepReturnedLocked() {
  for (auto it = returned_.begin(); it != returned_.end();) {
    // Only this mapping holds the region: no task (and so no worker's run) can touch it now.
    if ((*it)->region().use_count() > 1) {
      ++it;
      continue;
    }
    idle_.push_back(std::move(*it));
    it = returned_.erase(it);
  }
  while (idle_.size() > max_idle_) {
    DropLocked(std::move(idle_.front()));
    idle_.pop_front();
  }
}

void StagingPool::DropLocked(std::unique_ptr<StagingMapping> mapping) {
  mapped_ -= mapping->region()->bytes();
  mapping.reset();
  (void)charge_.Resize(mapped_);  // shrinking: cannot fail
}

void StagingPool::DropIdle() {
  absl::MutexLock lock(&mu_);
  SweepReturnedLocked();
  while (!idle_.empty()) {
    DropLocked(std::move(idle_.front()));
    idle_.pop_front();
  }
}

size_t StagingPool::idle() const {
  absl::MutexLock lock(&mu_);
  return idle_.size();
}

uint64_t StagingPool::mapped_bytes() const {
  absl::MutexLock lock(&mu_);
  return mapped_;
}

uint64_t StagingPool::created() const {
  absl::MutexLock lock(&mu_);
  return created_;
}

}  // namespace pswitch::frontend
