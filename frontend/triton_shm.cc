#include "frontend/triton_shm.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/text.h"

namespace pswitch::frontend {
namespace {

using dataplane::RegionKind;
using dataplane::RegisteredRegion;
using dataplane::TransferRegion;

// One answer for a segment that is missing, another user's, a link or not a regular file: which
// of these it is would tell a caller about names it may not map.
absl::Status NoSegment(absl::string_view key) {
  return absl::NotFoundError(
      absl::StrCat("no shared-memory segment '", absl::CHexEscape(key),
                   "' of yours: it must be a regular file (not a link) under /dev/shm that "
                   "your uid owns"));
}

}  // namespace

absl::StatusOr<UniqueFd> OpenShmSegment(int shm_dir_fd, absl::string_view key, uid_t owner_uid) {
  // shm_open("/name") names /dev/shm/name; anything that could leave the directory is refused
  // before the file system is asked.
  absl::string_view name = key;
  if (!name.empty() && name.front() == '/') name.remove_prefix(1);
  if (name.empty() || name == "." || name == ".." || name.size() > NAME_MAX ||
      name.find('/') != absl::string_view::npos || name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shared-memory key is \"/name\" (one name under /dev/shm, at most ",
                     NAME_MAX, " bytes), not '", absl::CHexEscape(key.substr(0, 64)), "'"));
  }
  // First a path handle (O_PATH opens nothing: no lease is broken, no open or close-write event
  // reaches another user's watches), checked; only the caller's own regular file is then opened
  // for reading and writing, through that same handle, so no rename in between can swap it.
  // O_NOFOLLOW: a link to another user's file (or /etc/shadow) is not followed, even our own.
  UniqueFd path(::openat(shm_dir_fd, std::string(name).c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!path.valid()) return NoSegment(key);
  struct stat st {};
  if (::fstat(path.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != owner_uid) {
    return NoSegment(key);
  }
  // O_NONBLOCK: harmless for a regular file, and what a FIFO would need (it is refused above).
  UniqueFd fd(::open(absl::StrCat("/proc/self/fd/", path.get()).c_str(),
                     O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) return NoSegment(key);
  struct stat opened {};
  if (::fstat(fd.get(), &opened) != 0 || opened.st_ino != st.st_ino || opened.st_dev != st.st_dev) {
    return NoSegment(key);
  }
  return fd;
}

absl::Status PlaceInRegions(const dataplane::RegionTable& table, const std::string& owner,
                            InferRequest& request,
                            std::vector<std::shared_ptr<const TransferRegion>>* regions,
                            std::optional<proto::ByteSlice>* outputs_to) {
  // A Triton region (system or CUDA) of the caller's, with the slice inside it; areas are the
  // Unix socket's and have no names.
  auto slice_of = [&](const ShmReference& ref) -> absl::StatusOr<proto::ByteSlice> {
    PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<const TransferRegion> region,
                             table.FindByName(owner, ref.region));
    PSWITCH_RETURN_IF_ERROR(region->CheckSlice(ref.offset, ref.bytes));
    const bool held = std::any_of(regions->begin(), regions->end(),
                                  [&](const auto& r) { return r->id() == region->id(); });
    if (!held) regions->push_back(region);
    return proto::ByteSlice{region->id(), ref.offset, ref.bytes};
  };
  for (size_t i = 0; i < request.inputs.size() && i < request.input_regions.size(); ++i) {
    if (!request.input_regions[i]) continue;
    absl::StatusOr<proto::ByteSlice> slice = slice_of(*request.input_regions[i]);
    if (!slice.ok()) {
      return absl::Status(slice.status().code(), absl::StrCat("input '", request.inputs[i].name,
                                                              "': ", slice.status().message()));
    }
    request.inputs[i].slice = *slice;
  }
  if (request.output_regions.size() > 1) {
    return absl::InvalidArgumentError(
        "a pswitch model has one output: at most one output may name a shared-memory region");
  }
  if (!request.output_regions.empty()) {
    const auto& [name, ref] = request.output_regions.front();
    absl::StatusOr<proto::ByteSlice> slice = slice_of(ref);
    if (!slice.ok()) {
      return absl::Status(slice.status().code(), absl::StrCat("output '", absl::CHexEscape(name),
                                                              "': ", slice.status().message()));
    }
    *outputs_to = *slice;
  }
  return absl::OkStatus();
}

absl::Status CheckRegionName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("a shared-memory region needs a name");
  return base::CheckText(name, "shared-memory region name", 128);
}

