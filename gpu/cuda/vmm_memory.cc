#include "gpu/cuda/vmm_memory.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gpu/cuda/cuda_check.h"

namespace pswitch::gpu::cuda {
namespace {

CUmemAllocationProp Prop(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Chunks of `chunk_bytes` covering `bytes`; 0 for an empty or overflowing size.
uint64_t ChunksFor(uint64_t bytes, uint64_t chunk_bytes) {
  if (bytes == 0 || chunk_bytes == 0 || bytes > UINT64_MAX - chunk_bytes) return 0;
  return (bytes + chunk_bytes - 1) / chunk_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<VmmMemory>> VmmMemory::Create(int device, uint64_t bytes,
                                                             const VmmApi* api) {
  const CUmemAllocationProp prop = Prop(device);
  size_t granularity = 0;
  PSWITCH_RETURN_IF_ERROR(
      PSWITCH_CU(api->granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
  const uint64_t count = ChunksFor(bytes, granularity);
  if (count == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("VMM arena of ", bytes, " bytes in chunks of ", granularity));
  }
  std::unique_ptr<VmmMemory> memory(
      new VmmMemory(device, api, granularity, count, /*owner=*/true, nullptr));
  PSWITCH_RETURN_IF_ERROR(memory->Reserve());
  absl::MutexLock lock(&memory->mu_);
  for (uint64_t c = 0; c < count; ++c) {
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CU(api->create(&memory->handles_[c], granularity, &prop, 0)));
    PSWITCH_RETURN_IF_ERROR(memory->MapChunk(c));
  }
  PSWITCH_RETURN_IF_ERROR(memory->Protect(0, count, Arena::Access::kReadWrite));
  return memory;
}

absl::StatusOr<std::unique_ptr<VmmMemory>> VmmMemory::Import(int device, uint64_t bytes,
                                                             uint64_t chunk_bytes,
                                                             const VmmApi* api,
                                                             ArenaChunkSource chunks) {
  if (!chunks) return absl::InvalidArgumentError("a VMM arena import needs its chunks' source");
  const CUmemAllocationProp prop = Prop(device);
  size_t granularity = 0;
  PSWITCH_RETURN_IF_ERROR(
      PSWITCH_CU(api->granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
  const uint64_t count = ChunksFor(bytes, chunk_bytes);
  if (count == 0 || chunk_bytes % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat("VMM arena of ", bytes, " bytes in chunks of ",
                                                   chunk_bytes, " (this device maps ", granularity,
                                                   "-byte units)"));
  }
  std::unique_ptr<VmmMemory> memory(
      new VmmMemory(device, api, chunk_bytes, count, /*owner=*/false, std::move(chunks)));
  PSWITCH_RETURN_IF_ERROR(memory->Reserve());
  return memory;
}

absl::Status VmmMemory::Reserve() {
  return PSWITCH_CU(api_->address_reserve(&base_, chunk_count_ * chunk_bytes_, chunk_bytes_, 0, 0));
}

VmmMemory::~VmmMemory() {
  absl::MutexLock lock(&mu_);
  for (uint64_t c = 0; c < chunk_count_; ++c) {
    if (mapped_[c]) (void)api_->unmap(At(c), chunk_bytes_);
    if (handles_[c] != 0) (void)api_->release(handles_[c]);
  }
  if (base_ != 0) (void)api_->address_free(base_, chunk_count_ * chunk_bytes_);
}

absl::StatusOr<std::vector<UniqueFd>> VmmMemory::ExportChunks(uint64_t first,
                                                              uint64_t count) const {
  if (!owner_) return absl::FailedPreconditionError("only the arena's owner exports its chunks");
  if (first > chunk_count_ || count > chunk_count_ - first) {
    return absl::OutOfRangeError(
        absl::StrCat("chunks [", first, ", +", count, ") of ", chunk_count_));
  }
  absl::MutexLock lock(&mu_);
  std::vector<UniqueFd> fds;
  fds.reserve(count);
  for (uint64_t c = first; c < first + count; ++c) {
    int fd = -1;
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CU(
        api_->export_handle(&fd, handles_[c], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
    fds.emplace_back(fd);
  }
  return fds;
}

absl::Status VmmMemory::ImportChunks(uint64_t first, uint64_t end) {
  uint64_t lo = first;
  while (lo < end && handles_[lo] != 0) ++lo;
  uint64_t hi = end;
  while (hi > lo && handles_[hi - 1] != 0) --hi;
  // The span that lacks handles, a batch at a time, each imported before the next is asked for
  // (a chunk already held keeps its handle; the fetched fd for it just closes).
  for (uint64_t at = lo; at < hi;) {
    const uint64_t count = std::min<uint64_t>(hi - at, kMaxArenaChunksPerFetch);
    PSWITCH_ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, source_(at, count));
    if (fds.size() != count) {
      return absl::InternalError(absl::StrCat("asked for ", count, " chunk fds, got ", fds.size()));
    }
    for (uint64_t c = at; c < at + count; ++c) {
      if (handles_[c] != 0) continue;
      const UniqueFd& fd = fds[c - at];
      if (!fd.valid()) return absl::InternalError(absl::StrCat("no fd for chunk ", c));
      // The driver takes the descriptor's value in the pointer; the handle keeps the memory.
      PSWITCH_RETURN_IF_ERROR(PSWITCH_CU(api_->import_handle(
          &handles_[c], reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
    }
    at += count;
  }
  return absl::OkStatus();
}

absl::Status VmmMemory::MapChunk(uint64_t chunk) {
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CU(api_->map(At(chunk), chunk_bytes_, 0, handles_[chunk], 0)));
  mapped_[chunk] = true;
  return absl::OkStatus();
}

absl::Status VmmMemory::UnmapChunk(uint64_t chunk) {
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CU(api_->unmap(At(chunk), chunk_bytes_)));
  mapped_[chunk] = false;
  access_[chunk] = Arena::Access::kNone;
  return absl::OkStatus();
}

absl::Status VmmMemory::Protect(uint64_t first, uint64_t end, Arena::Access access) {
  if (!read_only_supported_ && access == Arena::Access::kRead) access = Arena::Access::kReadWrite;
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device_;
  desc.flags = access == Arena::Access::kRead ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                              : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  // One call for the whole range: it spans several allocations, all mapped.
  PSWITCH_RETURN_IF_ERROR(
      PSWITCH_CU(api_->set_access(At(first), (end - first) * chunk_bytes_, &desc, 1)));
  for (uint64_t c = first; c < end; ++c) access_[c] = access;
  return absl::OkStatus();
}

absl::Status VmmMemory::ProbeReadOnly() {
  if (owner_) return absl::FailedPreconditionError("the arena's owner maps it read-write");
  absl::MutexLock lock(&mu_);
  if (mapped_[0]) return absl::FailedPreconditionError("probe read-only access before any grant");
  PSWITCH_RETURN_IF_ERROR(ImportChunks(0, 1));
  PSWITCH_RETURN_IF_ERROR(MapChunk(0));
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device_;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  const CUresult result = api_->set_access(At(0), chunk_bytes_, &desc, 1);
  // Only a refusal of the flag itself means "not supported"; anything else is an error.
  absl::Status probed = absl::OkStatus();
  if (result == CUDA_SUCCESS) {
    read_only_supported_ = true;
  } else if (result == CUDA_ERROR_NOT_SUPPORTED || result == CUDA_ERROR_INVALID_VALUE) {
    read_only_supported_ = false;
  } else {
    probed = PSWITCH_CU(result);
  }
  PSWITCH_RETURN_IF_ERROR(UnmapChunk(0));
  return probed;
}

bool VmmMemory::read_only_supported() const {
  absl::MutexLock lock(&mu_);
  return read_only_supported_;
}

absl::Status VmmMemory::SetAccess(uint64_t offset, uint64_t bytes, Arena::Access access) {
  if (owner_) return absl::FailedPreconditionError("the arena's owner keeps access to all of it");
  const uint64_t total = chunk_count_ * chunk_bytes_;
  if (offset > total || bytes > total - offset) {
    return absl::OutOfRangeError(absl::StrCat("[", offset, ", +", bytes, ") is outside the ", total,
                                              " bytes of the VMM arena"));
  }
  if (bytes == 0) return absl::OkStatus();
  const uint64_t first = offset / chunk_bytes_;
  const uint64_t end = (offset + bytes + chunk_bytes_ - 1) / chunk_bytes_;
  absl::MutexLock lock(&mu_);
  if (access == Arena::Access::kNone) {
    for (uint64_t c = first; c < end; ++c) {
      if (mapped_[c]) PSWITCH_RETURN_IF_ERROR(UnmapChunk(c));
    }
    return absl::OkStatus();
  }
  PSWITCH_RETURN_IF_ERROR(ImportChunks(first, end));
  std::vector<uint64_t> fresh;  // mapped by this call: taken back if the grant fails
  absl::Status granted = absl::OkStatus();
  for (uint64_t c = first; c < end && granted.ok(); ++c) {
    if (mapped_[c]) continue;
    granted = MapChunk(c);
    if (granted.ok()) fresh.push_back(c);
  }
  if (granted.ok()) granted = Protect(first, end, access);
  if (!granted.ok()) {
    for (uint64_t c : fresh) (void)UnmapChunk(c);
  }
  return granted;
}

absl::StatusOr<Arena::Access> DeviceAccessAt(const void* at) {
  using GetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  // Resolved once; a driver without it fails each call alike.
  static const auto* const resolved =
      new absl::StatusOr<GetAttribute>([]() -> absl::StatusOr<GetAttribute> {
        GetAttribute fn = nullptr;
        PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuPointerGetAttribute", &fn));
        return fn;
      }());
  PSWITCH_ASSIGN_OR_RETURN(const GetAttribute get, *resolved);
  unsigned long long flags = 0;  // NOLINT(runtime/int): the driver's type
  const CUresult result =
      get(&flags, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, reinterpret_cast<CUdeviceptr>(at));
  if (result == CUDA_ERROR_INVALID_VALUE) return Arena::Access::kNone;  // nothing mapped there
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CU(result));
  return flags == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE ? Arena::Access::kReadWrite
         : flags == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ    ? Arena::Access::kRead
                                                             : Arena::Access::kNone;
}

}  // namespace pswitch::gpu::cuda
