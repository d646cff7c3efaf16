// The transfer regions clients have registered, per principal, with bounds on how many and how
// large (docs/dataplane.md). A principal sees only its own regions: another's and a missing one
// get the same NotFound, so no one can probe for others' names or ids. Thread-safe.
#ifndef PSWITCH_DATAPLANE_REGION_TABLE_H_
#define PSWITCH_DATAPLANE_REGION_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dataplane/transfer_region.h"

namespace pswitch::dataplane {

struct RegionLimits {
  size_t max_regions_per_principal = 64;
  uint64_t max_bytes_per_principal = uint64_t{16} << 30;
};

struct RegisteredRegion {
  std::string name;  // Triton's region name; empty for an area (named by id)
  std::shared_ptr<const TransferRegion> region;
};

class RegionTable {
 public:
  explicit RegionTable(RegionLimits limits = {}) : limits_(limits) {}

  // Adds `region` for its owner under `name` (empty: by id only). AlreadyExists for a name the
  // owner uses already; ResourceExhausted naming the bound when the owner would hold more
  // regions or bytes than allowed.
  absl::Status Add(std::string name, std::shared_ptr<const TransferRegion> region);
  // The owner's region `id` / `name`; NotFound otherwise (another's included).
  absl::StatusOr<std::shared_ptr<const TransferRegion>> Find(const std::string& owner,
                                                             uint64_t id) const;
  absl::StatusOr<std::shared_ptr<const TransferRegion>> FindByName(const std::string& owner,
                                                                   const std::string& name) const;
  // Removes it; tasks that hold it keep it mapped until they end. NotFound as Find.
  absl::Status Remove(const std::string& owner, uint64_t id);
  absl::Status RemoveByName(const std::string& owner, const std::string& name);
  // Removes every region of `owner` of `kind` (Triton's unregister-all), or with these ids (a
  // connection's areas when it closes).
  void RemoveAll(const std::string& owner, RegionKind kind);
  void RemoveIds(const std::string& owner, const std::vector<uint64_t>& ids);
  // The owner's regions of `kind`, by name.
  std::vector<RegisteredRegion> List(const std::string& owner, RegionKind kind) const;

  size_t size() const;
  const RegionLimits& limits() const { return limits_; }

 private:
  struct Holdings {
    std::map<uint64_t, RegisteredRegion> by_id;
    std::map<std::string, uint64_t> by_name;
    uint64_t bytes = 0;
  };
  void RemoveLocked(Holdings& holdings, std::map<uint64_t, RegisteredRegion>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegionLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, Holdings> owners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::dataplane

#endif  // PSWITCH_DATAPLANE_REGION_TABLE_H_