absl::Status TritonRegions::RegisterSystem(const std::string& owner, std::optional<uid_t> uid,
                                           const std::string& name, const std::string& key,
                                           uint64_t offset, uint64_t bytes) {
  PSWITCH_RETURN_IF_ERROR(CheckRegionName(name));
  if (!uid) {
    return absl::PermissionDeniedError(
        "system shared memory is mapped only for a caller whose uid pswitchd knows: connect over "
        "loopback without a token, or use a token whose line in the token file names your UID");
  }
  UniqueFd dir(::open(shm_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return ErrnoStatus(absl::StrCat("opening ", shm_dir_));
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd fd, OpenShmSegment(dir.get(), key, *uid));
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<const TransferRegion> region,
                           TransferRegion::FromShmFile(std::move(fd), offset, bytes, owner));
  absl::MutexLock lock(&mu_);
  PSWITCH_RETURN_IF_ERROR(table_->Add(name, region));
  keys_[region->id()] = key;
  return absl::OkStatus();
}

absl::Status TritonRegions::RegisterCuda(const std::string& owner, const std::string& name,
                                         std::string ipc_handle, int device, uint64_t bytes) {
  PSWITCH_RETURN_IF_ERROR(CheckRegionName(name));
  PSWITCH_ASSIGN_OR_RETURN(
      std::shared_ptr<const TransferRegion> region,
      TransferRegion::FromCudaIpc(std::move(ipc_handle), device, bytes, owner));
  absl::MutexLock lock(&mu_);
  return table_->Add(name, std::move(region));
}

absl::StatusOr<std::vector<RegisteredRegion>> TritonRegions::Select(const std::string& owner,
                                                                    RegionKind kind,
                                                                    const std::string& name) const {
  std::vector<RegisteredRegion> regions = table_->List(owner, kind);
  if (name.empty()) return regions;
  for (RegisteredRegion& r : regions) {
    if (r.name == name) return std::vector<RegisteredRegion>{std::move(r)};
  }
  // The table's own answer for a name one does not hold (another kind's included).
  return absl::NotFoundError(absl::StrCat("no ", dataplane::RegionKindName(kind), " region '",
                                          absl::CHexEscape(name.substr(0, 128)), "' of yours"));
}

absl::Status TritonRegions::Unregister(const std::string& owner, RegionKind kind,
                                       const std::string& name) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::vector<RegisteredRegion>> selected = Select(owner, kind, name);
  // Triton answers success for a region that is not registered; so do we.
  if (absl::IsNotFound(selected.status())) return absl::OkStatus();
  PSWITCH_ASSIGN_OR_RETURN(std::vector<RegisteredRegion> regions, std::move(selected));
  // Removing by id: a region registered under the same name meanwhile is not this one. Tasks
  // holding a removed region keep it until they end.
  std::vector<uint64_t> ids;
  for (const RegisteredRegion& r : regions) {
    ids.push_back(r.region->id());
    keys_.erase(r.region->id());
  }
  table_->RemoveIds(owner, ids);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SystemRegionStatus>> TritonRegions::SystemStatus(
    const std::string& owner, const std::string& name) const {
  PSWITCH_ASSIGN_OR_RETURN(std::vector<RegisteredRegion> regions,
                           Select(owner, RegionKind::kShmFile, name));
  std::vector<SystemRegionStatus> out;
  absl::MutexLock lock(&mu_);
  for (const RegisteredRegion& r : regions) {
    auto key = keys_.find(r.region->id());
    out.push_back(SystemRegionStatus{r.name, key == keys_.end() ? std::string() : key->second,
                                     r.region->file_offset(), r.region->bytes()});
  }
  return out;
}

absl::StatusOr<std::vector<CudaRegionStatus>> TritonRegions::CudaStatus(
    const std::string& owner, const std::string& name) const {
  PSWITCH_ASSIGN_OR_RETURN(std::vector<RegisteredRegion> regions,
                           Select(owner, RegionKind::kCudaIpc, name));
  std::vector<CudaRegionStatus> out;
  for (const RegisteredRegion& r : regions) {
    out.push_back(CudaRegionStatus{r.name, r.region->device(), r.region->bytes()});
  }
  return out;
}

}  // namespace pswitch::frontend
