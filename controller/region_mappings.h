// Which transfer regions one worker process has mapped (docs/dataplane.md): a region is mapped
// (MapRegion with its fd) before the first Run that uses it, and unmapped (UnmapRegion) once no
// task or table holds it any more. Held weakly, so the mapping never keeps a region alive. A
// new process starts with nothing mapped (a fresh RegionMappings).
//
// The worker's mappings are bounded (kMaxMappedRegions) but shared by every principal whose
// tasks it runs, so the bound must never let one principal's regions (registered areas and
// shared memory stay mapped while registered) make another's task fail. When a task needs room,
// mappings the task does not use are unmapped first: those of the principal that holds the most
// mappings, least recently used first. That is safe while regions are still registered or held:
// the worker runs its commands in order, so every Run before the UnmapRegion has finished with
// the region, and a later task that needs it again maps it again. Only a task that alone needs
// more regions than the bound is refused.
//
// Loop thread only, like its WorkerPool.
#ifndef PSWITCH_CONTROLLER_REGION_MAPPINGS_H_
#define PSWITCH_CONTROLLER_REGION_MAPPINGS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dataplane/transfer_region.h"
#include "flatbuffers/flatbuffers.h"

namespace pswitch::controller {

class RegionMappings {
 public:
  // How many regions one worker keeps mapped at most (its address space and fd table are
  // finite; the worker itself refuses beyond 4,096). RegionTable bounds each principal's
  // registered regions (--max-regions-per-client, 64 by default); this bound is the worker's.
  static constexpr size_t kMaxMappedRegions = 1024;
  // Sends one command to the worker, with `fd` (-1: none).
  using SendFn = std::function<absl::Status(const flatbuffers::FlatBufferBuilder&, int fd)>;

  // Sends a MapRegion for each of `regions` the worker has not mapped, after an UnmapRegion for
  // each mapping evicted to make room (see the file comment). ResourceExhausted naming the bound
  // (nothing sent) when `regions` alone are more than kMaxMappedRegions distinct regions; a
  // send's error otherwise (what was sent before it stays recorded).
  absl::Status MapMissing(
      const std::vector<std::shared_ptr<const dataplane::TransferRegion>>& regions,
      const SendFn& send);
  // Sends an UnmapRegion for each mapped region nothing holds any more; returns how many. A
  // region whose UnmapRegion cannot be sent is forgotten all the same (its worker is dying).
  size_t UnmapExpired(const SendFn& send);
  // Drops the record of `region_id` without an UnmapRegion: its MapRegion failed in the worker,
  // so the next MapMissing that needs it sends it again. False when it was not recorded.
  bool Forget(uint64_t region_id) { return mapped_.erase(region_id) > 0; }
  bool mapped(uint64_t region_id) const { return mapped_.contains(region_id); }
  size_t size() const { return mapped_.size(); }
  // Mappings of regions still held that were unmapped to make room (logs, tests).
  uint64_t evicted() const { return evicted_; }

 private:
  struct Mapping {
    std::weak_ptr<const dataplane::TransferRegion> region;
    std::string owner;   // the principal whose region it is
    uint64_t last_used;  // use_clock_ at the last Run that named it
  };
  // The mapping to evict for room: any expired one, else the least recently used of the
  // principal holding the most mappings; never one in `keep`. end() when there is none.
  std::map<uint64_t, Mapping>::iterator Victim(const std::vector<uint64_t>& keep);

  std::map<uint64_t, Mapping> mapped_;
  uint64_t use_clock_ = 0;
  uint64_t evicted_ = 0;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_REGION_MAPPINGS_H_
