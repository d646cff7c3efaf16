// pswitchd's own view of a staging region (docs/dataplane.md): the HTTP port decodes a request's
// inputs straight into a sealed memfd the worker then maps, and reads the outputs the worker wrote
// there, so a request's tensors are copied once on the way in (the decode) and once on the way
// out (the encode). The port maps the region only while it writes or reads it.
#ifndef PSWITCH_FRONTEND_STAGING_MAPPING_H_
#define PSWITCH_FRONTEND_STAGING_MAPPING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dataplane/transfer_region.h"
#include "proto/host_tensor.h"

namespace pswitch::frontend {

// A mapping of a region's whole file (read-write or read-only), unmapped when destroyed. Not
// thread-safe; the region must outlive it (it holds it).
class StagingMapping {
 public:
  // A new staging region of `bytes` (> 0) owned by `owner`, mapped read-write.
  static absl::StatusOr<std::unique_ptr<StagingMapping>> Create(uint64_t bytes, std::string owner);
  // `region` (a staging region) mapped read-only.
  static absl::StatusOr<std::unique_ptr<StagingMapping>> Read(
      std::shared_ptr<const dataplane::TransferRegion> region);
  ~StagingMapping();
  StagingMapping(const StagingMapping&) = delete;
  StagingMapping& operator=(const StagingMapping&) = delete;

  uint8_t* data() const { return data_; }
  const std::shared_ptr<const dataplane::TransferRegion>& region() const { return region_; }

 private:
  StagingMapping(std::shared_ptr<const dataplane::TransferRegion> region, uint8_t* data)
      : region_(std::move(region)), data_(data) {}
  const std::shared_ptr<const dataplane::TransferRegion> region_;
  uint8_t* const data_;
};

// Makes the outputs that lie in `region` (Place::Region slices of it) inline: their bytes copied
// out of it. Other outputs are left as they are. OutOfRange for a slice outside the region.
absl::Status InlineOutputsFrom(const std::shared_ptr<const dataplane::TransferRegion>& region,
                               std::vector<proto::HostTensor>& outputs);

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_STAGING_MAPPING_H_
