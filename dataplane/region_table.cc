#include "dataplane/region_table.h"

#include "absl/strings/str_cat.h"

namespace pswitch::dataplane {
namespace {

absl::Status Unknown(uint64_t id) {
  return absl::NotFoundError(absl::StrCat("no transfer region ", id, " of yours"));
}
absl::Status UnknownName(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("no shared-memory region '", name, "' of yours"));
}

}  // namespace

absl::Status RegionTable::Add(std::string name, std::shared_ptr<const TransferRegion> region) {
  absl::MutexLock lock(&mu_);
  Holdings& h = owners_[region->owner()];
  auto fail = [&](absl::Status s) {
    if (h.by_id.empty()) owners_.erase(region->owner());
    return s;
  };
  if (!name.empty() && h.by_name.contains(name)) {
    return fail(absl::AlreadyExistsError(
        absl::StrCat("a shared-memory region named '", name, "' is registered already")));
  }
  if (h.by_id.size() >= limits_.max_regions_per_principal) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        "you hold ", h.by_id.size(), " transfer regions, the most allowed (",
        "--max-regions-per-client); unregister one first")));
  }
  if (region->bytes() > limits_.max_bytes_per_principal - h.bytes) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        "a region of ", region->bytes(), " bytes would take your transfer regions past ",
        limits_.max_bytes_per_principal, " bytes (--max-region-bytes-per-client); you hold ",
        h.bytes)));
  }
  h.bytes += region->bytes();
  if (!name.empty()) h.by_name[name] = region->id();
  const uint64_t id = region->id();
  h.by_id.emplace(id, RegisteredRegion{std::move(name), std::move(region)});
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const TransferRegion>> RegionTable::Find(const std::string& owner,
                                                                        uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto o = owners_.find(owner);
  if (o == owners_.end()) return Unknown(id);
  auto it = o->second.by_id.find(id);
  if (it == o->second.by_id.end()) return Unknown(id);
  return it->second.region;
}

absl::StatusOr<std::shared_ptr<const TransferRegion>> RegionTable::FindByName(
    const std::string& owner, const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto o = owners_.find(owner);
  if (o == owners_.end()) return UnknownName(name);
  auto n = o->second.by_name.find(name);
  if (n == o->second.by_name.end()) return UnknownName(name);
  return o->second.by_id.at(n->second).region;
}

void RegionTable::RemoveLocked(Holdings& h, std::map<uint64_t, RegisteredRegion>::iterator it) {
  h.bytes -= it->second.region->bytes();
  if (!it->second.name.empty()) h.by_name.erase(it->second.name);
  h.by_id.erase(it);
}

absl::Status RegionTable::Remove(const std::string& owner, uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto o = owners_.find(owner);
  if (o == owners_.end()) return Unknown(id);
  auto it = o->second.by_id.find(id);
  if (it == o->second.by_id.end()) return Unknown(id);
  RemoveLocked(o->second, it);
  if (o->second.by_id.empty()) owners_.erase(o);
  return absl::OkStatus();
}

absl::Status RegionTable::RemoveByName(const std::string& owner, const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto o = owners_.find(owner);
  if (o == owners_.end()) return UnknownName(name);
  auto n = o->second.by_name.find(name);
  if (n == o->second.by_name.end()) return UnknownName(name);
  RemoveLocked(o->second, o->second.by_id.find(n->second));
  if (o->second.by_id.empty()) owners_.erase(o);
  return absl::OkStatus();
}

void RegionTable::RemoveAll(const std::string& owner, RegionKind kind) {
  absl::MutexLock lock(&mu_);
  auto o = owners_.find(owner);
  if (o == owners_.end()) return;
  for (auto it = o->second.by_id.begin(); it != o->second.by_id.end();) {
    auto next = std::next(it);
    if (it->second.region->kind() == kind) RemoveLocked(o->second, it);
    it = next;
  }
  if (o->second.by_id.empty()) owners_.erase(o);
}

void RegionTable::RemoveIds(const std::string& owner, const std::vector<uint64_t>& ids) {
  absl::MutexLock lock(&mu_);
  auto o = owners_.find(owner);
  if (o == owners_.end()) return;
  for (uint64_t id : ids) {
    auto it = o->second.by_id.find(id);
    if (it != o->second.by_id.end()) RemoveLocked(o->second, it);
  }
  if (o->second.by_id.empty()) owners_.erase(o);
}

std::vector<RegisteredRegion> RegionTable::List(const std::string& owner, RegionKind kind) const {
  std::vector<RegisteredRegion> out;
  absl::MutexLock lock(&mu_);
  auto o = owners_.find(owner);
  if (o == owners_.end()) return out;
  for (const auto& [name, id] : o->second.by_name) {
    const RegisteredRegion& r = o->second.by_id.at(id);
    if (r.region->kind() == kind) out.push_back(r);
  }
  for (const auto& [id, r] : o->second.by_id) {
    if (r.name.empty() && r.region->kind() == kind) out.push_back(r);
  }
  return out;
}

size_t RegionTable::size() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [owner, h] : owners_) n += h.by_id.size();
  return n;
}

}  // namespace pswitch::dataplane
