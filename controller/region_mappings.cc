#include "controller/region_mappings.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "controller/worker_commands.h"

namespace pswitch::controller {

absl::Status RegionMappings::MapMissing(
    const std::vector<std::shared_ptr<const dataplane::TransferRegion>>& regions,
    const SendFn& send) {
  std::set<uint64_t> missing;
  for (const auto& region : regions) {
    if (region != nullptr && !mapped_.contains(region->id())) missing.insert(region->id());
  }
  if (mapped_.size() + missing.size() > kMaxMappedRegions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the worker maps ", mapped_.size(), " transfer regions still in use and the task needs ",
        missing.size(), " more: at most ", kMaxMappedRegions));
  }
  for (const auto& region : regions) {
    if (region == nullptr || mapped_.contains(region->id())) continue;
    flatbuffers::FlatBufferBuilder b;
    BuildMapRegion(b, *region);
    PSWITCH_RETURN_IF_ERROR(send(b, region->fd()));
    mapped_.emplace(region->id(), region);
  }
  return absl::OkStatus();
}

size_t RegionMappings::UnmapExpired(const SendFn& send) {
  size_t unmapped = 0;
  for (auto it = mapped_.begin(); it != mapped_.end();) {
    if (!it->second.expired()) {
      ++it;
      continue;
    }
    flatbuffers::FlatBufferBuilder b;
    BuildUnmapRegion(b, it->first);
    (void)send(b, -1);
    it = mapped_.erase(it);
    ++unmapped;
  }
  return unmapped;
}

}  // namespace pswitch::controller
