// The transfer regions a worker has mapped (docs/dataplane.md): pswitchd sends MapRegion with the
// region's memory file before the first Run that names it and UnmapRegion once nothing holds it.
// Run inputs and outputs_to name slices of these regions; every slice is checked against the
// worker's own mapping before any byte is touched, since the Run comes from outside this process.
//
// Per region the map decides how its bytes may be touched:
//   - a file sealed against shrinking (client areas, staging) can never lose a page: it is read
//     and written directly, and on CUDA page-locked once (cudaHostRegister) so host<->device
//     copies with it are asynchronous DMA;
//   - any other file (Triton system shared memory) may be truncated by its owner at any moment:
//     every access to it is a dataplane::GuardedCopy, so a fault fails one task, not the worker;
//   - a CUDA IPC handle (Triton CUDA shared memory) is opened on the device (CUDA backend only).
#ifndef PSWITCH_WORKER_REGION_MAP_H_
#define PSWITCH_WORKER_REGION_MAP_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_fd.h"
#include "proto/host_tensor.h"

namespace pswitch::worker {

// Memory a region lends the device, given back when destroyed (on unmap).
class DeviceAttachment {
 public:
  virtual ~DeviceAttachment() = default;
  // The region's byte 0 as the device addresses it (CUDA IPC: device memory); null when the
  // attachment only page-locks host memory.
  virtual std::byte* device_data() const = 0;
};

// What the worker's backend does for a mapped region. Host: nothing; CUDA: worker/cuda/.
class RegionDevice {
 public:
  virtual ~RegionDevice() = default;
  // Page-locks [base, base + bytes) of a mapping that can never fault, for asynchronous DMA; the
  // attachment unregisters it. Null (and OK) when the backend copies with the CPU anyway.
  // `read_only`: the mapping is not writable.
  virtual absl::StatusOr<std::unique_ptr<DeviceAttachment>> RegisterHostMemory(std::byte* base,
                                                                               uint64_t bytes,
                                                                               bool read_only) = 0;
  // Opens another process's device allocation of `bytes` named by a CUDA IPC handle on CUDA
  // device `device`; the attachment closes it. InvalidArgument on a backend without CUDA.
  virtual absl::StatusOr<std::unique_ptr<DeviceAttachment>> OpenCudaIpc(absl::string_view handle,
                                                                        int device,
                                                                        uint64_t bytes) = 0;
};

// The host backend's RegionDevice: nothing to register, and CUDA IPC handles are refused.
RegionDevice& HostRegionDevice();

// A MapRegion command's content.
struct RegionSpec {
  uint64_t region = 0;
  uint64_t bytes = 0;
  uint64_t file_offset = 0;     // page-aligned
  std::string cuda_ipc_handle;  // set: a CUDA IPC region (no file)
  int device = 0;
};

// A checked slice of a mapped region, borrowed from the map: valid until that region is unmapped
// or re-mapped.
struct RegionBytes {
  uint64_t region = 0;
  std::byte* data = nullptr;  // host address, or (on_device) the device's address
  uint64_t bytes = 0;
  bool on_device = false;   // CUDA IPC: `data` is device memory
  bool may_shrink = false;  // copy with dataplane::GuardedCopy: the file may lose pages
  bool registered = false;  // page-locked for the device: copies with it can be asynchronous
  bool writable = true;     // outputs may be written into it
  std::string what;         // "region 7 (system shared memory)", for messages
};

// Not thread-safe: the worker's main thread maps, unmaps and reads.
class RegionMap {
 public:
  // pswitchd bounds the regions a worker holds too; this is the worker's own bound.
  static constexpr size_t kDefaultMaxRegions = 4096;

  // `device` must outlive the map.
  explicit RegionMap(RegionDevice* device, size_t max_regions = kDefaultMaxRegions);
  ~RegionMap();
  RegionMap(const RegionMap&) = delete;
  RegionMap& operator=(const RegionMap&) = delete;

  // Maps `spec` (MAP_SHARED of [file_offset, file_offset + bytes) of `fd`, or the CUDA IPC
  // handle), replacing an earlier mapping of the same id; `fd` is closed either way. Errors name
  // the region: InvalidArgument for a bad spec or a sealed file smaller than the region,
  // ResourceExhausted past the bound; the old mapping, if any, stays on error.
  absl::Status Map(const RegionSpec& spec, UniqueFd fd);
  // NotFound when `region` is not mapped.
  absl::Status Unmap(uint64_t region);
  // `slice` of its region, checked to lie inside the mapping (overflow-safe). NotFound for an
  // unmapped region (naming why its last MapRegion failed, when one did), OutOfRange for a slice
  // past its end.
  absl::StatusOr<RegionBytes> Slice(const proto::ByteSlice& slice) const;
  size_t size() const { return regions_.size(); }

 private:
  class Mapping;

  absl::Status MapOnce(const RegionSpec& spec, UniqueFd fd);

  RegionDevice* const device_;
  const size_t max_regions_;
  std::map<uint64_t, std::unique_ptr<Mapping>> regions_;
  // Why the last MapRegion of a region that is not mapped failed: a Run naming it says so, not
  // only "not mapped" (the MapRegion itself has no answer of its own). Bounded like regions_.
  std::map<uint64_t, absl::Status> failed_;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_REGION_MAP_H_
