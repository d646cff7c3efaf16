#include "controller/region_mappings.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status.h"
#include "controller/worker_commands.h"

namespace pswitch::controller {

std::map<uint64_t, RegionMappings::Mapping>::iterator RegionMappings::Victim(
    const std::vector<uint64_t>& keep) {
  auto kept = [&keep](uint64_t id) { return std::binary_search(keep.begin(), keep.end(), id); };
  std::map<absl::string_view, size_t> per_owner;
  for (auto it = mapped_.begin(); it != mapped_.end(); ++it) {
    if (kept(it->first)) continue;
    if (it->second.region.expired()) return it;
    ++per_owner[it->second.owner];
  }
  // The principal with the most mappings gives way first (ties: the least recently used).
  auto victim = mapped_.end();
  size_t victim_owner_count = 0;
  for (auto it = mapped_.begin(); it != mapped_.end(); ++it) {
    if (kept(it->first)) continue;
    const size_t count = per_owner[it->second.owner];
    if (victim == mapped_.end() || count > victim_owner_count ||
        (count == victim_owner_count && it->second.last_used < victim->second.last_used)) {
      victim = it;
      victim_owner_count = count;
    }
  }
  return victim;
}

absl::Status RegionMappings::MapMissing(
    const std::vector<std::shared_ptr<const dataplane::TransferRegion>>& regions,
    const SendFn& send) {
  std::vector<uint64_t> needed;
  for (const auto& region : regions) {
    if (region != nullptr) needed.push_back(region->id());
  }
  std::sort(needed.begin(), needed.end());
  needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
  if (needed.size() > kMaxMappedRegions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the task's tensors lie in ", needed.size(), " transfer regions; a worker maps at most ",
        kMaxMappedRegions, " at once (RegionMappings::kMaxMappedRegions)"));
  }
  const size_t missing = static_cast<size_t>(std::count_if(
      needed.begin(), needed.end(), [this](uint64_t id) { return !mapped_.contains(id); }));
  // Room first, so the worker never maps more than the bound.
  while (mapped_.size() + missing > kMaxMappedRegions) {
    auto victim = Victim(needed);
    if (victim == mapped_.end()) break;  // cannot happen: needed.size() <= the bound
    if (!victim->second.region.expired()) ++evicted_;
    flatbuffers::FlatBufferBuilder b;
    BuildUnmapRegion(b, victim->first);
    const absl::Status sent = send(b, -1);
    mapped_.erase(victim);
    PSWITCH_RETURN_IF_ERROR(sent);
  }
  const uint64_t now = ++use_clock_;
  for (const auto& region : regions) {
    if (region == nullptr) continue;
    if (auto it = mapped_.find(region->id()); it != mapped_.end()) {
      it->second.last_used = now;
      continue;
    }
    flatbuffers::FlatBufferBuilder b;
    BuildMapRegion(b, *region);
    PSWITCH_RETURN_IF_ERROR(send(b, region->fd()));
    mapped_.emplace(region->id(), Mapping{region, region->owner(), now});
  }
  return absl::OkStatus();
}

size_t RegionMappings::UnmapExpired(const SendFn& send) {
  size_t unmapped = 0;
  for (auto it = mapped_.begin(); it != mapped_.end();) {
    if (!it->second.region.expired()) {
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
