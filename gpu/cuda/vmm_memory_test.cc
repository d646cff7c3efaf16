// VmmMemory against a fake driver that enforces the VMM API's documented rules (no GPU needed):
// an allocation maps only whole and from offset 0 (what the H200 taught us, CUDA_ERROR_NOT_
// SUPPORTED otherwise), cuMemSetAccess needs its range fully mapped, cuMemUnmap takes whole
// mappings only, a mapping goes only where nothing is mapped. The GPU tests
// (cuda_device_test.cc, CudaVmmTest) check the same behaviour on a real driver.
#include "gpu/cuda/vmm_memory.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pswitch::gpu::cuda {
namespace {

constexpr uint64_t kG = 2 << 20;

struct Mapping {
  uint64_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
  int flags = 0;  // CU_MEM_ACCESS_FLAGS_*; 0 until set
};

struct FakeDriver {
  bool read_only_ok = true;
  CUmemGenericAllocationHandle next_handle = 0;
  int next_alloc = 0;
  std::map<CUmemGenericAllocationHandle, int> alloc_of;  // live handles
  std::map<int, uint64_t> alloc_bytes;
  std::map<ino_t, int> exported;
  CUdeviceptr next_va = 1ull << 40;
  std::map<CUdeviceptr, uint64_t> reservations;
  std::map<CUdeviceptr, Mapping> mappings;
  int imports = 0, set_access_calls = 0;

