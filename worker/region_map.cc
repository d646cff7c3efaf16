#include "worker/region_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::worker {
namespace {

class NoRegionDevice final : public RegionDevice {
 public:
  absl::StatusOr<std::unique_ptr<DeviceAttachment>> RegisterHostMemory(std::byte*, uint64_t,
                                                                       bool) override {
    return std::unique_ptr<DeviceAttachment>();  // the CPU copies from the mapping itself
  }
  absl::StatusOr<std::unique_ptr<DeviceAttachment>> OpenCudaIpc(absl::string_view, int,
                                                                uint64_t) override {
    return absl::InvalidArgumentError(
        "CUDA shared memory needs a worker on the CUDA backend (this one runs on the host)");
  }
};

}  // namespace

RegionDevice& HostRegionDevice() {
  static NoRegionDevice device;
  return device;
}

// One mapped region. The device attachment goes before the mapping it may page-lock.
class RegionMap::Mapping {
 public:
  Mapping(RegionBytes whole, void* map_base, size_t map_bytes,
          std::unique_ptr<DeviceAttachment> attachment)
      : whole_(std::move(whole)),
        map_base_(map_base),
        map_bytes_(map_bytes),
        attachment_(std::move(attachment)) {}
  ~Mapping() {
    attachment_.reset();
    if (map_base_ != nullptr) ::munmap(map_base_, map_bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  const RegionBytes& whole() const { return whole_; }

 private:
  const RegionBytes whole_;
  void* const map_base_;  // null for CUDA IPC
  const size_t map_bytes_;
  std::unique_ptr<DeviceAttachment> attachment_;
};

RegionMap::RegionMap(RegionDevice* device, size_t max_regions)
    : device_(device), max_regions_(max_regions) {}

RegionMap::~RegionMap() = default;

absl::Status RegionMap::Map(const RegionSpec& spec, UniqueFd fd) {
  absl::Status mapped = MapOnce(spec, std::move(fd));
  if (mapped.ok() || regions_.contains(spec.region)) {
    failed_.erase(spec.region);
  } else if (spec.region != 0) {
    if (failed_.size() >= max_regions_ && !failed_.contains(spec.region)) {
      failed_.erase(failed_.begin());
    }
    failed_[spec.region] = mapped;
  }
  return mapped;
}

absl::Status RegionMap::MapOnce(const RegionSpec& spec, UniqueFd fd) {
  const std::string name = absl::StrCat("region ", spec.region);
  if (spec.region == 0) return absl::InvalidArgumentError("MapRegion of region 0");
  if (spec.bytes == 0) return absl::InvalidArgumentError(absl::StrCat(name, ": 0 bytes"));
  if (!regions_.contains(spec.region) && regions_.size() >= max_regions_) {
    return absl::ResourceExhaustedError(absl::StrCat(name, ": this worker already maps ",
                                                     regions_.size(), " regions (at most ",
                                                     max_regions_, ")"));
  }
  RegionBytes whole;
  whole.region = spec.region;
  whole.bytes = spec.bytes;
  std::unique_ptr<Mapping> mapping;
  if (!spec.cuda_ipc_handle.empty()) {
    fd.Reset();  // a device allocation has no file; a stray fd is closed, not kept
    // The runtime may refuse to open a handle this process already holds: close the old one
    // first (a re-map of an IPC region is not atomic).
    regions_.erase(spec.region);
    whole.what = absl::StrCat(name, " (CUDA shared memory)");
    PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<DeviceAttachment> ipc,
                             device_->OpenCudaIpc(spec.cuda_ipc_handle, spec.device, spec.bytes));
    if (ipc == nullptr || ipc->device_data() == nullptr) {
      return absl::InternalError(absl::StrCat(whole.what, ": opened without a device address"));
    }
    whole.data = ipc->device_data();
    whole.on_device = true;
    mapping = std::make_unique<Mapping>(whole, nullptr, 0, std::move(ipc));
  } else {
    if (!fd.valid()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": MapRegion without its memory file"));
    }
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    if (spec.file_offset % page != 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": file offset ", spec.file_offset,
                                                     " is not a multiple of the page size"));
    }
    // off_t is signed: the end must fit in it too.
    constexpr uint64_t kMaxFileBytes = static_cast<uint64_t>(INT64_MAX);
    if (spec.file_offset > kMaxFileBytes || spec.bytes > kMaxFileBytes - spec.file_offset ||
        spec.bytes > SIZE_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": offset ", spec.file_offset, " + ", spec.bytes, " bytes overflows"));
    }
    // A file that cannot shrink can be touched without a guard; anything else (a regular
    // /dev/shm file has no seals at all) may lose pages under us.
    // Only off hugetlbfs is "cannot shrink" a promise: a hugetlbfs file's pages can
    // be taken away (a hole punched, the pool exhausted) whatever its seals, so it counts as one
    // that may shrink and is touched only under the guard.
    struct statfs fs {};
    const bool shmem = ::fstatfs(fd.get(), &fs) == 0 && fs.f_type != HUGETLBFS_MAGIC;
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    whole.may_shrink = !shmem || seals < 0 || (seals & F_SEAL_SHRINK) == 0;
    whole.what =
        absl::StrCat(name, whole.may_shrink ? " (shared-memory file)" : " (sealed memory file)");
    if (!whole.may_shrink) {
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("fstat of ", whole.what));
      if (static_cast<uint64_t>(st.st_size) < spec.file_offset + spec.bytes) {
        // Sealed smaller than the region: an unguarded access past its end would fault.
        return absl::InvalidArgumentError(
            absl::StrCat(whole.what, " of ", spec.bytes, " bytes at offset ", spec.file_offset,
                         " lies past the end of its file (", st.st_size, " bytes)"));
      }
    }
    const auto map_bytes = static_cast<size_t>(spec.bytes);
    void* base = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                        static_cast<off_t>(spec.file_offset));
    if (base == MAP_FAILED && (errno == EACCES || errno == EPERM)) {
      // A file opened read-only, or sealed against writes: inputs only.
      base = ::mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, fd.get(),
                    static_cast<off_t>(spec.file_offset));
      whole.writable = false;
    }
    if (base == MAP_FAILED) return ErrnoStatus(absl::StrCat("mapping ", whole.what));
    fd.Reset();  // the mapping keeps the file alive
    whole.data = static_cast<std::byte*>(base);
    std::unique_ptr<DeviceAttachment> pinned;
    if (!whole.may_shrink) {
      // Registering a file that can shrink would pin pages its owner may take away.
      absl::StatusOr<std::unique_ptr<DeviceAttachment>> registered =
          device_->RegisterHostMemory(whole.data, spec.bytes, !whole.writable);
      if (!registered.ok()) {
        ::munmap(base, map_bytes);
        return absl::Status(registered.status().code(),
                            absl::StrCat(whole.what, ": ", registered.status().message()));
      }
      pinned = std::move(*registered);
      whole.registered = pinned != nullptr;
    }
    mapping = std::make_unique<Mapping>(whole, base, map_bytes, std::move(pinned));
  }
  // The old mapping of a re-mapped id goes only now, once its replacement stands.
  regions_[spec.region] = std::move(mapping);
  return absl::OkStatus();
}

absl::Status RegionMap::Unmap(uint64_t region) {
  failed_.erase(region);
  if (regions_.erase(region) == 0) {
    return absl::NotFoundError(absl::StrCat("region ", region, " is not mapped"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionBytes> RegionMap::Slice(const proto::ByteSlice& slice) const {
  auto it = regions_.find(slice.region);
  if (it == regions_.end()) {
    if (auto failed = failed_.find(slice.region); failed != failed_.end()) {
      return absl::NotFoundError(
          absl::StrCat("region ", slice.region,
                       " could not be mapped in this worker: ", failed->second.ToString()));
    }
    return absl::NotFoundError(
        absl::StrCat("region ", slice.region, " is not mapped in this worker"));
  }
  const RegionBytes& whole = it->second->whole();
  if (slice.offset > whole.bytes || slice.length > whole.bytes - slice.offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", slice.offset, ", +", slice.length,
                                              ") lie outside ", whole.what, " of ", whole.bytes,
                                              " bytes"));
  }
  RegionBytes part = whole;
  part.data = whole.data + slice.offset;
  part.bytes = slice.length;
  return part;
}

}  // namespace pswitch::worker
