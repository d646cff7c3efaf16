#include "frontend/staging_mapping.h"

#include <sys/mman.h>

#include <cstring>
#include <utility>

#include "base/status.h"

namespace pswitch::frontend {

absl::StatusOr<std::unique_ptr<StagingMapping>> StagingMapping::Create(uint64_t bytes,
                                                                       std::string owner) {
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<const dataplane::TransferRegion> region,
                           dataplane::TransferRegion::NewStaging(bytes, std::move(owner)));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, region->fd(), 0);
  if (p == MAP_FAILED) return ErrnoStatus("mapping a staging region");
  return std::unique_ptr<StagingMapping>(
      new StagingMapping(std::move(region), static_cast<uint8_t*>(p)));
}

absl::StatusOr<std::unique_ptr<StagingMapping>> StagingMapping::Read(
    std::shared_ptr<const dataplane::TransferRegion> region) {
  // Only pswitchd's own sealed staging files: a client's file could shrink under the read.
  if (region->kind() != dataplane::RegionKind::kStaging) {
    return absl::InvalidArgumentError("only staging regions are read by the port");
  }
  void* p = ::mmap(nullptr, region->bytes(), PROT_READ, MAP_SHARED, region->fd(), 0);
  if (p == MAP_FAILED) return ErrnoStatus("mapping a staging region");
  return std::unique_ptr<StagingMapping>(
      new StagingMapping(std::move(region), static_cast<uint8_t*>(p)));
}

StagingMapping::~StagingMapping() { ::munmap(data_, region_->bytes()); }

absl::Status InlineOutputsFrom(const std::shared_ptr<const dataplane::TransferRegion>& region,
                               std::vector<proto::HostTensor>& outputs) {
  std::unique_ptr<StagingMapping> mapping;
  for (proto::HostTensor& t : outputs) {
    if (t.place != proto::Place::Region || t.slice.region != region->id()) continue;
    PSWITCH_RETURN_IF_ERROR(region->CheckSlice(t.slice.offset, t.slice.length));
    if (mapping == nullptr) {
      PSWITCH_ASSIGN_OR_RETURN(mapping, StagingMapping::Read(region));
    }
    const uint8_t* from = mapping->data() + t.slice.offset;
    t.data.assign(from, from + t.slice.length);
    t.place = proto::Place::Inline;
    t.slice = proto::ByteSlice{};
  }
  return absl::OkStatus();
}

}  // namespace pswitch::frontend
