// Which transfer regions one worker process has mapped (docs/dataplane.md): a region is mapped
// (MapRegion with its fd) before the first Run that uses it, and unmapped (UnmapRegion) once no
// task or table holds it any more. Held weakly, so the mapping never keeps a region alive. A
// new process starts with nothing mapped (a fresh RegionMappings).
//
// Loop thread only, like its WorkerPool.
#ifndef PSWITCH_CONTROLLER_REGION_MAPPINGS_H_
#define PSWITCH_CONTROLLER_REGION_MAPPINGS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "dataplane/transfer_region.h"
#include "flatbuffers/flatbuffers.h"

namespace pswitch::controller {

class RegionMappings {
 public:
  // How many regions one worker keeps mapped at most (its address space and fd table are
  // finite; RegionTable bounds each client to 64 by default).
  static constexpr size_t kMaxMappedRegions = 1024;
  // Sends one command to the worker, with `fd` (-1: none).
  using SendFn = std::function<absl::Status(const flatbuffers::FlatBufferBuilder&, int fd)>;

  // Sends a MapRegion for each of `regions` the worker has not mapped. ResourceExhausted (and
  // nothing sent) when the worker would map more than kMaxMappedRegions; a send's error
  // otherwise (those sent before it stay recorded).
  absl::Status MapMissing(
      const std::vector<std::shared_ptr<const dataplane::TransferRegion>>& regions,
      const SendFn& send);
  // Sends an UnmapRegion for each mapped region nothing holds any more; returns how many. A
  // region whose UnmapRegion cannot be sent is forgotten all the same (its worker is dying).
  size_t UnmapExpired(const SendFn& send);
  bool mapped(uint64_t region_id) const { return mapped_.contains(region_id); }
  size_t size() const { return mapped_.size(); }

 private:
  std::map<uint64_t, std::weak_ptr<const dataplane::TransferRegion>> mapped_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_REGION_MAPPINGS_H_