  // Mappings covering [ptr, ptr + bytes) back to back, or empty when any byte is unmapped.
  std::vector<CUdeviceptr> Covering(CUdeviceptr ptr, uint64_t bytes) const {
    std::vector<CUdeviceptr> out;
    CUdeviceptr at = ptr;
    while (at < ptr + bytes) {
      auto it = mappings.find(at);
      if (it == mappings.end()) return {};
      out.push_back(at);
      at += it->second.bytes;
    }
    return at == ptr + bytes ? out : std::vector<CUdeviceptr>{};
  }
  // The access flags at `va`, -1 where nothing is mapped.
  int FlagsAt(CUdeviceptr va) const {
    auto it = mappings.upper_bound(va);
    if (it == mappings.begin()) return -1;
    --it;
    return va < it->first + it->second.bytes ? it->second.flags : -1;
  }
};

FakeDriver* fake = nullptr;

CUresult Create(CUmemGenericAllocationHandle* h, size_t bytes, const CUmemAllocationProp* prop,
                unsigned long long) {  // NOLINT(runtime/int)
  if (bytes == 0 || bytes % kG != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *h = ++fake->next_handle;
  fake->alloc_of[*h] = ++fake->next_alloc;
  fake->alloc_bytes[fake->next_alloc] = bytes;
  return CUDA_SUCCESS;
}
CUresult Release(CUmemGenericAllocationHandle h) {
  return fake->alloc_of.erase(h) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult Export(void* out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType,
                unsigned long long) {  // NOLINT(runtime/int)
  if (!fake->alloc_of.contains(h)) return CUDA_ERROR_INVALID_VALUE;
  const int fd = ::memfd_create("chunk", MFD_CLOEXEC);
  struct stat st;
  ::fstat(fd, &st);
  fake->exported[st.st_ino] = fake->alloc_of[h];
  *static_cast<int*>(out) = fd;
  return CUDA_SUCCESS;
}
CUresult Import(CUmemGenericAllocationHandle* h, void* os_handle, CUmemAllocationHandleType) {
  struct stat st;
  if (::fstat(static_cast<int>(reinterpret_cast<uintptr_t>(os_handle)), &st) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto it = fake->exported.find(st.st_ino);
  if (it == fake->exported.end()) return CUDA_ERROR_INVALID_VALUE;
  *h = ++fake->next_handle;
  fake->alloc_of[*h] = it->second;
  ++fake->imports;
  return CUDA_SUCCESS;
}
CUresult Reserve(CUdeviceptr* ptr, size_t bytes, size_t alignment, CUdeviceptr,
                 unsigned long long) {  // NOLINT(runtime/int)
  if (bytes % kG != 0 || alignment % kG != 0) return CUDA_ERROR_INVALID_VALUE;
  *ptr = fake->next_va;
  fake->reservations[*ptr] = bytes;
  fake->next_va += bytes + (1ull << 30);
  return CUDA_SUCCESS;
}
CUresult Free(CUdeviceptr ptr, size_t bytes) {
  auto it = fake->reservations.find(ptr);
  if (it == fake->reservations.end() || it->second != bytes) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& [va, m] : fake->mappings) {
    if (va >= ptr && va < ptr + bytes) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  }
  fake->reservations.erase(it);
  return CUDA_SUCCESS;
}
CUresult Map(CUdeviceptr ptr, size_t bytes, size_t offset, CUmemGenericAllocationHandle h,
             unsigned long long) {  // NOLINT(runtime/int)
  auto alloc = fake->alloc_of.find(h);
  if (alloc == fake->alloc_of.end()) return CUDA_ERROR_INVALID_VALUE;
  if (offset != 0 || bytes != fake->alloc_bytes[alloc->second]) return CUDA_ERROR_NOT_SUPPORTED;
  bool reserved = false;
  for (const auto& [va, size] : fake->reservations) {
    reserved |= ptr >= va && ptr + bytes <= va + size;
  }
  if (!reserved) return CUDA_ERROR_INVALID_VALUE;
  for (CUdeviceptr at = ptr; at < ptr + bytes; at += kG) {
    if (fake->FlagsAt(at) != -1) return CUDA_ERROR_INVALID_VALUE;  // already mapped
  }
  fake->mappings[ptr] = Mapping{bytes, h, 0};
  return CUDA_SUCCESS;
}
CUresult Unmap(CUdeviceptr ptr, size_t bytes) {
  std::vector<CUdeviceptr> whole = fake->Covering(ptr, bytes);
  if (whole.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (CUdeviceptr va : whole) fake->mappings.erase(va);
  return CUDA_SUCCESS;
}
CUresult SetAccess(CUdeviceptr ptr, size_t bytes, const CUmemAccessDesc* desc, size_t count) {
  ++fake->set_access_calls;
  if (count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READ && !fake->read_only_ok) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  std::vector<CUdeviceptr> whole = fake->Covering(ptr, bytes);
  if (whole.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (CUdeviceptr va : whole) fake->mappings[va].flags = desc->flags;
  return CUDA_SUCCESS;
}
CUresult Granularity(size_t* out, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *out = kG;
  return CUDA_SUCCESS;
}

const VmmApi kFakeApi = {Create, Release, Export, Import,    Reserve,
                         Free,   Map,     Unmap,  SetAccess, Granularity};

class VmmMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override { fake = &driver_; }
  void TearDown() override { fake = nullptr; }
  // What the importer's device may do at chunk `c` (+ `within`): -1 unmapped, else the flags.
  int At(const VmmMemory& m, uint64_t c, uint64_t within = 0) const {
    return driver_.FlagsAt(reinterpret_cast<CUdeviceptr>(m.base()) + c * kG + within);
  }
  FakeDriver driver_;
};

TEST_F(VmmMemoryTest, TheOwnerMapsEveryChunkWholeAndReadWriteAndLeavesNothingBehind) {
  {
    auto owner = VmmMemory::Create(0, 5 * kG - 1, &kFakeApi);
    ASSERT_TRUE(owner.ok()) << owner.status();
    EXPECT_EQ((*owner)->chunk_count(), 5u);
    EXPECT_EQ(driver_.alloc_of.size(), 5u) << "one allocation per chunk";
    for (uint64_t c = 0; c < 5; ++c) EXPECT_EQ(At(**owner, c), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    EXPECT_EQ(driver_.set_access_calls, 1) << "one call for the whole range";
    auto fds = (*owner)->ExportChunks(1, 2);
    ASSERT_TRUE(fds.ok()) << fds.status();
    EXPECT_EQ(fds->size(), 2u);
    EXPECT_EQ((*owner)->ExportChunks(4, 2).status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ((*owner)->SetAccess(0, kG, Arena::Access::kRead).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(driver_.alloc_of.empty());
  EXPECT_TRUE(driver_.mappings.empty());
  EXPECT_TRUE(driver_.reservations.empty());
}

TEST_F(VmmMemoryTest, AnImporterMapsOnlyTheChunksItIsGrantedAndFetchesEachOnce) {
  auto owner = VmmMemory::Create(0, 8 * kG, &kFakeApi);
  ASSERT_TRUE(owner.ok()) << owner.status();
  std::vector<std::pair<uint64_t, uint64_t>> asked;
  auto source = [&](uint64_t first, uint64_t count) {
    asked.emplace_back(first, count);
    return (*owner)->ExportChunks(first, count);
  };
  {
    auto view = VmmMemory::Import(0, 8 * kG, kG, &kFakeApi, source);
    ASSERT_TRUE(view.ok()) << view.status();
    VmmMemory& m = **view;
    for (uint64_t c = 0; c < 8; ++c) EXPECT_EQ(At(m, c), -1) << "nothing mapped at import";
    ASSERT_TRUE(m.ProbeReadOnly().ok());
    EXPECT_TRUE(m.read_only_supported());
    EXPECT_EQ(At(m, 0), -1) << "the probe leaves nothing mapped";
    // A grant widens to whole chunks and no further.
    ASSERT_TRUE(m.SetAccess(5 * kG + 100, 10, Arena::Access::kRead).ok());
    EXPECT_EQ(At(m, 5), CU_MEM_ACCESS_FLAGS_PROT_READ);
    EXPECT_EQ(At(m, 5, kG - 1), CU_MEM_ACCESS_FLAGS_PROT_READ);
    EXPECT_EQ(At(m, 4, kG - 1), -1);
    EXPECT_EQ(At(m, 6), -1);
    // Three chunks around it, read-write: the two it lacks are fetched, in one request.
    asked.clear();
    const int calls = driver_.set_access_calls;
    ASSERT_TRUE(m.SetAccess(4 * kG, 3 * kG, Arena::Access::kReadWrite).ok());
    EXPECT_EQ(asked, (std::vector<std::pair<uint64_t, uint64_t>>{{4, 3}}));
    EXPECT_EQ(driver_.set_access_calls, calls + 1) << "one call for the granted range";
    for (uint64_t c : {4, 5, 6}) EXPECT_EQ(At(m, c), CU_MEM_ACCESS_FLAGS_PROT_READWRITE) << c;
    // Taking the middle back leaves both ends as they were.
    ASSERT_TRUE(m.SetAccess(5 * kG, kG, Arena::Access::kNone).ok());
    EXPECT_EQ(At(m, 4), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    EXPECT_EQ(At(m, 5), -1);
    EXPECT_EQ(At(m, 6), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    // A chunk seen before is mapped again from its handle, with nothing fetched.
    asked.clear();
    const int imports = driver_.imports;
    ASSERT_TRUE(m.SetAccess(5 * kG, kG, Arena::Access::kRead).ok());
    EXPECT_TRUE(asked.empty());
    EXPECT_EQ(driver_.imports, imports);
    EXPECT_EQ(At(m, 5), CU_MEM_ACCESS_FLAGS_PROT_READ);
    EXPECT_EQ(m.SetAccess(8 * kG - 10, 20, Arena::Access::kRead).code(),
              absl::StatusCode::kOutOfRange);
  }
  // The importer's handles and mappings went with it; the owner's stay.
  EXPECT_EQ(driver_.alloc_of.size(), 8u);
  EXPECT_EQ(driver_.mappings.size(), 8u);
}

TEST_F(VmmMemoryTest, WhereTheDriverRefusesReadOnlyAReadGrantMapsReadWrite) {
  driver_.read_only_ok = false;
  auto owner = VmmMemory::Create(0, 4 * kG, &kFakeApi);
  ASSERT_TRUE(owner.ok()) << owner.status();
  auto view = VmmMemory::Import(0, 4 * kG, kG, &kFakeApi, [&](uint64_t first, uint64_t count) {
    return (*owner)->ExportChunks(first, count);
  });
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE((*view)->ProbeReadOnly().ok());
  EXPECT_FALSE((*view)->read_only_supported());
  ASSERT_TRUE((*view)->SetAccess(2 * kG, kG, Arena::Access::kRead).ok());
  EXPECT_EQ(At(**view, 2), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

// A large grant fetches its chunks a batch at a time, each imported before the next is asked
// for, so an importer never holds more than a batch of fds.
TEST_F(VmmMemoryTest, ALargeGrantFetchesItsChunksABatchAtATime) {
  auto owner = VmmMemory::Create(0, 200 * kG, &kFakeApi);
  ASSERT_TRUE(owner.ok()) << owner.status();
  std::vector<std::pair<uint64_t, uint64_t>> asked;
  std::vector<int> imports_before;
  auto view = VmmMemory::Import(0, 200 * kG, kG, &kFakeApi, [&](uint64_t first, uint64_t count) {
    asked.emplace_back(first, count);
    imports_before.push_back(driver_.imports);
    return (*owner)->ExportChunks(first, count);
  });
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE((*view)->SetAccess(10 * kG, 100 * kG, Arena::Access::kReadWrite).ok());
  EXPECT_EQ(asked, (std::vector<std::pair<uint64_t, uint64_t>>{
                       {10, kMaxArenaChunksPerFetch},
                       {10 + kMaxArenaChunksPerFetch, 100 - kMaxArenaChunksPerFetch}}));
  EXPECT_EQ(imports_before[1], imports_before[0] + static_cast<int>(kMaxArenaChunksPerFetch))
      << "the first batch was imported before the second was asked for";
  EXPECT_EQ(At(**view, 109), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(At(**view, 110), -1);
}

// A grant the driver refuses leaves nothing of it mapped: the chunks it mapped go again.
TEST_F(VmmMemoryTest, AGrantTheDriverRefusesLeavesNothingMapped) {
  auto owner = VmmMemory::Create(0, 8 * kG, &kFakeApi);
  ASSERT_TRUE(owner.ok()) << owner.status();
  auto view = VmmMemory::Import(0, 8 * kG, kG, &kFakeApi, [&](uint64_t first, uint64_t count) {
    return (*owner)->ExportChunks(first, count);
  });
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE((*view)->SetAccess(3 * kG, kG, Arena::Access::kReadWrite).ok());
  driver_.read_only_ok = false;  // after any probe: the read grant itself is refused
  EXPECT_FALSE((*view)->SetAccess(2 * kG, 3 * kG, Arena::Access::kRead).ok());
  EXPECT_EQ(At(**view, 2), -1);
  EXPECT_EQ(At(**view, 4), -1);
  EXPECT_EQ(At(**view, 3), CU_MEM_ACCESS_FLAGS_PROT_READWRITE) << "mapped before: kept";
}

TEST_F(VmmMemoryTest, AGrantWhoseChunksCannotBeFetchedMapsNothing) {
  auto view = VmmMemory::Import(0, 4 * kG, kG, &kFakeApi, [](uint64_t, uint64_t) {
    return absl::StatusOr<std::vector<UniqueFd>>(absl::UnavailableError("memdaemon gone"));
  });
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ((*view)->SetAccess(kG, kG, Arena::Access::kRead).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(driver_.mappings.empty());
  EXPECT_EQ(
      VmmMemory::Import(0, 4 * kG, kG / 2, &kFakeApi,
                        [](uint64_t, uint64_t) {
                          return absl::StatusOr<std::vector<UniqueFd>>(std::vector<UniqueFd>{});
                        })
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument)
      << "chunks smaller than the device's mapping unit";
}

}  // namespace
}  // namespace pswitch::gpu::cuda
